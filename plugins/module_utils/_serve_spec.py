# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Settings + one node's identity -> container spec, ``docker run`` line and config hash.

Private module: may change at any time. Pure functions, no I/O, no Ansible imports.

The whole cluster is validated and rendered for every call, whichever node is asked for: a setting that is
wrong for any node fails the render on every node, so a launch never starts one rank of a cluster that the
other rank cannot join.

Per node, exactly three things differ (as in the recipe): ``VLLM_HOST_IP``, ``--node-rank`` and
``--headless`` (last argument, workers only), plus whatever per-node network identity the nodes carry
(interface, HCAs, GID index). The head's ``--host/--port`` are kept on workers: the recipe's worker command is
"everything below PLUS --headless", vLLM ignores them in headless mode, and a head/worker diff then shows only
the three documented differences.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import (
    DEFAULT_PROFILE,
    RENDER_KEYS,
    TRUST_REMOTE_CODE,
    UNSET_DEFAULTS,
    Profile,
    ProfileError,
    from_data,
)

HASH_LABEL = "dgxspark.vllm.config_hash"
RANK_LABEL = "dgxspark.vllm.rank"
ROLE_LABEL = "dgxspark.vllm.role"
PROFILE_LABEL = "dgxspark.vllm.profile"
API_KEY_ENV = "VLLM_API_KEY"
MAX_GPU_MEMORY_UTILIZATION = 0.85

SETTING_KEYS: tuple[str, ...] = RENDER_KEYS
NODE_KEYS: tuple[str, ...] = ("name", "cx7_ip", "head", "rank", "cx7_iface", "ib_hca", "gid_index")

# Placeholders a profile may use besides the setting keys; they depend on the node being rendered.
IDENTITY_KEYS = frozenset({"host_ip", "node_rank", "nnodes", "master_addr"})
TEMPLATE_KEYS = frozenset(SETTING_KEYS) | IDENTITY_KEYS
# A flag whose value is one of these, unset, is left out instead of failing the render.
OPTIONAL_FLAG_VALUES = frozenset({"kv_cache_memory_bytes", "distributed_timeout_seconds", "pipeline_parallel_size"})
# Settings the code itself uses, whether or not the profile's templates mention them.
_CODE_SETTINGS = frozenset({
    "image", "container_name", "shm_size", "model_path", "master_addr", "tensor_parallel_size",
    "pipeline_parallel_size", "gpus_per_node", "gpu_memory_utilization", "allow_high_gpu_memory_utilization",
    "cx7_subnet", "extra_env", "remove_env", "extra_args", "remove_args", "port", "master_port",
    "log_max_size", "log_max_file",
})
# Short or abbreviated spellings vLLM accepts, rendered under their full name.
FLAG_ALIASES: Mapping[str, str] = {
    "--kv-cache-memory": "--kv-cache-memory-bytes",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
}
HEADLESS = "--headless"

_REMEDY: Mapping[str, str] = {
    "host_ip": "nodes[].cx7_ip",
    "node_rank": "nodes[].rank (or the order of nodes)",
    "nnodes": "the nodes list",
    "master_addr": "settings.master_addr (default: the head's cx7_ip)",
    "cx7_iface": "nodes[].cx7_iface or settings.cx7_iface",
    "ib_hca": "nodes[].ib_hca or settings.ib_hca",
    "gid_index": "nodes[].gid_index or settings.gid_index",
}
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHM_SIZE = re.compile(r"^[1-9][0-9]*[bkmgBKMG]?$")
_LOG_SIZE = re.compile(r"^[1-9][0-9]*[kmg]$")
_IFACE = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]{1,15}$")
_HCA = re.compile(r"^[\^=]?[A-Za-z0-9_.-]+(:[0-9]+)?$")
_NEGATIVE_NUMBER = re.compile(r"^-\.?[0-9]")


class SpecError(ValueError):
    """A setting, node or profile that cannot be rendered; the message names the option and the fix.

    ``problems`` lists every problem found (a validation checks every setting before it raises); ``key`` names
    the setting of a single problem, when there is one.
    """

    def __init__(self, message: str, problems: list[str] | None = None, key: str | None = None,
                 keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]
        self.key = key
        # the setting each problem is about (parallel to problems), where known
        self.keys = keys if keys is not None else [key] * len(self.problems)


def _default_name(key: str) -> str:
    return f"settings.{key}"


@dataclass(frozen=True)
class Node:
    """One cluster member as the inventory describes it, with its rank resolved."""

    name: str
    cx7_ip: str
    head: bool
    rank: int
    cx7_iface: str | None = None
    ib_hca: str | None = None
    gid_index: int | None = None

    @property
    def role(self) -> str:
        return "head" if self.head else "worker"


