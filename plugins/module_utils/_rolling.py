# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rolling change: the clusters behind the router changed one at a time, each drained first and put back after.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports.

A run of the collection serves one cluster (``--limit``), so a rolling change is a run per cluster, one after the
other, each a whole ``site.yml`` for that cluster (the upgrade with its automatic rollback to the known-good release
where the change fails or regresses), with the router's own play skipped (the rolling change puts the cluster back
itself). Around each run: the cluster drained in the router on every router host (no new request; its running ones
finish), its engine's running and waiting requests at 0 (its /metrics), and after the run the cluster put back and
seen up (its health check passed) on every router host. The first cluster whose change fails ends the rolling
change: it stays drained, every other cluster serves.

What is decided here: which clusters, in which order; every refusal before a cluster is drained (a model that only
the changed cluster serves, two clusters serving one model name with different settings, a drain timeout shorter
than the longest request, a router host that does not see a cluster up, a run that would ask for a password); the
command line of each cluster's run (the rolling run's inventory, extra variables and vault and connection options,
forwarded as given).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# Settings that place a cluster (its names, addresses, ports, paths, memory split) rather than decide what a client
# gets from a model name: two clusters serving one name may differ in these.
PLACEMENT_KEYS = frozenset({
    "container_name", "model_path", "host", "port", "master_port", "master_addr", "cx7_subnet", "cx7_iface", "ib_hca",
    "gid_index", "cache_path", "shm_size", "gpus_per_node", "gpu_memory_utilization",
    "allow_high_gpu_memory_utilization", "kv_cache_memory_bytes", "distributed_timeout_seconds", "log_max_size",
    "log_max_file", "served_model_name",
})

ARGUMENT_SPEC: dict = {
    "clusters": {"type": "list", "elements": "str", "default": []},
    "allow_downtime": {"type": "bool", "default": False},
    "playbook": {"type": "path", "required": True},
    "log_dir": {"type": "path", "required": True},
    "router_states": {"type": "dict"},
    "head_group": {"type": "str", "default": "spark_head"},
    "workers_group": {"type": "str", "default": "spark_workers"},
    "router_group": {"type": "str", "default": "spark_router"},
}
"""rolling_plan's options: the clusters to change (empty: every cluster, in the inventory's order), whether a model
only the changed cluster serves may be refused for the length of its change, the playbook each cluster's run runs,
where each run's log goes; ``router_states``: per router host, its servers as dgxspark.vllm.router_info returns them
(the second call, once they are read)."""

# The options of ansible-playbook forwarded to each cluster's run, as given to the rolling run (CLIARGS' names).
_REPEATED = (("extra_vars", "--extra-vars"), ("vault_ids", "--vault-id"),
             ("vault_password_files", "--vault-password-file"))
_SINGLE = (("private_key_file", "--private-key"), ("remote_user", "--user"), ("connection", "--connection"),
           ("timeout", "--timeout"), ("ssh_common_args", "--ssh-common-args"), ("ssh_extra_args", "--ssh-extra-args"),
           ("become_method", "--become-method"), ("become_user", "--become-user"), ("forks", "--forks"))
_ASKS = (("ask_pass", "--ask-pass"), ("become_ask_pass", "--ask-become-pass"), ("ask_vault_pass", "--ask-vault-pass"))


class RollingError(ValueError):
    """A rolling change that must not start; ``problems`` lists each with its fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a client gets from a cluster's model name: the profile, the image and every setting but placement."""
    settings = config.get("settings") or {}
    out: dict[str, Any] = {"profile": config.get("profile_name"), "image": config.get("image")}
    out.update({key: value for key, value in settings.items() if key not in PLACEMENT_KEYS and key != "image"})
    return out


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def mixed_settings(clusters: Sequence[Mapping[str, Any]]) -> list[str]:
    """Two clusters serving one model name with different settings (each cluster: name, model, identity)."""
    problems = []
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for cluster in clusters:
        by_model.setdefault(str(cluster["model"]), []).append(cluster)
    for model, serving in by_model.items():
        first = serving[0]
        for other in serving[1:]:
            a, b = first["identity"], other["identity"]
            keys = sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))
            if not keys:
                continue
            shown = "; ".join(f"{key}: {first['name']} {_shown(a.get(key))}, {other['name']} {_shown(b.get(key))}"
                              for key in keys)
            problems.append(f"{first['name']} and {other['name']} both serve {model} with different settings "
                            f"({shown}): the router sends a request for {model} to either, so a client would get "
                            f"different answers from one name; give both clusters the same settings, or serve one under "
                            f"another dgxspark_vllm_served_model_name")
    return problems


