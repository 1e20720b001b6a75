# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One cluster's configuration resolved from the inventory, in the controller's process: cluster_config's work.

Private: may change at any time. cluster_config resolves the cluster of its play's hosts; router_clusters resolves
every cluster of the inventory the same way, so the router sees each cluster as that cluster's own runs do.
"""
from __future__ import annotations

import os
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import (
    FACT,
    FACT_NAMES,
    PREFIX,
    ConfigError,
    Inputs,
    checked_for_placeholders,
    describe_sources,
    parse_bool,
    resolve,
    select_cluster,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._upgrade import PIN_FACT
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import ControllerTaskError
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import ProfileFileError, builtin_profile_data

# The collection's roles: their public variables (<role>_*) are checked for the example inventory's placeholders.
ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
# The dgxspark_vllm role's only defaults (the secrets, read directly by tasks): not a value a play gives.
SECRET_DEFAULTS = frozenset({"dgxspark_vllm_api_key", "dgxspark_vllm_hf_token"})


def _read(hostvars: Any, host: str, names: list[str], problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = plain(hostvars[host][name])
        except Exception as exc:  # noqa: BLE001 - any templating error is reported with its variable
            problems.append(f"{name} of {host} cannot be templated: {exc}")
    return out


def _checked(hostvars: Any, host: str, roles: list[str]) -> dict[str, Any]:
    """The host's connection and role variables as the inventory gives them (untemplated: a lookup in one is not
    run, a vaulted value not decrypted), for the placeholder check; and its name."""
    try:
        raw = hostvars.raw_get(host)
        names = [name for name in raw if checked_for_placeholders(name, roles)]
    except Exception:  # noqa: BLE001 - no raw view of the host: only the dgxspark_vllm_* variables are checked
        return {"inventory_hostname": host}
    out: dict[str, Any] = {"inventory_hostname": host}
    for name in names:
        try:
            out[name] = plain(raw[name])
        except Exception:  # noqa: BLE001 - a value that cannot be read as data is not a placeholder
            continue
    return out


def declared_clusters(task_vars: dict[str, Any], head_group: str, workers_group: str) -> dict[str, Any]:
    """Each head and worker of the inventory that sets dgxspark_vllm_clusters -> its value."""
    groups = task_vars.get("groups", {})
    hostvars = task_vars["hostvars"]
    name = PREFIX + "clusters"
    problems: list[str] = []
    declared: dict[str, Any] = {}
    for host in dict.fromkeys([*groups.get(head_group, []), *groups.get(workers_group, [])]):
        if name in hostvars[host]:
            declared[host] = _read(hostvars, host, [name], problems).get(name)
    if problems:
        raise ControllerTaskError(f"the inventory's {name} cannot be read: {'; '.join(problems)}")
    return declared


def _cluster_problems(exc: ConfigError) -> ControllerTaskError:
    listed = "\n".join(f"- {problem}" for problem in exc.problems)
    return ControllerTaskError(
        f"the inventory's clusters have {len(exc.problems)} problem(s); nothing was started, pulled or "
        f"downloaded. Fix every one of them:\n{listed}", problems=exc.problems)


def inventory_clusters(task_vars: dict[str, Any], head_group: str, workers_group: str) -> list[tuple[str, list[str]]]:
    """Every cluster of the inventory as (its group's name, or "" for the one cluster of an inventory that names none;
    its hosts), checked as a run of each would check it."""
    groups = task_vars.get("groups", {})
    declared = declared_clusters(task_vars, head_group, workers_group)
    names = next(iter(declared.values()), None) if declared else None
    if not isinstance(names, list) or not names:
        hosts = list(dict.fromkeys([*groups.get(head_group, []), *groups.get(workers_group, [])]))
        candidates = [("", hosts)]
    else:
        candidates = [(str(name), list(groups.get(str(name), []))) for name in names]
    out = []
    for _name, hosts in candidates:
        try:
            cluster = select_cluster(groups, declared, hosts, head_group, workers_group)
        except ConfigError as exc:
            raise _cluster_problems(exc) from exc
        out.append((cluster.name, list(dict.fromkeys(cluster.head + cluster.workers))))
    return out


def resolve_cluster(templar: Any, task_vars: dict[str, Any], head_group: str, workers_group: str,
                    play_hosts: list[str]) -> dict[str, Any]:
    """The cluster of ``play_hosts`` resolved and checked: the result cluster_config returns (the fact, the sources,
    the warnings), or ControllerTaskError listing every problem."""
    groups = task_vars.get("groups", {})
    hostvars = task_vars["hostvars"]
    problems: list[str] = []
    declared = declared_clusters(task_vars, head_group, workers_group)
    try:
        cluster = select_cluster(groups, declared, play_hosts, head_group, workers_group)
    except ConfigError as exc:
        raise _cluster_problems(exc) from exc
    head, workers = cluster.head, cluster.workers
    read: dict[str, dict[str, Any]] = {}
    for host in dict.fromkeys(head + workers):
        names = [name for name in hostvars[host] if name.startswith(PREFIX)]
        read[host] = _read(hostvars, host, names, problems)
    # What this play gives every host above the inventory (play vars, vars_files, role params, role defaults):
    # the current host's task vars that its hostvars lack or hold another value of. They apply to every host.
    current = task_vars.get("inventory_hostname")
    for name in [name for name in task_vars if name.startswith(PREFIX) and name not in FACT_NAMES]:
        try:
            value = plain(templar.template(task_vars[name]))
        except Exception as exc:  # noqa: BLE001 - any templating error is reported with its variable
            problems.append(f"{name} cannot be templated: {exc}")
            continue
        if current in read and name in read[current] and read[current][name] == value:
            continue
        if current not in read and name in hostvars.get(current, {}):
            continue   # the inventory's value of a host outside the cluster (a router's host): not this play's
        if value == "" and name in SECRET_DEFAULTS:
            continue   # the dgxspark_vllm role's default, below every inventory value
        for host in read:
            read[host][name] = value
    try:
        roles = sorted(name for name in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, name)))
    except OSError:
        roles = []
    checked = {host: _checked(hostvars, host, roles) for host in read}
    extra: dict[str, Any] = {}
    if head:
        wanted = ("ansible_user", "checkpoint_allow_denylisted", "image_digest", PIN_FACT)
        extra = _read(hostvars, head[0], [name for name in wanted if name in hostvars[head[0]]], problems)
    try:
        builtin = builtin_profile_data()
        inputs = Inputs(hostvars=read, head=head, workers=workers, builtin_profiles=builtin, cluster=cluster.name,
                        ansible_user=extra.get("ansible_user"), checked_vars=checked,
                        allow_denylisted=parse_bool(str(extra.get("checkpoint_allow_denylisted", False))) is True,
                        image_digest=str(extra.get("image_digest") or ""),
                        release_pin=extra.get(PIN_FACT) or None)
        if problems:
            raise ConfigError(problems)
        config = resolve(inputs)
    except ProfileFileError as exc:
        raise ControllerTaskError(str(exc)) from exc
    except ConfigError as exc:
        listed = "\n".join(f"- {problem}" for problem in exc.problems)
        raise ControllerTaskError(
            f"the inventory has {len(exc.problems)} problem(s); nothing was started, pulled or downloaded. "
            f"Fix every one of them:\n{listed}", problems=exc.problems) from exc
    result: dict[str, Any] = {"changed": False, "ansible_facts": {FACT: config}, "sources": describe_sources(config)}
    if config["unpinned"]:   # dgxspark_vllm_require_pins: true makes them problems above
        result["warnings"] = list(config["unpinned"])
    return result


def inventory_configs(templar: Any, task_vars: dict[str, Any], head_group: str,
                      workers_group: str) -> list[tuple[str, dict[str, Any]]]:
    """Every cluster of the inventory as (its group's name, or "" for the one cluster of an inventory that names none;
    its resolved configuration), each resolved and checked as its own runs do (ControllerTaskError otherwise)."""
    return [(name, resolve_cluster(templar, task_vars, head_group, workers_group, hosts)["ansible_facts"][FACT])
            for name, hosts in inventory_clusters(task_vars, head_group, workers_group)]