@dataclass(frozen=True)
class RenderedSpec:
    """What the module returns for one node."""

    container: dict[str, Any]
    command_line: str
    config_hash: str
    rank: int
    role: str
    headless: bool
    warnings: tuple[str, ...] = ()

    def as_result(self) -> dict[str, Any]:
        """The module's result. The API key's value never leaves: the container's env lacks it and
        ``secret_env`` names it, for the caller to add from its own no_log variable when it starts the container
        (a value masked by no_log would otherwise reach the container as the mask)."""
        env = dict(self.container["env"])
        secret_env = [name for name in (API_KEY_ENV,) if env.pop(name, None) is not None]
        return {
            "container": dict(self.container, env=env),
            "secret_env": secret_env,
            "command_line": self.command_line,
            "config_hash": self.config_hash,
            "rank": self.rank,
            "role": self.role,
            "headless": self.headless,
        }


# --------------------------------------------------------------------------- scalar checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(where: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        value = int(value)
    if not _is_int(value):
        raise SpecError(f"{where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(f"{where} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SpecError(f"{where} must be <= {maximum}, got {value}")
    return value


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{where} must be true or false, got {value!r}")
    return value


def _str(where: str, value: Any, allow_space: bool = False) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where} must be a non-empty string, got {value!r}")
    if not allow_space and re.search(r"\s", value):
        raise SpecError(f"{where} must not contain whitespace, got {value!r}")
    return value