def select(clusters: Sequence[Mapping[str, Any]], wanted: Sequence[str]) -> list[Mapping[str, Any]]:
    """The clusters to change, in the order given (empty: every cluster in the inventory's order)."""
    if not wanted:
        return list(clusters)
    by_name = {str(c["name"]): c for c in clusters}
    unknown = [name for name in wanted if name not in by_name]
    repeated = sorted({name for name in wanted if list(wanted).count(name) > 1})
    problems = []
    if unknown:
        problems.append(f"rolling_clusters names {', '.join(unknown)}, which the inventory's clusters "
                        f"({', '.join(by_name)}) do not hold")
    if repeated:
        problems.append(f"rolling_clusters names {', '.join(repeated)} more than once")
    if problems:
        raise RollingError(problems)
    return [by_name[name] for name in wanted]


def alone(clusters: Sequence[Mapping[str, Any]], changed: Sequence[Mapping[str, Any]]) -> list[str]:
    """A changed cluster whose model no other cluster serves: its clients are refused while it is drained."""
    problems = []
    for cluster in changed:
        others = [c["name"] for c in clusters if c["model"] == cluster["model"] and c["name"] != cluster["name"]]
        if not others:
            problems.append(f"{cluster['name']} is the only cluster serving {cluster['model']}: while it is drained "
                            f"and changed the router refuses every request for {cluster['model']}; add a cluster "
                            "serving it, or set rolling_allow_downtime: true to accept the refusals")
    return problems


def cli_problems(cli: Mapping[str, Any]) -> list[str]:
    """Options of the rolling run that its clusters' runs cannot take over."""
    problems = []
    for name, flag in _ASKS:
        if cli.get(name):
            problems.append(f"{flag}: each cluster's run is started without a terminal and cannot ask; give the "
                            "password in a file (--vault-password-file, or the connection's variables)")
    if cli.get("subset"):
        problems.append(f"--limit {cli['subset']}: a rolling change goes over the clusters itself (a run each); name "
                        "the clusters to change with -e '{\"rolling_clusters\": [...]}' instead")
    tags = [tag for tag in cli.get("tags") or () if tag != "all"]
    if tags or cli.get("skip_tags"):
        problems.append("--tags and --skip-tags: a rolling change runs every step of each cluster's run; run the "
                        "steps alone with site.yml --limit <cluster> instead")
    return problems


def run_argv(executable: str, playbook: str, cluster: str, sources: Sequence[str], cli: Mapping[str, Any]) -> list[str]:
    """The command line of one cluster's run: its playbook for that cluster alone, the router's play skipped, the
    rolling run's inventory and options as given."""
    argv = [executable, playbook, "--limit", cluster, "--skip-tags", "router"]
    for source in sources:
        argv += ["--inventory", str(source)]
    for name, flag in _REPEATED:
        for value in cli.get(name) or ():
            argv += [flag, str(value)]
    for name, flag in _SINGLE:
        value = cli.get(name)
        if value not in (None, "", ()):
            argv += [flag, str(value)]
    if cli.get("become"):
        argv.append("--become")
    if cli.get("diff"):
        argv.append("--diff")
    verbosity = int(cli.get("verbosity") or 0)
    if verbosity:
        argv.append("-" + "v" * min(verbosity, 6))
    return argv


