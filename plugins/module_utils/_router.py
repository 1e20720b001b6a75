# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One endpoint over the clusters of an inventory: HAProxy's configuration, its checks and its runtime state.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports.

The router is Debian's HAProxy (README, "One endpoint over several clusters": measured against vLLM's router).
From the resolved configuration of every cluster (each cluster's head, API port and served model name) it makes:

- one backend per served model, whose servers are the clusters serving it (their heads' APIs), each checked with
  ``GET /health`` every ``check_interval`` seconds: ``fall`` failed checks take a cluster out, ``rise`` answered ones
  put it back; a connection that fails is retried on another cluster of the model (``retry-on conn-failure``);
- a frontend that answers only ``allowed_cidrs``, takes only requests carrying the router's own key, sends a request
  to a backend of its body's ``model`` (read only when more than one model is served) with that cluster's key in place
  of the client's, and answers ``GET /v1/models`` itself with every model of every cluster;
- HAProxy's Prometheus exporter on ``metrics_port``, for ``allowed_cidrs`` only;
- the runtime API on a root-only socket: the drain (``set server <backend>/<cluster> state drain``: no new request, the
  running ones finish) and the state ``status.yml`` shows (``show stat``);
- HAProxy's server-state file (``server-state`` in the router's folder), loaded at every start and reload: a drain or
  a maintenance set through the runtime API outlives a reload (a changed configuration), a restart and a reboot. The
  collection writes it from ``show servers state`` after each change of a cluster's state and before each start or
  reload, keeping only the servers the plan still has at the same address and port (HAProxy 2.6 would otherwise take a
  kept server's old port over the configuration's).

The configuration holds every cluster's key: it is root's, mode 0600; HAProxy runs as root without capabilities
(the unit's sandbox) and reads it at every reload.
"""
from __future__ import annotations

import csv
import io
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{8,512}$")
_MODEL = re.compile(r"^[\x21-\x7e]{1,256}$")   # printable, no space: a map key and a JSON string
_HOST = re.compile(r"^[A-Za-z0-9_.:-]{1,253}$")

STATE_FILE_NAME = "server-state"
"""HAProxy's server-state file, in the router's folder (beside models.map)."""

SINGLE_CLUSTER = "spark_cluster"
"""The name of the one cluster of an inventory that names none (its group)."""

CLUSTERS_ARGUMENT_SPEC: dict = {
    "head_group": {"type": "str", "default": "spark_head"},
    "workers_group": {"type": "str", "default": "spark_workers"},
}
"""router_clusters' options: the inventory's groups of heads and workers."""

ARGUMENT_SPEC: dict = {
    "clusters": {"type": "list", "elements": "dict", "required": True},
    "keys": {"type": "dict", "default": {}, "no_log": True},
    "generated": {"type": "list", "elements": "dict", "default": [], "no_log": True},
    "probes": {"type": "dict", "default": {}},
    "stage": {"type": "str", "choices": ["reach", "full"], "default": "full"},
    "router_key": {"type": "str", "default": "", "no_log": True},
    "bind_address": {"type": "str", "default": "0.0.0.0"},
    "port": {"type": "int", "default": 8080},
    "metrics_port": {"type": "int", "default": 8404},
    "allowed_cidrs": {"type": "list", "elements": "str", "default": []},
    "request_timeout": {"type": "int", "default": 600},
    "drain_timeout": {"type": "int", "default": 660},
    "check_interval": {"type": "int", "default": 2},
    "fall": {"type": "int", "default": 2},
    "rise": {"type": "int", "default": 2},
    "buffer_bytes": {"type": "int", "default": 1048576},
    "socket": {"type": "path", "default": "/run/dgxspark-router/admin.sock"},
    "models_file": {"type": "path", "default": "/etc/dgxspark/router/models.json"},
    "host_ports": {"type": "dict", "default": {}},
}
"""router_plan's options: the clusters (router_clusters: each with name, head, address, port, model, max_model_len),
the inventory's keys by cluster name, the generated keys read on the heads (each: cluster, key), what each router host
saw of each cluster's /health (``probes``), the router's own key and the router role's settings; ``host_ports``: per
router host, the API port of the cluster it is a node of, which the router's ports must not take."""


class RouterError(ValueError):
    """Inputs that cannot make a router; ``problems`` lists each with the variable or step that fixes it."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Backend:
    """One cluster behind the router: its name (the inventory's cluster group), its head, the address and port its
    API answers on, the model it serves and the longest context it allows."""

    name: str
    head: str
    address: str
    port: int
    model: str
    max_model_len: int = 0


@dataclass(frozen=True)
class Settings:
    """The router role's settings (router_*)."""

    bind_address: str = "0.0.0.0"
    port: int = 8080
    metrics_port: int = 8404
    allowed_cidrs: tuple[str, ...] = ()
    request_timeout: int = 600
    drain_timeout: int = 660
    check_interval: int = 2
    fall: int = 2
    rise: int = 2
    buffer_bytes: int = 1048576
    socket: str = "/run/dgxspark-router/admin.sock"
    models_file: str = "/etc/dgxspark/router/models.json"
    state_file: str = "/etc/dgxspark/router/" + STATE_FILE_NAME


@dataclass(frozen=True)
class Model:
    """One served model: its backend's name in HAProxy and the clusters serving it, in inventory order."""

    name: str
    backend: str
    clusters: tuple[Backend, ...] = field(default_factory=tuple)


def backends(clusters: Sequence[Mapping[str, object]]) -> list[Backend]:
    """The clusters as the planner gives them (one resolved configuration each, reduced to what the router needs),
    checked; RouterError lists every problem."""
    problems: list[str] = []
    out: list[Backend] = []
    if not clusters:
        raise RouterError(["the inventory holds no cluster to route to: list the clusters' groups in "
                           "dgxspark_vllm_clusters (or keep one cluster in spark_head and spark_workers)"])
    for entry in clusters:
        name = str(entry.get("name") or "")
        where = f"cluster {name or '?'}"
        if not _NAME.match(name):
            problems.append(f"{where}: its name {name!r} is not a group name HAProxy can carry (letters, digits, _.-)")
            continue
        address = str(entry.get("address") or "")
        if not _HOST.match(address):
            problems.append(f"{where}: its head {entry.get('head')!r} has no address the router can reach it on "
                            f"(got {address!r}): set ansible_host for it")
            continue
        port = entry.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(f"{where}: its API port {port!r} is not a port number (dgxspark_vllm_port)")
            continue
        model = str(entry.get("model") or "")
        if not _MODEL.match(model):
            problems.append(f"{where}: its served model name {model!r} cannot be routed (printable, no spaces: "
                            "dgxspark_vllm_served_model_name)")
            continue
        length = entry.get("max_model_len") or 0
        out.append(Backend(name, str(entry.get("head") or ""), address, port, model,
                           int(length) if isinstance(length, int) and not isinstance(length, bool) else 0))
    names = [b.name for b in out]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"the cluster {name} is listed twice: name each cluster once in dgxspark_vllm_clusters")
    if problems:
        raise RouterError(problems)
    return out


def models(clusters: Sequence[Backend]) -> list[Model]:
    """One entry per served model, in the order the clusters first serve them."""
    order: dict[str, list[Backend]] = {}
    for backend in clusters:
        order.setdefault(backend.model, []).append(backend)
    return [Model(name, f"model_{index}", tuple(members)) for index, (name, members) in enumerate(order.items())]


def _port(problems: list[str], name: str, value: object, zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (0 if zero else 1) <= value <= 65535:
        problems.append(f"{name} must be a port number (1-65535), got {value!r}")


def check(clusters: Sequence[Backend], keys: Mapping[str, str], router_key: str, settings: Settings,
          host_ports: Mapping[str, int] | None = None, known: Sequence[str] = ()) -> None:
    """Refuse what cannot serve, every problem at once, each naming its fix (RouterError). ``known``: problems found
    before (a key that could not be read), listed first."""
    problems: list[str] = list(known)
    _port(problems, "router_port", settings.port)
    _port(problems, "router_metrics_port", settings.metrics_port)
    if settings.port == settings.metrics_port:
        problems.append(f"router_port and router_metrics_port are both {settings.port}: give each its own port")
    for host, taken in sorted((host_ports or {}).items()):
        for name, value in (("router_port", settings.port), ("router_metrics_port", settings.metrics_port)):
            if taken and value == taken:
                problems.append(f"{name} is {value}, the API port of the cluster {host} serves in: the router on "
                                f"{host} needs another port (e.g. {name}: {value + 80})")
    try:
        ipaddress.ip_address(settings.bind_address)
    except ValueError:
        problems.append(f"router_bind_address must be an IP address (0.0.0.0 for every address), got "
                        f"{settings.bind_address!r}")
    if not settings.allowed_cidrs:
        problems.append("router_allowed_cidrs is empty: the router would answer nobody; list the networks of its "
                        "clients (e.g. [192.168.1.0/24])")
    for cidr in settings.allowed_cidrs:
        try:
            ipaddress.ip_network(str(cidr), strict=False)
        except ValueError:
            problems.append(f"router_allowed_cidrs: {cidr!r} is not an address or a network (e.g. 192.168.1.0/24)")
    for name, value, low in (("router_request_timeout", settings.request_timeout, 1),
                             ("router_drain_timeout", settings.drain_timeout, 1),
                             ("router_check_interval", settings.check_interval, 1),
                             ("router_fall", settings.fall, 1), ("router_rise", settings.rise, 1),
                             ("router_buffer_bytes", settings.buffer_bytes, 16384)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name} must be a whole number of at least {low}, got {value!r}")
    if (isinstance(settings.drain_timeout, int) and isinstance(settings.request_timeout, int)
            and settings.drain_timeout < settings.request_timeout):
        problems.append(f"router_drain_timeout ({settings.drain_timeout} s) is shorter than the longest request the "
                        f"clusters allow through the router (router_request_timeout, {settings.request_timeout} s): "
                        "a drain would give up while a request may still run; set router_drain_timeout to at least "
                        f"{settings.request_timeout}")
    if not _KEY.match(str(router_key or "")):
        problems.append("the router's API key (router_api_key, or the one generated in router_api_key_file) must be "
                        "8 to 512 characters of letters, digits and ._~+/=-")
    unread = {problem.split(":", 1)[0] for problem in known}
    for backend in clusters:
        if f"cluster {backend.name}" in unread:
            continue
        if not _KEY.match(str(keys.get(backend.name) or "")):
            problems.append(f"cluster {backend.name}: no usable API key (its dgxspark_vllm_api_key, or the key "
                            "generated on its head: run site.yml for it first)")
    for model in models(clusters):
        distinct = {keys.get(b.name) for b in model.clusters}
        if len(distinct) > 1:
            problems.append(f"the clusters {', '.join(b.name for b in model.clusters)} all serve {model.name!r} with "
                            "different API keys: the router sends one backend's key to whichever of them answers, so "
                            "give them one key (the same dgxspark_vllm_api_key in their group_vars, from a vault)")
    if problems:
        raise RouterError(problems)


def _acl(cidrs: Sequence[str]) -> str:
    return " ".join(str(ipaddress.ip_network(str(c), strict=False)) for c in cidrs)


def _quoted(text: str) -> str:
    """A string HAProxy reads as one argument (double quotes; the checked inputs hold no quote or backslash)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(clusters: Sequence[Backend], keys: Mapping[str, str], router_key: str, settings: Settings,
           map_file: str) -> str:
    """HAProxy's configuration (haproxy.cfg). Call check() first."""
    served = models(clusters)
    allowed = _acl([*settings.allowed_cidrs, "127.0.0.0/8", "::1"])   # and the router's host itself
    bind = settings.bind_address
    bind_text = f"[{bind}]" if ":" in bind else bind
    unauthorized = json.dumps({"error": "Unauthorized"})
    lines = [
        "# Written by the dgxspark.vllm collection (role router): one endpoint over the clusters of the inventory.",
        "# Root's, mode 0600: it holds every cluster's API key and the router's own.",
        "global",
        "    log stdout format short daemon",
        f"    stats socket {settings.socket} mode 600 level admin",
        "    stats timeout 30s",
        f"    tune.bufsize {settings.buffer_bytes + 16384}",
        f"    server-state-file {settings.state_file}",   # a drain or a maintenance outlives a reload or a restart
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    load-server-state-from-file global",
        "    option httplog",
        "    option dontlognull",
        "    option http-no-delay",   # a streamed token goes out at once (HAProxy merges small chunks by default)
        "    timeout connect 5s",
        "    timeout http-request 30s",
        f"    timeout client {settings.request_timeout}s",
        f"    timeout server {settings.request_timeout}s",
        "    timeout http-keep-alive 60s",
        "    timeout queue 30s",
        "",
        "frontend router",
        f"    bind {bind_text}:{settings.port}",
        f"    tcp-request connection reject unless {{ src {allowed} }}",
        f"    acl key_ok req.hdr(authorization) -m str {_quoted('Bearer ' + router_key)}",
        "    acl api path_beg /v1/",
        f"    http-request return status 401 content-type application/json string {_quoted(unauthorized)} "
        "if api !key_ok",
        "    monitor-uri /health",
        "    http-request return status 404 content-type application/json string "
        + _quoted(json.dumps({"error": "the router serves /v1/ only"})) + " unless api",
        "    http-request del-header authorization",
        f"    http-request return status 200 content-type application/json file {settings.models_file} "
        "if { path /v1/models } METH_GET",
    ]
    if len(served) == 1:
        lines.append(f"    default_backend {served[0].backend}")
    else:
        lines += [
            "    option http-buffer-request",
            "    http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST",
            "    http-request return status 404 content-type application/json string "
            + _quoted(json.dumps({"error": "no cluster behind this router serves that model (or the request's "
                                           "body is larger than router_buffer_bytes, so its model was not read); "
                                           "GET /v1/models lists the models"}))
            + f" unless {{ var(txn.model),map_str({map_file}) -m found }}",
            f"    use_backend %[var(txn.model),map_str({map_file})]",
        ]
    for model in served:
        key = keys[model.clusters[0].name]
        lines += [
            "",
            f"# {model.name}: {', '.join(b.name for b in model.clusters)}",
            f"backend {model.backend}",
            "    balance leastconn",
            "    option httpchk GET /health",
            "    http-check expect status 200",
            "    retry-on conn-failure empty-response",
            "    retries 2",
            "    option redispatch 1",
            f"    default-server inter {settings.check_interval}s fall {settings.fall} rise {settings.rise}",
            f"    http-request set-header Authorization {_quoted('Bearer ' + key)}",
        ]
        for backend in model.clusters:
            address = f"[{backend.address}]" if ":" in backend.address else backend.address
            lines.append(f"    server {backend.name} {address}:{backend.port} check")
    lines += [
        "",
        "frontend metrics",
        f"    bind {bind_text}:{settings.metrics_port}",
        f"    tcp-request connection reject unless {{ src {allowed} }}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    http-request return status 404",
        "",
    ]
    return "\n".join(lines)


def model_map(clusters: Sequence[Backend]) -> str:
    """HAProxy's map from a served model name to its backend (the frontend's use_backend)."""
    return "".join(f"{model.name} {model.backend}\n" for model in models(clusters))


def models_listing(clusters: Sequence[Backend], created: int = 0) -> str:
    """The router's answer to GET /v1/models: every model of every cluster, in OpenAI's format (as vLLM answers it)."""
    data = []
    for model in models(clusters):
        lengths = [b.max_model_len for b in model.clusters if b.max_model_len]
        entry: dict = {"id": model.name, "object": "model", "created": created, "owned_by": "vllm",
                       "clusters": [b.name for b in model.clusters]}
        if lengths:
            entry["max_model_len"] = min(lengths)
        data.append(entry)
    return json.dumps({"object": "list", "data": data}, indent=1) + "\n"


def plan(params: Mapping[str, object]) -> dict:
    """router_plan: the checked backends and every file the router needs; RouterError lists the problems."""
    clusters = backends(list(params.get("clusters") or []))   # type: ignore[call-overload]
    keys = {str(k): str(v) for k, v in dict(params.get("keys") or {}).items()}   # type: ignore[call-overload]
    for cluster, key in generated_keys(list(params.get("generated") or [])).items():   # type: ignore[call-overload]
        keys.setdefault(cluster, key)
    models_file = str(params.get("models_file") or Settings.models_file)
    folder = models_file.rsplit("/", 1)[0]   # the router's folder: the model list, the model map, the server state
    settings = Settings(
        bind_address=str(params.get("bind_address", "0.0.0.0")), port=params.get("port", 8080),   # type: ignore[arg-type]
        metrics_port=params.get("metrics_port", 8404),   # type: ignore[arg-type]
        allowed_cidrs=tuple(str(c) for c in params.get("allowed_cidrs") or ()),   # type: ignore[union-attr]
        request_timeout=params.get("request_timeout", 600), drain_timeout=params.get("drain_timeout", 660),   # type: ignore[arg-type]
        check_interval=params.get("check_interval", 2), fall=params.get("fall", 2),   # type: ignore[arg-type]
        rise=params.get("rise", 2), buffer_bytes=params.get("buffer_bytes", 1048576),   # type: ignore[arg-type]
        socket=str(params.get("socket") or Settings.socket),
        models_file=models_file, state_file=f"{folder}/{STATE_FILE_NAME}")
    router_key = str(params.get("router_key") or "")
    host_ports = {str(k): int(v) for k, v in dict(params.get("host_ports") or {}).items()}   # type: ignore[call-overload]
    check(clusters, keys, router_key, settings, host_ports,
          key_failures(list(params.get("generated") or [])))   # type: ignore[call-overload]
    map_file = f"{folder}/models.map"
    served = models(clusters)
    return {
        "config": render(clusters, keys, router_key, settings, map_file),
        "map": model_map(clusters),
        "map_file": map_file,
        "state_file": settings.state_file,
        "models": models_listing(clusters),
        "backends": [{"cluster": b.name, "head": b.head, "address": b.address, "port": b.port, "model": b.model,
                      "backend": m.backend, "health_url": f"http://{url_host(b.address)}:{b.port}/health"}
                     for m in served for b in m.clusters],
        "drain_timeout": settings.drain_timeout,
        "summary": [f"{b.name} ({b.address}:{b.port}) serves {m.name}" for m in served for b in m.clusters],
    }


def url_host(address: str) -> str:
    """An address as a URL's host (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address else address


# ------------------------------------------------------------------------------------------------ reachability

def generated_keys(results: Sequence[object]) -> dict[str, str]:
    """The keys the api_key module read on the heads, by cluster: its loop's results (each with the cluster as
    ``item`` and the ``key``)."""
    out: dict[str, str] = {}
    for entry in results:
        if not isinstance(entry, Mapping) or entry.get("skipped"):
            continue
        item = entry.get("item")
        name = item.get("name") if isinstance(item, Mapping) else None
        if name and entry.get("key"):
            out[str(name)] = str(entry["key"])
    return out


def key_failures(results: Sequence[object]) -> list[str]:
    """The clusters whose generated key could not be read on their head (the api_key loop's failed or unreachable
    results), with why."""
    out = []
    for entry in results:
        if isinstance(entry, Mapping) and (entry.get("failed") or entry.get("unreachable")):
            item = entry.get("item")
            name = item.get("name") if isinstance(item, Mapping) else "?"
            head = item.get("head") if isinstance(item, Mapping) else "?"
            out.append(f"cluster {name}: its generated API key could not be read on its head {head} "
                       f"({str(entry.get('msg') or 'unreachable').strip()[:300]})")
    return out


def probes(results: Mapping[str, Sequence[object]]) -> list[dict]:
    """What each router host saw of each cluster's /health: per router host, the uri loop's results (each with the
    cluster as ``item``)."""
    out = []
    for router, entries in results.items():
        for entry in entries or []:
            if not isinstance(entry, Mapping):
                continue
            item = entry.get("item")
            status = entry.get("status")
            out.append({"router": str(router), "cluster": str(item.get("name") if isinstance(item, Mapping) else ""),
                        "url": str(entry.get("url") or (item.get("health_url") if isinstance(item, Mapping) else "")),
                        "status": status if isinstance(status, int) and not isinstance(status, bool) else -1,
                        "msg": "" if status == 200 else str(entry.get("msg") or "")})
    return out


def _answer(status: object) -> str:
    return f"HTTP {status}" if isinstance(status, int) and not isinstance(status, bool) and status > 0 else "no answer"


def unreachable(probes: Sequence[Mapping[str, object]]) -> str | None:
    """Why the router cannot start: the clusters whose ``/health`` did not answer 200 from a router host. Each probe:
    router host, cluster, url, status (the HTTP status; -1 or 0 when nothing answered) and msg. None when all did."""
    bad = [p for p in probes if p.get("status") != 200]
    if not bad:
        return None
    lines = [f"{p.get('router')} -> cluster {p.get('cluster')} at {p.get('url')}: {_answer(p.get('status'))}"
             f"{' (' + str(p.get('msg')) + ')' if p.get('msg') else ''}" for p in bad]
    return ("A cluster is not reachable from the router's host, so the router was not started or changed:\n- "
            + "\n- ".join(lines) + "\nFix: serve the cluster (site.yml --limit <cluster>), and apply its firewall with "
            "the router's host in the group spark_router (playbooks/firewall.yml --limit <cluster>), which opens the "
            "cluster's API to the router; check the route from the router's host to the head's address.")


# ------------------------------------------------------------------------------------------------ the runtime API

_STATE = {"UP": "up", "DOWN": "down", "DRAIN": "draining", "MAINT": "maintenance", "NOLB": "draining",
          "no check": "up"}


def server_states(show_stat: str, served: Sequence[Mapping[str, object]] | None = None) -> list[dict]:
    """The clusters behind the router from ``show stat`` (HAProxy's CSV): per server of a model backend, its
    cluster, backend, state (up, down, draining, maintenance, or HAProxy's own word), the requests it is working on
    now and has had, the last check's result. ``served``: the plan's backends, to name each cluster's model."""
    text = show_stat.lstrip("# ")
    rows = list(csv.DictReader(io.StringIO(text)))
    model_of = {str(b.get("backend")): str(b.get("model")) for b in served or ()}
    out = []
    for row in rows:
        backend, server = row.get("pxname", ""), row.get("svname", "")
        if not backend.startswith("model_") or server in ("FRONTEND", "BACKEND", ""):
            continue
        raw = (row.get("status") or "").strip()
        word = raw.split(" ")[0] if raw else ""
        state = _STATE.get(raw) or _STATE.get(word) or raw.lower()
        if raw.startswith("UP ") or raw.startswith("DOWN "):   # going down / coming back: "UP 1/2", "DOWN 1/2"
            state = "up" if word == "UP" else "down"
        out.append({"cluster": server, "backend": backend, "model": model_of.get(backend, ""),
                    "state": state, "status": raw, "current": _int(row.get("scur")),
                    "total": _int(row.get("stot")), "check": (row.get("check_status") or "").strip(),
                    "check_ms": _int(row.get("check_duration")), "last_change_s": _int(row.get("lastchg"))})
    return out


def describe(states: Sequence[Mapping[str, object]]) -> list[str]:
    """One line per cluster and model behind the router, for a person."""
    return [f"{s['cluster']} ({s['model'] or s['backend']}): {s['state']}, {s['current']} running, {s['total']} "
            f"answered, last check {s['check'] or 'none'}" for s in states]


def _int(value: object) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def map_models(map_text: str) -> list[dict]:
    """The plan's backends as far as the model map tells them (model and backend per line), for server_states."""
    out = []
    for line in map_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[0].startswith("#"):
            out.append({"model": parts[0], "backend": parts[1]})
    return out


def find_server(states: Sequence[Mapping[str, object]], cluster: str) -> list[Mapping[str, object]]:
    """The servers of one cluster (one per model backend it serves in)."""
    return [s for s in states if s.get("cluster") == cluster]


def drain_step(states: Sequence[Mapping[str, object]], cluster: str, elapsed: float, timeout: float) -> dict:
    """While a cluster drains: done (no request left on any of its servers), wait, or fail (the timeout passed or
    the cluster is not behind the router), with the diagnosis."""
    mine = find_server(states, cluster)
    if not mine:
        known = sorted({str(s.get("cluster")) for s in states})
        return {"step": "fail", "msg": f"the cluster {cluster} is not behind the router (its clusters: "
                                       f"{', '.join(known) or 'none'})"}
    running = sum(int(str(s.get("current") or 0)) for s in mine)
    if running == 0:
        return {"step": "done", "running": 0, "msg": f"{cluster} drained after {elapsed:.1f} s"}
    if elapsed >= timeout:
        return {"step": "fail", "running": running,
                "msg": f"{cluster} still had {running} running request(s) after router_drain_timeout ({timeout:g} s)"}
    return {"step": "wait", "running": running, "msg": f"{cluster}: {running} running request(s)"}


def state_commands(states: Sequence[Mapping[str, object]], cluster: str, state: str) -> list[str]:
    """The runtime API's commands that put every server of a cluster in ``state`` (ready, drain, maint)."""
    if state not in ("ready", "drain", "maint"):
        raise RouterError([f"state must be ready, drain or maint, got {state!r}"])
    return [f"set server {s['backend']}/{s['cluster']} state {state}" for s in find_server(states, cluster)]


def held_and_waiting(states: Sequence[Mapping[str, object]]) -> dict:
    """Where the router's clusters stand for a wait until they are up: ``held`` (drained or in maintenance, as
    router_backend set them: up as far as a wait goes, and named), ``waiting`` (neither up nor held: down, or
    HAProxy's own word) and ``settled`` (there are servers and none waits)."""
    held = [s for s in states if s.get("state") in ("draining", "maintenance")]
    waiting = [s for s in states if s.get("state") != "up" and s not in held]
    return {"settled": bool(states) and not waiting,
            "held": [f"{s['cluster']} ({s.get('model') or s.get('backend')}): {s['state']}, as router_backend set it "
                     "(kept across reloads; state=ready puts it back)" for s in held],
            "waiting": describe(waiting)}


_STATE_VERSION = "1"
# the columns a rewrite of the file compares: what it keeps (the others, such as the time since the last change or the
# health, move at each read)
_STATE_COMPARED = ("srv_addr", "srv_port", "srv_admin_state", "srv_uweight", "srv_iweight")
_OP_RUNNING = "2"   # srv_op_state SRV_ST_RUNNING: the server starts up, as HAProxy starts it without the file
# HAProxy's srv_admin_state bits (include/haproxy/server-t.h, enum srv_admin)
_ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20   # forced, inherited, configured, address resolution failed
_ADMIN_DRAIN = 0x08 | 0x10                 # forced, inherited


def _server_state(text: str) -> tuple[list[str], list[str], list[tuple[str, dict[str, str]]]]:
    """HAProxy's ``show servers state`` (or a server-state file): its version and header lines, the header's column
    names, and each server's line with its values by column. An empty text, or the version alone, has no server;
    another format than version 1 raises RouterError."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or [line.strip() for line in lines] == [_STATE_VERSION]:
        return [_STATE_VERSION], [], []
    if lines[0].strip() != _STATE_VERSION or len(lines) < 2 or not lines[1].startswith("#"):
        raise RouterError([f"the router's server state is not in HAProxy's version {_STATE_VERSION} format "
                           f"(first line {lines[0][:40]!r})"])
    columns = lines[1].lstrip("#").split()
    missing = [c for c in ("be_name", "srv_name", "srv_op_state", *_STATE_COMPARED) if c not in columns]
    if missing:
        raise RouterError([f"the router's server state lacks the columns {', '.join(missing)}"])
    servers = []
    for line in lines[2:]:
        if line.startswith("#"):
            continue
        values = line.split()
        if len(values) < len(columns):
            raise RouterError([f"the router's server state has a short line ({len(values)} of {len(columns)} "
                               f"columns): {line[:80]!r}"])
        servers.append((line, dict(zip(columns, values))))
    return lines[:2], columns, servers


def parse_server_state(text: str) -> list[dict[str, str]]:
    """HAProxy's ``show servers state`` (or a server-state file) as one dict per server, by its header's column names.
    An empty text, or the version alone, has no server; another format than version 1 raises RouterError."""
    return [row for _line, row in _server_state(text)[2]]


def server_state_word(row: Mapping[str, str]) -> str:
    """What a line of the server state keeps, for a person: maintenance, draining, or ready."""
    try:
        admin = int(row.get("srv_admin_state", "0"))
    except ValueError:
        admin = 0
    if admin & _ADMIN_MAINT:
        return "maintenance"
    if admin & _ADMIN_DRAIN:
        return "draining"
    return "ready"


def _health_afresh(line: str, columns: Sequence[str]) -> str:
    """A line of the server state with its health as HAProxy starts a server without the file (up; its checks take
    it out when it does not answer): what the file keeps is the drain and the maintenance, not a health that may be
    stale by the time HAProxy reads it (a cluster kept down after a reload would be refused for ``rise`` checks)."""
    values = line.split()
    values[list(columns).index("srv_op_state")] = _OP_RUNNING
    return " ".join(values)


def normalized_server_state(dump: str) -> str:
    """``show servers state`` as the server-state file keeps it: every server, its health afresh (_health_afresh)."""
    header, columns, servers = _server_state(dump)
    return "\n".join([*header, *(_health_afresh(line, columns) for line, _row in servers)]) + "\n"


def kept_server_state(dump: str, planned: Sequence[Mapping[str, object]],
                      addresses: Callable[[str], Collection[str]]) -> dict:
    """The server-state file to write from ``dump`` (``show servers state``, or the file as it is): only the servers
    of ``planned`` (router_plan's backends: backend, cluster, address, port) that HAProxy runs at the same address
    (``addresses`` gives what an address or host name stands for) and port. HAProxy 2.6 takes a kept server's port
    from the file over its configuration's: a line of a moved server would send its requests to the old port.
    Each kept line keeps the server's drain or maintenance and weights, with its health afresh (_health_afresh).
    Returns ``text`` (version, header and the kept lines), ``kept`` and ``dropped`` (one line each, for a person).
    With no server to keep, the text is the version alone, which HAProxy reads without a warning (it warns about a
    missing or empty file)."""
    header, columns, servers = _server_state(dump)
    by_name = {(str(p.get("backend")), str(p.get("cluster"))): p for p in planned}
    kept_lines, kept, dropped = [], [], []
    for line, row in servers:
        name = f"{row['srv_name']} in {row['be_name']}"
        plan = by_name.get((row["be_name"], row["srv_name"]))
        if plan is None:
            dropped.append(f"{name}: no longer behind the router")
            continue
        port, address = str(plan.get("port")), str(plan.get("address"))
        if row["srv_port"] != port or row["srv_addr"] not in set(addresses(address)):
            dropped.append(f"{name}: now at {address}:{port}, not {row['srv_addr']}:{row['srv_port']} (its state "
                           "is not kept)")
            continue
        kept_lines.append(_health_afresh(line, columns))
        kept.append(f"{name}: {server_state_word(row)}")
    return {"text": "\n".join([*header, *kept_lines]) + "\n", "kept": kept, "dropped": dropped}


def same_server_state(old: str, new: str) -> bool:
    """Whether two server-state texts keep the same servers at the same addresses in the same drain or maintenance
    (the columns that move at each read, such as the health or the time since the last change, are not compared).
    A text that cannot be read differs."""
    try:
        old_rows, new_rows = parse_server_state(old), parse_server_state(new)
    except RouterError:
        return False

    def key(rows: list[dict[str, str]]) -> set[tuple[str, ...]]:
        return {(r["be_name"], r["srv_name"], *(r[c] for c in _STATE_COMPARED)) for r in rows}

    return bool(old.strip()) == bool(new.strip()) and key(old_rows) == key(new_rows)