def _ip(where: str, value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    text = _str(where, value)
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise SpecError(f"{where} must be an IP address (e.g. 192.168.100.11), got {value!r}") from None


def _abs_path(where: str, value: Any) -> str:
    text = _str(where, value)
    if not text.startswith("/"):
        raise SpecError(f"{where} must be an absolute path (starting with /), got {value!r}")
    if ":" in text:
        raise SpecError(f"{where} must not contain ':' (it is used in a docker volume spec), got {value!r}")
    return text


def _json_object(where: str, value: Any) -> str:
    if isinstance(value, Mapping):
        return json.dumps(dict(value), separators=(",", ":"))
    if not isinstance(value, str):
        raise SpecError(f"{where} must be a JSON object as a string, got {value!r}")
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise SpecError(f"{where} is not valid JSON ({exc}): {value!r}; quote it as a JSON object, "
                        'e.g. \'{"enable_thinking": false}\'') from None
    if not isinstance(parsed, dict):
        raise SpecError(f"{where} must be a JSON object ({{...}}), got {value!r}")
    return value


def _str_list(where: str, value: Any) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SpecError(f"{where} must be a list of strings, got {value!r}")
    return [_str(f"{where}[{index}]", item, allow_space=True) for index, item in enumerate(value)]


def _iface(where: str, value: Any) -> str:
    text = _str(where, value)
    if not _IFACE.match(text):
        raise SpecError(f"{where} must be a network interface name (at most 15 characters), got {value!r}")
    return text


def _hca_list(where: str, value: Any) -> str:
    text = _str(where, value)
    if not all(_HCA.match(item) for item in text.split(",")):
        raise SpecError(f"{where} must be comma-separated HCA names without spaces "
                        f"(e.g. rocep1s0f1,roceP2p1s0f1), got {value!r}")
    return text


# --------------------------------------------------------------------------- settings


def profile_from_data(data: Any) -> Profile:
    """A resolved profile (`_profiles.as_data`'s form, as the config step publishes it), or a SpecError."""
    try:
        return from_data(data, TEMPLATE_KEYS)
    except ProfileError as exc:
        raise SpecError(str(exc), problems=exc.problems) from None


def profile_defaults(profile: Profile) -> dict[str, Any]:
    """The profile's value of every render setting (the render's own default where the profile sets none)."""
    return {key: profile.settings.get(key, UNSET_DEFAULTS.get(key)) for key in SETTING_KEYS}


def resolve_settings(profile: Profile, overrides: Mapping[str, Any] | None,
                     name: Any = _default_name) -> tuple[dict[str, Any], set[str]]:
    """Profile defaults with the user's overrides (None = keep the default), validated and normalised.

    Returns the settings and the keys the user set explicitly. ``name`` maps a setting key to what the user
    calls it (the option, or the inventory variable), for messages.
    """
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise SpecError(f"settings must be a dict, got {type(overrides).__name__}")
    unknown = sorted(str(key) for key in overrides if key not in SETTING_KEYS)
    if unknown:
        raise SpecError(f"settings has unknown key(s): {', '.join(unknown)}; "
                        f"known keys: {', '.join(sorted(SETTING_KEYS))}")
    given = {key for key, value in overrides.items() if value is not None}
    defaults = profile_defaults(profile)
    merged = {key: (overrides[key] if key in given else defaults[key]) for key in SETTING_KEYS}
    return _validate_settings(merged, name), given


def _shm(where: str, value: Any) -> str:
    shm = _str(where, value)
    if not _SHM_SIZE.match(shm):
        raise SpecError(f"{where} must be a size like 32g or 1g, got {shm!r}")
    return shm


def _log_size(where: str, value: Any) -> str:
    size = _str(where, value)
    if not _LOG_SIZE.match(size):
        raise SpecError(f"{where} must be a size with its unit, k, m or g (Docker's json-file max-size), "
                        f"e.g. 100m, got {value!r}")
    return size


def _container_name(where: str, value: Any) -> str:
    text = _str(where, value)
    if not _CONTAINER_NAME.match(text):
        raise SpecError(f"{where} {text!r} is not a valid container name "
                        "(letters, digits, _ . -, starting with a letter or digit)")
    return text


def _remove_args(where: str, value: Any) -> list[str]:
    flags = [_canonical_flag(flag) for flag in _str_list(where, value or [])]
    for index, flag in enumerate(flags):
        if not flag.startswith("-") or re.search(r"[\s=]", flag):
            raise SpecError(f"{where}[{index}] must be a flag name such as --max-num-seqs, got {flag!r}")
    return flags


def _validate_settings(raw: dict[str, Any], name: Any = _default_name) -> dict[str, Any]:
    """Every setting checked (all problems collected, then one SpecError), then the checks across settings."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    keys: list[str] = []
    for key, (check, optional) in _SETTING_CHECKS.items():
        if raw[key] is None and (optional or key in ("extra_env", "remove_env", "extra_args", "remove_args")):
            out[key] = None if optional else check(name(key), raw[key])
            continue
        try:
            out[key] = check(name(key), raw[key])
        except SpecError as exc:
            problems.append(str(exc))
            keys.append(key)
    if "allow_high_gpu_memory_utilization" in out:
        try:
            out["gpu_memory_utilization"] = _gpu_memory_utilization(
                raw["gpu_memory_utilization"], out["allow_high_gpu_memory_utilization"], name)
        except SpecError as exc:
            problems.append(str(exc))
            keys.append("gpu_memory_utilization")
    if "port" in out and "master_port" in out and out["port"] == out["master_port"]:
        problems.append(f"{name('port')} and {name('master_port')} are both {out['port']}: "
                        "the API and the rendezvous need different ports (e.g. 8000 and 29521)")
        keys.append("port")
    if problems:
        raise SpecError("; ".join(problems), problems=problems, key=keys[0] if len(keys) == 1 else None, keys=keys)
    return out


def _gpu_memory_utilization(value: Any, allow_high: bool, name: Any = _default_name) -> float:
    where = name("gpu_memory_utilization")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise SpecError(f"{where} must be a number in (0, 1], got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where} must be a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise SpecError(f"{where} must be in (0, 1], got {value}")
    if value > MAX_GPU_MEMORY_UTILIZATION and not allow_high:
        raise SpecError(f"{where} is {value}, above {MAX_GPU_MEMORY_UTILIZATION}: on DGX Spark 0.87 has crashed "
                        f"heads. Use {MAX_GPU_MEMORY_UTILIZATION} or less, or set "
                        f"{name('allow_high_gpu_memory_utilization')}: true to accept the risk")
    return value


def _kv_bytes(where: str, value: Any) -> int:
    if isinstance(value, str) and not re.fullmatch(r"[0-9]+", value.strip()):
        raise SpecError(f"{where} must be a plain positive integer byte count (no k/M/GiB suffix), got {value!r}")
    return _int(where, value, 1)


def _subnet(where: str, value: Any) -> str:
    text = _str(where, value)
    if "/" not in text:
        raise SpecError(f"{where} must be a CIDR network such as 192.168.100.0/24, got {value!r}")
    try:
        return str(ipaddress.ip_network(text, strict=True))
    except ValueError as exc:
        hint = ""
        try:
            hint = f" (did you mean {ipaddress.ip_network(text, strict=False)}?)"
        except ValueError:
            pass
        raise SpecError(f"{where} must be a CIDR network such as 192.168.100.0/24, got {value!r}: {exc}{hint}") from None


def _extra_env(value: Any, where: str = "settings.extra_env") -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where} must be a dict of NAME: value, got {value!r}")
    out: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"{where} key {name!r} is not a valid environment variable name")
        if name == API_KEY_ENV:
            raise SpecError(f"{where} must not set {API_KEY_ENV}: use the api_key option "
                            "(dgxspark_vllm_api_key, no_log)")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise SpecError(f"{where}.{name} must be a string (quote booleans), got {item!r}")
        out[name] = str(item)
    return out


# key -> (check(where, value), optional: None stays None)
_SETTING_CHECKS: dict[str, tuple[Any, bool]] = {
    "image": (_str, False),
    "container_name": (_container_name, False),
    "model_path": (_abs_path, False),
    "cache_path": (_abs_path, False),
    "served_model_name": (_str, False),
    "host": (lambda where, value: str(_ip(where, value)), False),
    "port": (lambda where, value: _int(where, value, 1, 65535), False),
    "master_port": (lambda where, value: _int(where, value, 1, 65535), False),
    "master_addr": (lambda where, value: str(_ip(where, value)), True),
    "tensor_parallel_size": (lambda where, value: _int(where, value, 1), True),
    "pipeline_parallel_size": (lambda where, value: _int(where, value, 1), False),
    "gpus_per_node": (lambda where, value: _int(where, value, 1), False),
    "allow_high_gpu_memory_utilization": (_bool, False),
    "max_model_len": (lambda where, value: _int(where, value, 1), False),
    "kv_cache_memory_bytes": (_kv_bytes, True),
    "cx7_subnet": (_subnet, True),
    "cx7_iface": (_iface, True),
    "ib_hca": (_hca_list, True),
    "gid_index": (lambda where, value: _int(where, value, 0), False),
    "shm_size": (_shm, False),
    "speculative_config": (_json_object, True),
    "default_chat_template_kwargs": (_json_object, True),
    "distributed_timeout_seconds": (lambda where, value: _int(where, value, 1), True),
    "log_max_size": (_log_size, False),
    "log_max_file": (lambda where, value: _int(where, value, 1, 100), False),
    "extra_env": (lambda where, value: _extra_env(value or {}, where), False),
    "remove_env": (lambda where, value: _str_list(where, value or []), False),
    "extra_args": (lambda where, value: _str_list(where, value or []), False),
    "remove_args": (_remove_args, False),
}


# --------------------------------------------------------------------------- nodes


def parse_nodes(raw: Any, node_field: Any = None) -> list[Node]:
    """Validate the cluster list and resolve ranks: the head is 0, the others 1..N-1 in list order.

    ``node_field(node name, field)`` names a node's field in messages (default: ``nodes[i] (name).field``).
    """
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or not raw:
        raise SpecError("nodes must be a non-empty list of {name, cx7_ip, head, ...} dicts")
    entries: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        where = f"nodes[{index}]"
        if not isinstance(item, Mapping):
            raise SpecError(f"{where} must be a dict with at least name and cx7_ip, got {item!r}")
        unknown = sorted(str(key) for key in item if key not in NODE_KEYS)
        if unknown:
            raise SpecError(f"{where} has unknown key(s): {', '.join(unknown)}; known keys: {', '.join(NODE_KEYS)}")
        name = _str(f"{where}.name", item.get("name"))
        where = f"nodes[{index}] ({name})"

        def field(key: str, node_name: str = name, prefix: str = where) -> str:
            return node_field(node_name, key) if node_field is not None else f"{prefix}.{key}"

        entries.append({
            "name": name,
            "cx7_ip": str(_ip(field("cx7_ip"), item.get("cx7_ip"))),
            "head": _bool(field("head"), item.get("head") if item.get("head") is not None else False),
            "rank": None if item.get("rank") is None else _int(field("rank"), item.get("rank"), 0),
            "cx7_iface": None if item.get("cx7_iface") is None else _iface(field("cx7_iface"), item["cx7_iface"]),
            "ib_hca": None if item.get("ib_hca") is None else _hca_list(field("ib_hca"), item["ib_hca"]),
            "gid_index": None if item.get("gid_index") is None else _int(field("gid_index"), item["gid_index"], 0),
        })
    _check_unique(entries, "name", "node names must be unique")
    _check_unique(entries, "cx7_ip", "each node needs its own cx7_ip")
    heads = [entry["name"] for entry in entries if entry["head"]]
    if not heads:
        raise SpecError("no node has head: true; mark exactly one node in nodes as the head (rank 0)")
    if len(heads) > 1:
        raise SpecError(f"{len(heads)} nodes have head: true ({', '.join(heads)}); mark exactly one node as the head")
    _assign_ranks(entries)
    return [Node(**entry) for entry in entries]


def _check_unique(entries: list[dict[str, Any]], key: str, why: str) -> None:
    seen: set[Any] = set()
    for entry in entries:
        if entry[key] in seen:
            raise SpecError(f"nodes has a duplicate {key} {entry[key]!r}: {why}")
        seen.add(entry[key])


def _assign_ranks(entries: list[dict[str, Any]]) -> None:
    given = [entry for entry in entries if entry["rank"] is not None]
    if not given:
        others = iter(range(1, len(entries)))
        for entry in entries:
            entry["rank"] = 0 if entry["head"] else next(others)
        return
    if len(given) != len(entries):
        missing = ", ".join(entry["name"] for entry in entries if entry["rank"] is None)
        raise SpecError(f"some nodes give a rank and some do not (no rank: {missing}); "
                        "give every node a rank (0..N-1) or none (the head is 0, the rest follow list order)")
    ranks = [entry["rank"] for entry in entries]
    duplicates = sorted({rank for rank in ranks if ranks.count(rank) > 1})
    if duplicates:
        raise SpecError(f"nodes[].rank has duplicates {duplicates}: each node needs its own rank 0..{len(entries) - 1}")
    if sorted(ranks) != list(range(len(entries))):
        raise SpecError(f"nodes[].rank must be exactly 0..{len(entries) - 1} (contiguous), got {sorted(ranks)}")
    head = next(entry for entry in entries if entry["head"])
    if head["rank"] != 0:
        raise SpecError(f"the head {head['name']} has rank {head['rank']}: the head must be rank 0")


def _check_cluster(settings: dict[str, Any], nodes: list[Node], name: Any = _default_name) -> None:
    head = next(node for node in nodes if node.head)
    problems: list[str] = []
    if settings["master_addr"] is not None and ipaddress.ip_address(settings["master_addr"]) != \
            ipaddress.ip_address(head.cx7_ip):
        problems.append(f"{name('master_addr')} {settings['master_addr']} is not the head's cx7_ip "
                        f"({head.name}: {head.cx7_ip}); leave it unset or make it the head's cx7_ip")
    if settings["cx7_subnet"] is not None:
        subnet = ipaddress.ip_network(settings["cx7_subnet"])
        for node in nodes:
            address = ipaddress.ip_address(node.cx7_ip)
            if address.version != subnet.version or address not in subnet:
                problems.append(f"the cx7_ip of {node.name}, {node.cx7_ip}, is outside {name('cx7_subnet')} "
                                f"{subnet}: fix the node's cx7_ip or the subnet")
    total = len(nodes) * settings["gpus_per_node"]
    pipeline = settings["pipeline_parallel_size"]
    if settings["tensor_parallel_size"] is None:
        if total % pipeline:
            problems.append(f"{name('pipeline_parallel_size')} {pipeline} does not divide the {total} GPUs "
                            f"({len(nodes)} nodes x gpus_per_node {settings['gpus_per_node']})")
        else:
            settings["tensor_parallel_size"] = total // pipeline
    elif settings["tensor_parallel_size"] * pipeline != total:
        problems.append(f"{name('tensor_parallel_size')} x pipeline_parallel_size = "
                        f"{settings['tensor_parallel_size']} x {pipeline} must equal nodes x gpus_per_node = "
                        f"{len(nodes)} x {settings['gpus_per_node']} = {total}; fix one of them "
                        f"(e.g. {name('tensor_parallel_size')}: {total // pipeline}, or leave it unset to derive it)")
    if problems:
        raise SpecError("; ".join(problems), problems=problems)


# --------------------------------------------------------------------------- templates


def template_fields(template: str) -> list[str]:
    """The placeholder names a profile template uses."""
    return [field for _literal, field, _spec, _conv in string.Formatter().parse(template) if field is not None]


def _text(value: Any) -> str:
    return str(value)


def _fill(template: str, values: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(rendered, None) or (None, the first unset field)."""
    parts: list[str] = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        parts.append(literal)
        if field is None:
            continue
        if field not in values:
            raise SpecError(f"profile template {template!r} uses unknown placeholder {field!r} (a bug in the profile)")
        if values[field] is None:
            return None, field
        parts.append(_text(values[field]))
    return "".join(parts), None


def _missing(field: str, what: str, node: Node, profile: Profile, remover: str) -> SpecError:
    remedy = _REMEDY.get(field, f"settings.{field}")
    return SpecError(f"profile {profile.name} needs {field} for {what} on node {node.name}: set {remedy} "
                     f"(or drop {what} with {remover})")


def _values(settings: dict[str, Any], nodes: list[Node], node: Node) -> dict[str, Any]:
    head = next(item for item in nodes if item.head)
    values = {key: settings[key] for key in SETTING_KEYS}
    values.update({
        "host_ip": node.cx7_ip,
        "node_rank": node.rank,
        "nnodes": len(nodes),
        "master_addr": settings["master_addr"] or head.cx7_ip,
        "cx7_iface": node.cx7_iface or settings["cx7_iface"],
        "ib_hca": node.ib_hca or settings["ib_hca"],
        "gid_index": node.gid_index if node.gid_index is not None else settings["gid_index"],
        "pipeline_parallel_size": None if settings["pipeline_parallel_size"] == 1 else settings["pipeline_parallel_size"],
    })
    return values


def _bound(profile: Profile) -> tuple[dict[str, str], dict[str, str]]:
    """Env names and flags whose value the profile takes from a placeholder: name -> first placeholder."""
    env = {name: fields[0] for name, template in profile.env if (fields := template_fields(template))}
    args = {flag: fields[0] for flag, template in profile.args
            if template is not None and (fields := template_fields(template))}
    return env, args


# --------------------------------------------------------------------------- args


def _canonical_flag(token: str) -> str:
    name, sep, value = token.partition("=")
    return FLAG_ALIASES.get(name, name) + sep + value


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


def _flag_name(token: str) -> str:
    return token.partition("=")[0]


def parse_args(tokens: Sequence[str], where: str = "settings.extra_args") -> list[tuple[str, list[str]]]:
    """Group argument tokens as (flag name, tokens including the flag itself)."""
    groups: list[tuple[str, list[str]]] = []
    for index, token in enumerate(tokens):
        if _is_flag(token):
            if re.search(r"\s", _flag_name(token)):
                raise SpecError(f"{where}[{index}] {token!r} contains a space: give each token separately, "
                                'e.g. ["--max-num-seqs", "8"]')
            token = _canonical_flag(token)
            if any(name == _flag_name(token) for name, _tokens in groups):
                raise SpecError(f"{where} gives {_flag_name(token)} twice")
            groups.append((_flag_name(token), [token]))
        elif not groups:
            raise SpecError(f"{where} must start with a flag (--something), got {token!r}")
        else:
            groups[-1][1].append(token)
    return groups


def _render_args(profile: Profile, settings: dict[str, Any], values: Mapping[str, Any], node: Node,
                 warnings: list[str]) -> list[str]:
    _bound_env, bound_args = _bound(profile)
    remove = set(settings["remove_args"])
    extra = parse_args(settings["extra_args"])
    for flag in sorted(remove):
        if flag == HEADLESS or bound_args.get(flag) in IDENTITY_KEYS:
            raise SpecError(f"settings.remove_args must not remove {flag}: it carries the node's place in the "
                            "cluster (set through nodes)")
    for flag, _tokens in extra:
        if flag == HEADLESS:
            raise SpecError("settings.extra_args must not contain --headless: it is added on every worker (non-head "
                            "node) and must never be on the head")
        if flag == TRUST_REMOTE_CODE:
            raise SpecError(f"settings.extra_args must not contain {TRUST_REMOTE_CODE}: it lets the checkpoint's own "
                            "Python run as root in the container, so only a profile that says why its model needs it "
                            "renders it (a profile that extends this one with trust_remote_code: true)")
        if flag in bound_args:
            field = bound_args[flag]
            raise SpecError(f"settings.extra_args must not contain {flag}: set {_REMEDY.get(field, 'settings.' + field)} "
                            "instead (it is validated)")
        if flag in remove:
            raise SpecError(f"{flag} is in both settings.extra_args and settings.remove_args: keep one")

    groups: list[tuple[str, list[str]]] = []
    present = {flag for flag, _template in profile.args}
    for flag in sorted(remove - present):
        warnings.append(f"settings.remove_args: {flag} is not rendered by profile {profile.name}; nothing removed")
    for flag, template in profile.args:
        if flag in remove:
            continue
        if template is None:
            groups.append((flag, [flag]))
            continue
        text, missing = _fill(template, values)
        if text is None and missing in OPTIONAL_FLAG_VALUES:
            continue
        if text is None:
            raise _missing(str(missing), flag, node, profile, "settings.remove_args")
        groups.append((flag, [flag, text]))
    if profile.trust_remote_code:
        groups.append((TRUST_REMOTE_CODE, [TRUST_REMOTE_CODE]))
    for flag, tokens in extra:
        for index, (name, _old) in enumerate(groups):
            if name == flag:
                groups[index] = (flag, tokens)
                break
        else:
            groups.append((flag, tokens))
    args = [token for _flag, tokens in groups for token in tokens]
    if not node.head:
        args.append(HEADLESS)
    return args


# --------------------------------------------------------------------------- env


def _render_env(profile: Profile, settings: dict[str, Any], values: Mapping[str, Any], node: Node,
                args: Sequence[str], api_key: str | None, warnings: list[str]) -> dict[str, str]:
    bound_env, _bound_args = _bound(profile)
    remove = set(settings["remove_env"])
    for name in sorted(remove):
        if bound_env.get(name) in IDENTITY_KEYS:
            raise SpecError(f"settings.remove_env must not remove {name}: it carries the node's identity "
                            f"({_REMEDY[bound_env[name]]})")
    for name in settings["extra_env"]:
        if name in bound_env:
            field = bound_env[name]
            raise SpecError(f"settings.extra_env must not set {name}: set {_REMEDY.get(field, 'settings.' + field)} "
                            f"instead (it can differ per node and is validated)")
    present = {name for name, _template in profile.env}
    for name in sorted(remove - present):
        warnings.append(f"settings.remove_env: {name} is not set by profile {profile.name}; nothing removed")
    env: dict[str, str] = {}
    for name, template in profile.env:
        if name in remove:
            continue
        text, missing = _fill(template, values)
        if text is None and name in profile.optional_env:
            continue
        if text is None:
            raise _missing(str(missing), name, node, profile, "settings.remove_env")
        env[name] = text
    env.update(settings["extra_env"])
    if api_key is not None and node.head:
        env[API_KEY_ENV] = api_key   # only the head serves the API: a worker's rank has no use for the key
    return env


# --------------------------------------------------------------------------- container, line, hash


def device_requests(gpus: str | None) -> list[dict[str, Any]]:
    """community.docker's form of ``--gpus all``."""
    if gpus is None:
        return []
    if gpus != "all":
        raise SpecError(f"profile gpus {gpus!r} is not supported (only 'all')")
    return [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]


def config_hash(container: Mapping[str, Any]) -> str:
    """sha256 (first 16 hex) of everything that must force a restart: the container spec minus labels.

    The API key enters only as its own sha256.
    """
    spec = {key: value for key, value in container.items() if key != "labels"}
    env = dict(spec.get("env") or {})
    if API_KEY_ENV in env:
        env[API_KEY_ENV] = "sha256:" + hashlib.sha256(("dgxspark.vllm:" + env[API_KEY_ENV]).encode()).hexdigest()
    spec["env"] = env
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def docker_run_argv(container: Mapping[str, Any]) -> list[str]:
    """The recipe-ordered ``docker run`` argv for a container spec; the API key is passed by name only."""
    argv = ["docker", "run"]
    for request in container.get("device_requests") or []:
        if request.get("count") == -1:
            argv += ["--gpus", "all"]
    argv += ["-d", "--name", container["name"], "--restart", container["restart_policy"]]
    if container.get("log_driver"):
        argv += ["--log-driver", container["log_driver"]]
        for name, value in (container.get("log_options") or {}).items():
            argv += ["--log-opt", f"{name}={value}"]
    argv += ["--network", container["network_mode"], "--ipc", container["ipc_mode"],
             "--shm-size", container["shm_size"]]
    for ulimit in container["ulimits"]:
        name, _sep, limits = ulimit.partition(":")
        argv += ["--ulimit", f"{name}={limits}"]
    for capability in container["capabilities"]:
        argv += ["--cap-add", capability]
    for device in container["devices"]:
        argv += ["--device", device]
    for volume in container["volumes"]:
        argv += ["-v", volume]
    for name, value in container["env"].items():
        argv += ["-e", name if name == API_KEY_ENV else f"{name}={value}"]
    argv.append(container["image"])
    argv += container["command"]
    return argv


def _render_node(profile: Profile, settings: dict[str, Any], nodes: list[Node], node: Node,
                 api_key: str | None, warnings: list[str], pending_identity: bool = False) -> RenderedSpec:
    values = _values(settings, nodes, node)
    if pending_identity:
        for key in ("cx7_iface", "ib_hca", "gid_index"):
            if values[key] is None:
                values[key] = f"<{key} detected on {node.name}>"
    args = _render_args(profile, settings, values, node, warnings)
    env = _render_env(profile, settings, values, node, args, api_key, warnings)
    volumes = []
    for template in profile.volumes:
        text, missing = _fill(template, values)
        if text is None:
            raise _missing(str(missing), f"volume {template}", node, profile, "another profile")
        volumes.append(text)
    container: dict[str, Any] = {
        "name": settings["container_name"],
        "image": settings["image"],
        "command": [settings["model_path"]] + args,
        "env": env,
        "volumes": volumes,
        "devices": list(profile.devices),
        "ulimits": list(profile.ulimits),
        "capabilities": list(profile.capabilities),
        "ipc_mode": profile.ipc_mode,
        "network_mode": profile.network_mode,
        "shm_size": settings["shm_size"],
        "restart_policy": "no",
        # weeks of serving in one JSON log would fill the disk: Docker rotates it (the launch reads its logs early)
        "log_driver": "json-file",
        "log_options": {"max-size": settings["log_max_size"], "max-file": str(settings["log_max_file"])},
        "device_requests": device_requests(profile.gpus),
    }
    digest = config_hash(container)
    container["labels"] = {
        HASH_LABEL: digest,
        RANK_LABEL: str(node.rank),
        ROLE_LABEL: node.role,
        PROFILE_LABEL: profile.name,
    }
    return RenderedSpec(
        container=container,
        command_line=shlex.join(docker_run_argv(container)),
        config_hash=digest,
        rank=node.rank,
        role=node.role,
        headless=not node.head,
        warnings=tuple(dict.fromkeys(warnings)),
    )


def _unused_settings(profile: Profile, given: set[str], name: Any = _default_name) -> list[str]:
    used = set(_CODE_SETTINGS)
    for _name, template in profile.env:
        used.update(template_fields(template))
    for _flag, template in profile.args:
        used.update(template_fields(template or ""))
    for template in profile.volumes:
        used.update(template_fields(template))
    return [f"{name(key)} is ignored: profile {profile.name} does not use it" for key in sorted(given - used)]


def render_cluster(profile: Profile, nodes: Any, settings: Mapping[str, Any] | None = None,
                   api_key: str | None = None, name: Any = _default_name, node_field: Any = None,
                   pending_identity: bool = False) -> dict[str, RenderedSpec]:
    """Validate the cluster and render every node's container (node name -> spec). Raises SpecError.

    ``name`` and ``node_field`` name settings and node fields in messages (the inventory variable the user sets).
    ``pending_identity``: a node's interface, HCAs and GID index not known yet (detected on the node later)
    render as a visible stand-in instead of failing; the config step checks a cluster before any node is read.
    """
    if profile.launcher != "docker_run":
        raise SpecError(f"profile {profile.name} is started by its {profile.launcher} launcher, not rendered as a "
                        "docker run (use the kit_launch role)")
    resolved, given = resolve_settings(profile, settings, name)
    cluster = parse_nodes(nodes, node_field)
    _check_cluster(resolved, cluster, name)
    if api_key is not None and (not isinstance(api_key, str) or not api_key or re.search(r"\s", api_key)):
        raise SpecError("api_key must be a non-empty string without whitespace (or omit it)")
    warnings = _unused_settings(profile, given, name)
    rendered: dict[str, RenderedSpec] = {}
    for item in cluster:   # every node, so a setting wrong for any node fails everywhere
        rendered[item.name] = _render_node(profile, resolved, cluster, item, api_key, list(warnings),
                                           pending_identity)
    return rendered


def render_spec(profile: Profile, nodes: Any, node: str, settings: Mapping[str, Any] | None = None,
                api_key: str | None = None) -> RenderedSpec:
    """Validate the cluster and render the container for ``node``. Raises SpecError."""
    names = [item.get("name") for item in nodes if isinstance(item, Mapping)] if isinstance(nodes, list) else []
    rendered = render_cluster(profile, nodes, settings, api_key)
    if node not in rendered:
        raise SpecError(f"node {node!r} is not in nodes ({', '.join(map(str, names))}); pass one of their names")
    return rendered[node]


# --------------------------------------------------------------------------- task arguments

_NODE_OPTIONS = dict(
    name=dict(type="str", required=True),
    cx7_ip=dict(type="str", required=True),
    head=dict(type="bool", default=False),
    rank=dict(type="int"),
    cx7_iface=dict(type="str"),
    ib_hca=dict(type="str"),
    gid_index=dict(type="int"),
)

_SETTINGS_OPTIONS = dict(
    image=dict(type="str"),
    container_name=dict(type="str"),
    model_path=dict(type="str"),
    served_model_name=dict(type="str"),
    host=dict(type="str"),
    port=dict(type="int"),
    master_port=dict(type="int"),
    master_addr=dict(type="str"),
    tensor_parallel_size=dict(type="int"),
    pipeline_parallel_size=dict(type="int"),
    gpus_per_node=dict(type="int"),
    gpu_memory_utilization=dict(type="float"),
    allow_high_gpu_memory_utilization=dict(type="bool"),
    max_model_len=dict(type="int"),
    kv_cache_memory_bytes=dict(type="int"),
    cx7_subnet=dict(type="str"),
    cx7_iface=dict(type="str"),
    ib_hca=dict(type="str"),
    gid_index=dict(type="int"),
    cache_path=dict(type="str"),
    shm_size=dict(type="str"),
    speculative_config=dict(type="raw"),
    default_chat_template_kwargs=dict(type="raw"),
    extra_env=dict(type="dict"),
    remove_env=dict(type="list", elements="str"),
    extra_args=dict(type="list", elements="str"),
    remove_args=dict(type="list", elements="str"),
    distributed_timeout_seconds=dict(type="int"),
    log_max_size=dict(type="str"),
    log_max_file=dict(type="int"),
)

# The vllm_serve_spec task's arguments (the module and its action plugin validate with the same spec).
ARGUMENT_SPEC: dict[str, Any] = dict(
    profile=dict(type="str", default=DEFAULT_PROFILE),
    profile_data=dict(type="dict"),
    nodes=dict(type="list", elements="dict", required=True, options=_NODE_OPTIONS),
    node=dict(type="str", required=True),
    settings=dict(type="dict", default={}, options=_SETTINGS_OPTIONS),
    api_key=dict(type="str", no_log=True),
)