def router_problems(states: Mapping[str, Sequence[Mapping[str, Any]]], clusters: Sequence[Mapping[str, Any]],
                    changed: Sequence[Mapping[str, Any]], allow_downtime: bool) -> list[str]:
    """Before the first drain: every router host sees every cluster, and the clusters that keep each changed
    cluster's model served while it is drained are up there."""
    problems = []
    for host, servers in states.items():
        seen = {str(s.get("cluster")): s for s in servers}
        for cluster in clusters:
            server = seen.get(str(cluster["name"]))
            if server is None:
                problems.append(f"the router on {host} has no server for {cluster['name']}: run playbooks/router.yml "
                                "once the cluster serves, then the rolling change")
        if allow_downtime:
            continue
        for cluster in changed:
            others = [c["name"] for c in clusters if c["model"] == cluster["model"] and c["name"] != cluster["name"]]
            up = [name for name in others if seen.get(str(name), {}).get("state") == "up"]
            if others and not up:
                states_of = ", ".join(f"{name} {seen.get(str(name), {}).get('state', 'absent')}" for name in others)
                problems.append(f"draining {cluster['name']} would leave {cluster['model']} without a cluster on the "
                                f"router on {host} ({states_of}): bring them back first (the guard restores a "
                                "cluster; status.yml shows each), or set rolling_allow_downtime: true")
    return problems


def plan(clusters: Sequence[Mapping[str, Any]], routers: Sequence[Mapping[str, Any]], params: Mapping[str, Any],
         cli: Mapping[str, Any], sources: Sequence[str], executable: str) -> dict[str, Any]:
    """The rolling change: each cluster to change with its run's command line, log file and messages, the router
    hosts with their drain settings; or RollingError listing every problem.

    ``clusters``: every cluster of the inventory (name, model, head, api_url, identity); ``routers``: each router
    host (host, socket, map_file, state_file, drain_timeout, request_timeout)."""
    problems: list[str] = []
    if not routers:
        problems.append(f"the inventory has no host in {params.get('router_group', 'spark_router')}: a rolling change "
                        "drains each cluster in the router before changing it; add the router (roles/router README) "
                        "and run playbooks/router.yml, or change each cluster alone with site.yml --limit <cluster>")
    for router in routers:
        drain, longest = router.get("drain_timeout"), router.get("request_timeout")
        if isinstance(drain, int) and isinstance(longest, int) and drain < longest:
            problems.append(f"router_drain_timeout of {router['host']} ({drain} s) is shorter than the longest request "
                            f"the clusters allow through the router (router_request_timeout, {longest} s): a drain "
                            f"would give up while a request may still run; set router_drain_timeout to at least {longest}")
    try:
        changed = select(clusters, params.get("clusters") or [])
    except RollingError as exc:
        problems.extend(exc.problems)
        changed = []
    problems.extend(mixed_settings(clusters))
    if not params.get("allow_downtime"):
        problems.extend(alone(clusters, changed))
    problems.extend(cli_problems(cli))
    if problems:
        raise RollingError(problems)
    drain = max((int(r.get("drain_timeout") or 0) for r in routers), default=0)
    names = [str(c["name"]) for c in changed]
    steps = []
    for index, cluster in enumerate(changed):
        name = str(cluster["name"])
        rest = names[index + 1:]
        serving = [str(c["name"]) for c in clusters if str(c["name"]) != name]
        steps.append({
            "name": name, "model": cluster["model"], "head": cluster["head"], "api_url": cluster["api_url"],
            "argv": run_argv(executable, str(params["playbook"]), name, sources, cli),
            "log": f"{params['log_dir']}/{name}.log",
            "failed": (f"the change of {name} failed; {name} stays drained in the router (put it back with "
                       f"playbooks/router_backend.yml -e cluster={name} -e state=ready once it serves as you want); "
                       f"{', '.join(serving) or 'no other cluster'} serve(s) as before"
                       + (f"; not changed: {', '.join(rest)}" if rest else "")
                       + f". Its run's log: {params['log_dir']}/{name}.log; its last lines:"),
        })
    order = " -> ".join(names)
    summary = [f"a rolling change of {len(names)} cluster(s), one at a time: {order}",
               f"each drained in the router on {', '.join(str(r['host']) for r in routers)} (at most {drain} s), "
               f"changed by {params['playbook']} --limit <cluster>, verified, then put back"]
    return {"steps": steps, "routers": [dict(r) for r in routers], "drain_timeout": drain, "summary": summary,
            "changed_names": names}
