# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's configuration, resolved once and checked whole before any node is touched.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

Input: what the inventory (and extra vars) give each host under ``dgxspark_vllm_*``, the inventory groups, the
built-in profiles as data. Output: one configuration (profile < ``dgxspark_vllm_settings`` < explicit variables)
with where each value came from, or every problem at once, each naming the variable to change and an example.
"""
from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils import _checkpoint_store
from ansible_collections.dgxspark.vllm.plugins.module_utils import _kit
from ansible_collections.dgxspark.vllm.plugins.module_utils import _kv_calibration
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest
from ansible_collections.dgxspark.vllm.plugins.module_utils import _pins
from ansible_collections.dgxspark.vllm.plugins.module_utils import _placeholders
from ansible_collections.dgxspark.vllm.plugins.module_utils import _regression
from ansible_collections.dgxspark.vllm.plugins.module_utils import _preflight
from ansible_collections.dgxspark.vllm.plugins.module_utils import _release
from ansible_collections.dgxspark.vllm.plugins.module_utils import _tensor_parallel
from ansible_collections.dgxspark.vllm.plugins.module_utils import _timing
from ansible_collections.dgxspark.vllm.plugins.module_utils import _upgrade
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import (
    DEFAULT_PROFILE,
    MODEL_KEYS,
    UNSET_DEFAULTS,
    Profile,
    ProfileError,
    as_data,
    build_profiles,
    plain,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    _SETTING_CHECKS,
    SETTING_KEYS as RENDER_KEYS,
    TEMPLATE_KEYS,
    SpecError,
    _gpu_memory_utilization,
    render_cluster,
    resolve_settings,
)

PREFIX = "dgxspark_vllm_"
FACT = "dgxspark_vllm_config"


@dataclass(frozen=True)
class Variable:
    """One public variable: ``scope`` cluster (the same on every host), node (per host) or either (a cluster
    value a host may override); ``setting`` the profile setting it sets; ``blank`` what an empty string means."""

    name: str
    scope: str = "cluster"
    setting: str | None = None
    kind: str = "setting"     # setting (checked by the render's checks), str, bool, dict, path, secret
    blank: str = "error"      # error | unset | value
    example: str = ""


def _v(name: str, **kwargs: Any) -> Variable:
    return Variable(name=name, **kwargs)


VARIABLES: Mapping[str, Variable] = {var.name: var for var in (
    _v("profile", kind="str", example="glm53_flash_nvfp4"),
    _v("profiles", kind="dict", example="{my_profile: {extends: glm53_flash_nvfp4, settings: {...}}}"),
    _v("lab", kind="bool", example="false"),
    _v("image", setting="image", example="ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"),
    _v("container_name", setting="container_name", example="vllm_glm53"),
    _v("model_repo", setting="model_repo", kind="str", example="RedHatAI/GLM-5.3-Flash-NVFP4"),
    _v("model_revision", setting="model_revision", kind="str", example="main"),
    _v("drafter_repo", setting="drafter_repo", kind="str", blank="value", example='""'),
    _v("drafter_revision", setting="drafter_revision", kind="str", example="main"),
    _v("accept_noncommercial_drafter", kind="bool", example="true"),
    _v("model_path", setting="model_path", example="/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat"),
    _v("cache_path", setting="cache_path", example="/var/tmp/cache"),
    _v("kit_user", kind="str", example="spark"),
    _v("hf_home", kind="path", example="/home/spark/.cache/huggingface"),
    _v("staging_lock_path", kind="path", example="/run/dgxspark/staging.lock"),
    _v("served_model_name", setting="served_model_name", example="glm-5.3-flash"),
    _v("port", setting="port", example="8000"),
    _v("master_port", setting="master_port", example="29521"),
    _v("tensor_parallel_size", setting="tensor_parallel_size", example="2"),
    _v("attention_heads", setting="attention_heads", kind="count", example="64"),
    _v("kv_heads", setting="kv_heads", kind="count", example="64"),
    _v("gpu_memory_utilization", setting="gpu_memory_utilization", example="0.85"),
    _v("allow_high_gpu_memory_utilization", setting="allow_high_gpu_memory_utilization", example="false"),
    _v("max_model_len", setting="max_model_len", example="262144"),
    _v("kv_cache_memory_bytes", setting="kv_cache_memory_bytes", example="(unset: calibrated from vLLM's estimate)"),
    _v("cx7_subnet", setting="cx7_subnet", blank="unset", example="192.168.100.0/24"),
    _v("log_max_size", setting="log_max_size", example="100m"),
    _v("log_max_file", setting="log_max_file", example="5"),
    _v("cx7_ip", scope="node", kind="str", example="192.168.100.11"),
    _v("cx7_iface", scope="either", setting="cx7_iface", blank="unset", example="enp1s0f1np1"),
    _v("ib_hca", scope="either", setting="ib_hca", blank="unset", example="rocep1s0f1,roceP2p1s0f1"),
    _v("gid_index", scope="either", setting="gid_index", example="3"),
    _v("settings", kind="dict", example="{extra_args: [--max-num-seqs, '8']}"),
    _v("api_key", kind="secret", example='"{{ vault_vllm_api_key }}"'),
    _v("hf_token", kind="secret", example='"{{ vault_hf_token }}"'),
    _v("secure_logging", kind="bool", example="true"),
    _v("guard", kind="bool", example="true"),
    _v("firewall", kind="bool", example="true"),
    _v("api_allowed_cidrs", kind="cidrs", example="[192.168.1.0/24]"),
    _v("require_api_key", kind="bool", example="true"),
    _v("require_pins", kind="bool", example="true"),
    # an upgrade whose launch or verify fails rolls back to the last known-good release (false: left stopped)
    _v("upgrade_rollback", kind="bool", example="true"),
    # the last N releases of the history keep their images and checkpoint commits staged (_checkpoint_store)
    _v("upgrade_keep_staged", kind="count", example="2"),
    _v("api_key_file", kind="path", example="/etc/dgxspark/api-key"),
    # the group guard's Prometheus endpoint on the head (0: none); the firewall admits it from the API's networks only
    _v("guard_metrics_port", kind="port", example="9478"),
    # How far verify's short benchmark may fall behind the last known-good release's baseline (_regression), in %.
    _v("regression_decode_drop_percent", kind="percent", example="10"),
    _v("regression_ttft_rise_percent", kind="percent", example="25"),
    _v("regression_throughput_drop_percent", kind="percent", example="10"),
    # How a start is watched and stopped (the timing part of the fact; _timing): one value for every role.
    _v("budgets", kind="timing", example="{api_up: 1800}"),
    _v("poll_interval", kind="timing", example="2"),
    _v("peer_grace_seconds", kind="timing", example="60"),
    _v("stall_seconds", kind="timing", example="900"),
    _v("progress_interval", kind="timing", example="15"),
    _v("api_timeout", kind="timing", example="120"),
    _v("stop_grace_seconds", kind="timing", example="10"),
    _v("diagnosis_lines", kind="timing", example="30"),
    # Read by select_cluster (every host of the inventory must give the same list), not by resolve.
    _v("clusters", scope="inventory", kind="names", example="[pair_a, pair_b]"),
)}
# Variables the collection sets itself as facts (never inventory input).
FACT_NAMES = frozenset({FACT, "dgxspark_vllm_detected_cx7_iface", "dgxspark_vllm_detected_ib_hca",
                        "dgxspark_vllm_detected_gid_index", "dgxspark_vllm_api_key_generated"})
# Set with the generated key by the dgxspark_vllm role (every node of the cluster): the key came from the head's file.
GENERATED_KEY_FACT = "dgxspark_vllm_api_key_generated"
DEFAULT_API_KEY_FILE = "/etc/dgxspark/api-key"
DEFAULT_GUARD_METRICS_PORT = 9478
# Names people invent, with what to do instead.
_HINTS: Mapping[str, str] = {
    "node_rank": "ranks come from the inventory groups: the host in spark_head is rank 0, the hosts in "
                 "spark_workers follow in inventory order",
    "rank": "ranks come from the inventory groups: the host in spark_head is rank 0, the hosts in spark_workers "
            "follow in inventory order",
    "master_addr": "the head's dgxspark_vllm_cx7_ip is the master address; nothing to set",
    "headless": "--headless is added on every worker (spark_workers) and never on the head; nothing to set",
    "host_ip": "each host's dgxspark_vllm_cx7_ip is its VLLM_HOST_IP",
    "nnodes": "the number of nodes is the number of hosts in spark_head and spark_workers",
}
_IMAGE = re.compile(r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*"
                    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_MISSING = object()


class ConfigError(ValueError):
    """The inventory cannot be served as it is: ``problems`` lists every problem, each with its fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the inventory")
        self.problems = list(problems)


@dataclass(frozen=True)
class Inputs:
    """What the config step reads: per host, its ``dgxspark_vllm_*`` variables (inventory and extra vars, not
    role defaults); the groups; the built-in profiles' data; a few variables of other roles it checks."""

    hostvars: Mapping[str, Mapping[str, Any]]
    head: Sequence[str]
    workers: Sequence[str]
    builtin_profiles: Mapping[str, Any]
    ansible_user: str | None = None
    allow_denylisted: bool = False
    cluster: str = ""      # the cluster's group when the inventory declares dgxspark_vllm_clusters, else ""
    # per host, the other variables the example inventory's placeholders may be left in (connection and role
    # variables, as the inventory gives them), checked with the dgxspark_vllm_* ones
    checked_vars: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    image_digest: str = ""   # the image role's image_digest (the head's), which pins a tag as a digest does
    # a recorded release the run serves instead of the inventory's image, model, profile, settings and KV value (the
    # upgrade role's fact upgrade_release_pin on the head, set by a rollback: _upgrade.pin)
    release_pin: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Cluster:
    """The cluster one run serves: its group's name ("" when the inventory holds one cluster), its head (one
    host of spark_head) and its workers (its hosts of spark_workers, in that group's order)."""

    name: str
    head: list[str]
    workers: list[str]


def _show(value: Any) -> str:
    if value is _MISSING:
        return "not set"
    return repr(value)


def _fix(var: str, example: str) -> str:
    return f"{var}: {example}" if example else var


def parse_bool(value: Any) -> bool | None:
    """A boolean as YAML or an INI inventory gives it (true/yes/on/1 ...), or None when it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return None


def _hosts(inputs: Inputs) -> list[str]:
    return list(dict.fromkeys(list(inputs.head) + list(inputs.workers)))


def select_cluster(groups: Mapping[str, Sequence[str]], declared: Mapping[str, Any], play_hosts: Sequence[str],
                   head_group: str = "spark_head", workers_group: str = "spark_workers") -> Cluster:
    """The cluster of this run's hosts, or ConfigError.

    ``declared``: each host of the head and workers groups -> its ``dgxspark_vllm_clusters`` (missing when unset).
    Unset everywhere: one cluster, the whole of both groups. Set: a list of group names, the same on every host;
    every head and worker is in exactly one of them, and this run's hosts are in one cluster only (``--limit``).
    """
    head_all = list(groups.get(head_group, []))
    workers_all = list(groups.get(workers_group, []))
    members = list(dict.fromkeys(head_all + workers_all))
    values = {repr(value): value for host, value in declared.items() if host in members}
    if not values or set(values) == {repr(_MISSING)} or set(values) == {repr(None)}:
        return Cluster(name="", head=head_all, workers=workers_all)
    full = PREFIX + "clusters"
    example = _fix(full, VARIABLES["clusters"].example)
    if len(values) > 1:
        shown = "; ".join(f"{host}: {_show(value)}" for host, value in declared.items() if host in members)
        raise ConfigError([f"{full} differs between hosts ({shown}): it names every cluster of the inventory, so "
                           f"set it once for all of them (group_vars/spark_cluster.yml or all.yml; e.g. {example})"])
    names = next(iter(values.values()))
    if (isinstance(names, str) or not isinstance(names, Sequence) or not names
            or not all(isinstance(name, str) and name for name in names)):
        raise ConfigError([f"{full} must be a list of the inventory groups that are clusters, got {names!r} "
                           f"(e.g. {example})"])
    problems: list[str] = []
    for name in names:
        if name in (head_group, workers_group) or name not in groups:
            close = difflib.get_close_matches(name, [group for group in groups
                                                     if group not in (head_group, workers_group, "all", "ungrouped")],
                                              n=1)
            problems.append(f"{full} names {name!r}, which is not a group of the inventory"
                            f"{'; did you mean ' + close[0] + '?' if close else ''} (each cluster is a group that holds "
                            f"its head and its workers; see inventories/example_pairs/hosts.yml)")
    if problems:
        raise ConfigError(problems)
    owner: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        for host in groups[name]:
            owner.setdefault(host, []).append(name)
    for host, owned in owner.items():
        if len(owned) > 1:
            problems.append(f"{host} is in the clusters {' and '.join(owned)}: a node serves one cluster (one engine, "
                            "one container, one CX7 port); remove it from all but one of them")
        elif host not in members:
            problems.append(f"{host} is in the cluster {owned[0]} but in neither {head_group} nor {workers_group}: "
                            f"add it to {head_group} (its cluster's head) or {workers_group}")
    for host in members:
        if host not in owner:
            problems.append(f"{host} is in {head_group if host in head_all else workers_group} but in none of the "
                            f"clusters {full} names ({', '.join(names)}): add it to one of them")
    touched = list(dict.fromkeys(owner[host][0] for host in play_hosts if host in owner))
    if len(touched) > 1:
        problems.append(f"this run's hosts belong to the clusters {', '.join(touched)}: a run serves one cluster, so "
                        f"select it with --limit (e.g. --limit {touched[0]}); runs of different clusters may go at "
                        "the same time")
    elif not touched:
        problems.append(f"this run holds no host of the clusters {', '.join(names)}: select one with --limit "
                        f"(e.g. --limit {names[0]})")
    if problems:
        raise ConfigError(problems)
    name = touched[0]
    return Cluster(name=name, head=[host for host in head_all if host in groups[name]],
                   workers=[host for host in workers_all if host in groups[name]])


def _check_groups(inputs: Inputs, problems: list[str]) -> None:
    where = f"the cluster {inputs.cluster} must hold" if inputs.cluster else "the group spark_head must hold"
    if len(inputs.head) != 1:
        problems.append(f"{where} exactly one host {'of spark_head ' if inputs.cluster else ''}(the head, rank 0); "
                        f"it holds {len(inputs.head)}{': ' + ', '.join(inputs.head) if inputs.head else ''} "
                        "(see inventories/example/hosts.yml)")
    if not inputs.workers:
        problems.append(f"{'the cluster ' + inputs.cluster if inputs.cluster else 'the group spark_workers'} holds "
                        "no host of spark_workers: the cluster needs at least one worker "
                        "(see inventories/example/hosts.yml)")
    both = sorted(set(inputs.head) & set(inputs.workers))
    if both:
        problems.append(f"{', '.join(both)} is in both spark_head and spark_workers: a host is the head or a worker")


_SECRET_NAME = re.compile(r"pass(?:word|phrase)|token|secret|api_key", re.IGNORECASE)
# Besides dgxspark_vllm_*: where the example inventory (and a user filling it in) puts values of its own.
CONNECTION_VARIABLES = frozenset({"inventory_hostname", "ansible_host", "ansible_port", "ansible_user",
                                  "ansible_become_user", "ansible_ssh_host", "ansible_ssh_port", "ansible_ssh_user",
                                  "ansible_ssh_private_key_file", "ansible_python_interpreter"})
# The operations role's older variable names (README, "What site.yml does")
_OLDER_PREFIXES = ("logs_", "teardown_", "benchmark_")


def checked_for_placeholders(name: str, roles: Sequence[str]) -> bool:
    """Whether the placeholder check reads a variable: connection variables and every role's public variables
    (``<role>_*``; facts and Ansible's own variables are not inventory input)."""
    return name in CONNECTION_VARIABLES or name.startswith(PREFIX) or name.startswith(_OLDER_PREFIXES) or \
        any(name.startswith(role + "_") for role in roles)


def is_secret(name: str) -> bool:
    """A variable whose value is never shown: the collection's secrets, and any name that says it holds one."""
    return (name.startswith(PREFIX) and VARIABLES.get(name[len(PREFIX):], Variable(name)).kind == "secret") or \
        bool(_SECRET_NAME.search(name))


def _check_placeholders(inputs: Inputs, problems: list[str]) -> None:
    """The example inventory's placeholders (<YOUR_USER>, its documentation addresses) left in any host's variables."""
    values = {}
    for host in _hosts(inputs):
        own = {name: value for name, value in inputs.hostvars.get(host, {}).items() if name.startswith(PREFIX)}
        values[host] = {**inputs.checked_vars.get(host, {}), **own}
    secrets = {name for host_values in values.values() for name in host_values if is_secret(name)}
    problems.extend(_placeholders.describe(_placeholders.find_placeholders(values, secrets)))


def _check_names(inputs: Inputs, problems: list[str]) -> None:
    seen: dict[str, list[str]] = {}
    for host in _hosts(inputs):
        for name in inputs.hostvars.get(host, {}):
            if name.startswith(PREFIX) and name not in FACT_NAMES and name[len(PREFIX):] not in VARIABLES:
                seen.setdefault(name, []).append(host)
    for name, hosts in sorted(seen.items()):
        short = name[len(PREFIX):]
        if short in _HINTS:
            advice = _HINTS[short]
        else:
            close = difflib.get_close_matches(short, list(VARIABLES), n=1, cutoff=0.6)
            advice = (f"did you mean {PREFIX}{close[0]}?" if close
                      else "see roles/dgxspark_vllm/README.md for the variables")
        problems.append(f"{name} (on {', '.join(hosts)}) is not a variable of dgxspark.vllm and would be ignored: "
                        f"{advice}")


def _check_same(inputs: Inputs, problems: list[str]) -> None:
    hosts = _hosts(inputs)
    for var in VARIABLES.values():
        if var.scope != "cluster":
            continue
        name = PREFIX + var.name
        values = [(host, inputs.hostvars.get(host, {}).get(name, _MISSING)) for host in hosts]
        if len({repr(value) for _host, value in values}) > 1:
            shown = "; ".join(f"{host}: {'(hidden)' if var.kind == 'secret' else _show(value)}"
                              for host, value in values)
            group = inputs.cluster or "spark_cluster"
            problems.append(f"{name} differs between hosts ({shown}): it is cluster-wide, so every rank must "
                            f"render the same value; set it once for the group {group} "
                            f"(group_vars/{group}.yml), not per host")


def _cluster_value(inputs: Inputs, name: str) -> Any:
    head = inputs.head[0] if inputs.head else (_hosts(inputs) or [None])[0]
    return inputs.hostvars.get(head, {}).get(PREFIX + name, _MISSING) if head else _MISSING


def _check_plain(name: str, var: Variable, value: Any, problems: list[str]) -> Any:
    """The value of a variable that is not a render setting, checked; _MISSING when broken."""
    full = PREFIX + name
    if var.kind == "bool":
        flag = parse_bool(value)
        if flag is None:
            problems.append(f"{full} must be true or false, got {value!r} (e.g. {_fix(full, var.example)})")
            return _MISSING
        return flag
    if var.kind in ("str", "path", "secret"):
        if not isinstance(value, str):
            shown = "(hidden)" if var.kind == "secret" else repr(value)
            problems.append(f"{full} must be a string, got {shown} (e.g. {_fix(full, var.example)})")
            return _MISSING
        if var.kind == "path" and not value.startswith("/"):
            problems.append(f"{full} must be an absolute path, got {value!r} (e.g. {_fix(full, var.example)})")
            return _MISSING
        if var.kind != "secret" and not value.strip() and var.blank == "error":
            problems.append(f"{full} is empty (e.g. {_fix(full, var.example)}); remove it to take the default")
            return _MISSING
        return value
    if var.kind == "count":
        count = _count(value)
        if count is None:
            problems.append(f"{full} must be a whole number of 1 or more, got {value!r} (e.g. {_fix(full, var.example)})")
            return _MISSING
        return count
    if var.kind == "port":
        port = None if isinstance(value, bool) else 0 if value in (0, "0") else _count(value)
        if port is None or port > 65535:
            problems.append(f"{full} must be a port number (1-65535) or 0 for none, got {value!r} "
                            f"(e.g. {_fix(full, var.example)})")
            return _MISSING
        return port
    if var.kind == "cidrs":
        if isinstance(value, str) or not isinstance(value, Sequence):
            problems.append(f"{full} must be a list of networks, got {value!r} (e.g. {_fix(full, var.example)})")
            return _MISSING
        networks: list[str] = []
        for item in value:
            try:
                network = str(ipaddress.ip_network(str(item).strip(), strict=False))
            except ValueError:
                problems.append(f"{full}: {item!r} is not an address or a network (e.g. {_fix(full, var.example)})")
                return _MISSING
            if network not in networks:
                networks.append(network)
        return networks
    if var.kind == "percent":
        try:
            return _regression.check_threshold(name[len("regression_"):], value, full)
        except _regression.RegressionError as exc:
            problems.append(str(exc))
            return _MISSING
    if var.kind == "dict":
        if not isinstance(value, Mapping):
            problems.append(f"{full} must be a mapping, got {value!r} (e.g. {_fix(full, var.example)})")
            return _MISSING
        return dict(value)
    return value


def _count(value: Any) -> int | None:
    """A positive whole number as YAML or an INI inventory gives it (64 or "64"), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and value >= 1 else None


@dataclass
class _Resolved:
    values: dict[str, Any]
    sources: dict[str, str]


def _profile(inputs: Inputs, problems: list[str]) -> Profile | None:
    name = _cluster_value(inputs, "profile")
    name = DEFAULT_PROFILE if name is _MISSING or name is None else name
    if inputs.release_pin:
        name = inputs.release_pin.get("profile") or name
    user = _cluster_value(inputs, "profiles")
    user = None if user is _MISSING else user
    try:
        profiles = build_profiles(inputs.builtin_profiles, user, TEMPLATE_KEYS)
    except ProfileError as exc:
        problems.extend(exc.problems)
        return None
    if not isinstance(name, str) or name not in profiles:
        problems.append(f"dgxspark_vllm_profile {name!r} is not a profile; known: {', '.join(sorted(profiles))} "
                        "(define your own in dgxspark_vllm_profiles)")
        return None
    return profiles[name]


def _namer(sources: Mapping[str, str]) -> Any:
    """Setting key -> the variable a user changes, as messages name it."""
    explicit = {var.setting: PREFIX + var.name for var in VARIABLES.values() if var.setting}

    def name(key: str) -> str:
        source = sources.get(key, "")
        if source == "dgxspark_vllm_settings":
            return f"dgxspark_vllm_settings.{key}"
        return explicit.get(key, f"dgxspark_vllm_settings.{key}")
    return name


def _examples() -> dict[str, str]:
    return {var.setting: var.example for var in VARIABLES.values() if var.setting and var.example}


def resolve(inputs: Inputs) -> dict[str, Any]:
    """The configuration fact, or ConfigError with every problem."""
    problems: list[str] = []
    _check_placeholders(inputs, problems)
    _check_groups(inputs, problems)
    _check_names(inputs, problems)
    _check_same(inputs, problems)
    profile = _profile(inputs, problems)
    if profile is None:
        raise ConfigError(problems)

    # profile < dgxspark_vllm_settings < explicit variables
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in RENDER_KEYS + ("model_repo", "model_revision", "drafter_repo", "drafter_revision") + MODEL_KEYS:
        if key in profile.settings:
            values[key], sources[key] = plain(profile.settings[key]), f"profile {profile.name}"
        else:
            values[key], sources[key] = plain(UNSET_DEFAULTS.get(key)), "default"
    user_settings = _cluster_value(inputs, "settings")
    if user_settings is not _MISSING and user_settings is not None:
        user_settings = _check_plain("settings", VARIABLES["settings"], user_settings, problems)
        for key, value in (user_settings if isinstance(user_settings, dict) else {}).items():
            if key not in RENDER_KEYS:
                close = difflib.get_close_matches(str(key), list(RENDER_KEYS), n=1)
                problems.append(f"dgxspark_vllm_settings.{key} is not a setting of the render"
                                f"{'; did you mean ' + close[0] + '?' if close else ''} (known: "
                                f"{', '.join(RENDER_KEYS)})")
            elif value is not None:
                values[key], sources[key] = value, "dgxspark_vllm_settings"
    explicit: dict[str, Any] = {}
    timing_given: dict[str, Any] = {}
    for var in VARIABLES.values():
        if var.scope in ("node", "inventory"):
            continue
        value = _cluster_value(inputs, var.name)
        if value is _MISSING or value is None:
            continue
        if var.kind == "timing":
            timing_given[var.name] = value
            continue
        if var.setting is None:
            checked = _check_plain(var.name, var, value, problems)
            if checked is not _MISSING:
                explicit[var.name] = checked
                sources[var.name] = PREFIX + var.name
            continue
        if var.kind != "setting":
            value = _check_plain(var.name, var, value, problems)
            if value is _MISSING:
                continue
        if isinstance(value, str) and not value.strip() and var.blank == "unset":
            values[var.setting], sources[var.setting] = None, PREFIX + var.name
            continue
        values[var.setting], sources[var.setting] = value, PREFIX + var.name

    if inputs.release_pin:
        try:
            pinned = _upgrade.pinned_values(inputs.release_pin, RENDER_KEYS)
        except _upgrade.UpgradeError as exc:
            raise ConfigError([str(exc)]) from None
        for key, value in pinned.items():
            values[key], sources[key] = value, f"release {inputs.release_pin['id']}"
    name = _namer(sources)
    name.sources = sources  # type: ignore[attr-defined]
    _check_image(values["image"], name("image"), problems)
    unpinned = _unpinned(inputs, values, explicit, name, problems)
    _check_repos(inputs, values, explicit, name, problems)
    nodes = _nodes(inputs, problems)
    render_settings = {key: values[key] for key in RENDER_KEYS}
    settings_ok = _check_settings(profile, render_settings, name, problems)
    if nodes is not None:
        _check_tensor_parallel(values, len(nodes), name, problems)
    if settings_ok and profile.launcher == "docker_run" and nodes is not None:
        _check_render(profile, render_settings, nodes, name, problems)
    problems.extend(_timing.renamed(inputs.checked_vars))
    timing, timing_sources = _timing.resolve(profile.launcher, timing_given, problems)
    if explicit.get("guard") and profile.launcher != "docker_run":
        problems.append(f"dgxspark_vllm_guard: true is refused for profile {profile.name} (launcher "
                        f"{profile.launcher}): the group guard starts and stops the containers the docker_run "
                        "launch created, and the EXL3 kit's start.sh makes its own; set dgxspark_vllm_guard: false "
                        "(or remove it: it is off for this launcher)")
    metrics_port = explicit.get("guard_metrics_port", DEFAULT_GUARD_METRICS_PORT)
    for key in ("port", "master_port"):
        if metrics_port and str(metrics_port) == str(values.get(key)).strip():
            problems.append(f"dgxspark_vllm_guard_metrics_port and {name(key)} are both {metrics_port}: the guard's "
                            "metrics endpoint needs a port of its own (or 0 for none)")
    if problems:
        raise ConfigError(_with_examples(problems))

    head = inputs.head[0]
    launcher_kit = profile.launcher == "exl3_kit"
    kit_user = explicit.get("kit_user") or inputs.ansible_user or "root"
    sources.setdefault("kit_user", "the head's ansible_user" if inputs.ansible_user else "default")
    home = "/root" if kit_user == "root" else f"/home/{kit_user}"
    hf_home = explicit.get("hf_home") or (
        f"{home}/.cache/huggingface" if launcher_kit else f"{values['cache_path']}/huggingface")
    sources.setdefault("hf_home", "the kit user's home" if launcher_kit else "cache_path/huggingface")
    config: dict[str, Any] = {
        "profile": as_data(profile),
        "profile_name": profile.name,
        "launcher": profile.launcher,
        "staging_layout": profile.staging_layout,
        "lab": explicit.get("lab", False),
        "accept_noncommercial_drafter": explicit.get("accept_noncommercial_drafter", False),
        "kit_user": kit_user,
        "hf_home": hf_home,
        "staging_lock_path": explicit.get("staging_lock_path", "/run/dgxspark/staging.lock"),
        "secure_logging": explicit.get("secure_logging", True),
        "guard": explicit.get("guard", profile.launcher == "docker_run"),
        "firewall": explicit.get("firewall", True),
        "api_allowed_cidrs": explicit.get("api_allowed_cidrs", []),
        "require_api_key": explicit.get("require_api_key", True),
        "api_key_file": explicit.get("api_key_file", DEFAULT_API_KEY_FILE),
        "guard_metrics_port": metrics_port,
        **_api_key_plan(profile.launcher, render_settings.get("host"), bool(explicit.get("api_key")),
                        bool((inputs.hostvars.get(head) or {}).get(GENERATED_KEY_FACT))),
        "hf_token_set": bool(explicit.get("hf_token")),
        "require_pins": explicit.get("require_pins", False),
        "upgrade_rollback": explicit.get("upgrade_rollback", True),
        "upgrade_keep_staged": explicit.get("upgrade_keep_staged", _checkpoint_store.DEFAULT_KEEP),
        # the recorded release this run serves instead of the inventory's (a rollback), or ""
        "release_pin": str((inputs.release_pin or {}).get("id") or ""),
        # the image role's record of the digest its staging resolved, on each node (read by the launch)
        "image_record_path": _pins.RECORD_PATH,
        # the cluster's release history on the head (root-only; verify records the known-good release there)
        "release_history_path": _release.HISTORY_PATH,
        # verify's reports on the head, beside the history (root-only; each release names its own)
        "verify_reports_path": _release.REPORTS_PATH,
        # the cluster's copy of the KV record on the head (root-only; the launch reads it and writes it back)
        "kv_record_path": _kv_calibration.HEAD_PATH,
        "unpinned": unpinned,
        "settings": {key: value for key, value in render_settings.items() if value is not None},
        "cluster": inputs.cluster,
        "head": head,
        "workers": list(inputs.workers),
        "nodes": nodes,
        "head_cx7_ip": nodes[head]["cx7_ip"],
        # how far verify's short benchmark may fall behind the last known-good's baseline, in percent
        "regression": {key: explicit.get("regression_" + key, default)
                       for key, default in _regression.DEFAULT_THRESHOLDS.items()},
        # how a start is watched and stopped: the launch, the EXL3 kit, the cluster's stop and the guard read these
        "timing": timing,
    }
    for key in ("image", "container_name", "model_repo", "model_revision", "drafter_repo", "drafter_revision",
                "model_path", "cache_path", "served_model_name", "port", "master_port", "max_model_len",
                "gpu_memory_utilization", "tensor_parallel_size", "kv_cache_memory_bytes", "log_max_size",
                "log_max_file") + MODEL_KEYS:
        config[key] = values[key]
    config["cx7_subnet"] = values["cx7_subnet"] or ""
    for key in ("lab", "accept_noncommercial_drafter", "staging_lock_path", "secure_logging", "profile", "guard",
                "firewall", "require_api_key", "api_key_file", "require_pins", "guard_metrics_port",
                "upgrade_rollback", "upgrade_keep_staged"):
        sources.setdefault(key, "default")
    for key in _regression.DEFAULT_THRESHOLDS:
        sources.setdefault("regression_" + key, "default")
    sources.setdefault("api_allowed_cidrs", "default (the controller's address and the nodes)")
    sources["profile"] = sources.get("profile") if "profile" in explicit else "default"
    sources.update({f"timing.{key}": source for key, source in timing_sources.items()})
    config["sources"] = {key: sources[key] for key in sorted(sources)}
    return config


def _api_key_plan(launcher: str, host: Any, key_set: bool, generated: bool) -> dict[str, Any]:
    """Where the API key comes from: the inventory (dgxspark_vllm_api_key), the head's generated key file (an API
    beyond loopback without a key in the inventory: the dgxspark_vllm role generates it once, then reads it back
    and gives it to every node as dgxspark_vllm_api_key), or nowhere (an API on loopback only)."""
    beyond = _preflight.listens_beyond_loopback(launcher, host)
    if generated:
        source = "generated"
    elif key_set:
        source = "dgxspark_vllm_api_key"
    else:
        source = "generated" if beyond else "none"
    # set: the inventory's key, or the generated one (the dgxspark_vllm role reads or makes it right after this
    # step, in the same play, so a play's first resolution already counts it)
    return {"api_key_generate": beyond and not key_set, "api_key_source": source,
            "api_key_set": key_set or beyond}


def _unpinned(inputs: Inputs, values: Mapping[str, Any], explicit: Mapping[str, Any], name: Any,
              problems: list[str]) -> list[str]:
    """The unpinned image and revisions: returned (warnings), or problems with dgxspark_vllm_require_pins: true."""
    sources = getattr(name, "sources", {})
    out = []
    for key, text in _pins.unpinned(values, name, inputs.image_digest):
        source = sources.get(key, "")
        out.append(f"{text} [the value comes from {source}]" if source.startswith("profile ") else text)
    if out and explicit.get("require_pins"):
        problems.extend(f"{text}; {PREFIX}require_pins is true, so an unpinned value is refused (or set "
                        f"{PREFIX}require_pins: false to run it with a warning)" for text in out)
        return []
    return out


def _check_tensor_parallel(values: Mapping[str, Any], nodes: int, name: Any, problems: list[str]) -> None:
    """The tensor-parallel size (set, or derived: nodes x GPUs per node / pipeline) against the model's heads."""
    sources = getattr(name, "sources", {})
    counts = {key: _count(values.get(key)) for key in MODEL_KEYS}
    if None in counts.values():
        unknown = [key for key, count in counts.items() if count is None]
        problems.append(f"the model's {' and '.join(key.replace('_', ' ') for key in unknown)} "
                        f"({', '.join(f'{name(key)} {values.get(key)!r}' for key in unknown)}) must be whole numbers "
                        "of 1 or more: set them in the profile (settings.attention_heads, settings.kv_heads) or with "
                        f"{PREFIX}attention_heads and {PREFIX}kv_heads, from the checkpoint's config.json "
                        "(num_attention_heads, num_key_value_heads); the tensor-parallel size is checked against them")
        return
    gpus = _count(values.get("gpus_per_node")) or 1
    pipeline = _count(values.get("pipeline_parallel_size")) or 1
    explicit = _count(values.get("tensor_parallel_size"))
    if explicit is None and (nodes * gpus) % pipeline:
        return   # the render names the pipeline size that does not divide the GPUs
    size = explicit if explicit is not None else nodes * gpus // pipeline
    model = _tensor_parallel.Model(attention_heads=counts["attention_heads"], kv_heads=counts["kv_heads"])
    found = _tensor_parallel.check(size, nodes, model, name("tensor_parallel_size"), explicit is not None, gpus, pipeline)
    origins = sorted({sources.get(key, "") for key in MODEL_KEYS} - {""})
    for problem in found:
        problems.append(f"{problem}. [The head counts ({model.attention_heads} and {model.kv_heads}) come from "
                        f"{' and '.join(origins) or 'the profile'}; for a model of another shape set "
                        f"{PREFIX}attention_heads and {PREFIX}kv_heads from its config.json]")


def _check_image(image: Any, where: str, problems: list[str]) -> None:
    if not isinstance(image, str) or not image:
        return   # the settings check names it
    match = _IMAGE.match(image)
    if not match:
        problems.append(f"{where} {image!r} is not an image reference (e.g. "
                        "dgxspark_vllm_image: ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8)")
    elif not match.group("tag") and not match.group("digest"):
        problems.append(f"{where} {image!r} has no tag or digest: Docker would pull whatever :latest is that day "
                        "and the nodes could run different builds. Name a tag or pin a digest (e.g. "
                        "dgxspark_vllm_image: ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8, or "
                        "...vllm-glm53-flash@sha256:<digest>)")


def _check_repos(inputs: Inputs, values: Mapping[str, Any], explicit: Mapping[str, Any], name: Any,
                 problems: list[str]) -> None:
    for key in ("model_repo", "drafter_repo"):
        repo = values.get(key)
        if key == "drafter_repo" and repo in ("", None):
            continue
        if not isinstance(repo, str) or not _REPO.match(repo):
            problems.append(f"{name(key)} must be a hub repository id org/name, got {repo!r} "
                            f"(e.g. {_fix(PREFIX + key, VARIABLES[key].example)})")
            continue
        reason = _manifest.denylist_reason(repo)
        if reason and not inputs.allow_denylisted:
            problems.append(f"{name(key)} {repo} is refused: {reason} (e.g. "
                            "dgxspark_vllm_model_repo: RedHatAI/GLM-5.3-Flash-NVFP4); or set "
                            "checkpoint_allow_denylisted: true to stage it anyway")
    drafter = values.get("drafter_repo")
    if isinstance(drafter, str) and drafter:
        try:
            _kit.drafter_guard(drafter, bool(explicit.get("accept_noncommercial_drafter", False)))
        except _kit.KitError as exc:
            problems.append(f"{exc} (e.g. dgxspark_vllm_accept_noncommercial_drafter: true, or "
                            'dgxspark_vllm_drafter_repo: "")')


def _nodes(inputs: Inputs, problems: list[str]) -> dict[str, dict[str, Any]] | None:
    nodes: dict[str, dict[str, Any]] = {}
    count = len(problems)
    for rank, host in enumerate(_hosts(inputs)):
        hostvars = inputs.hostvars.get(host, {})
        cx7_ip = hostvars.get(PREFIX + "cx7_ip", _MISSING)
        if cx7_ip is _MISSING or cx7_ip in (None, ""):
            problems.append(f"dgxspark_vllm_cx7_ip is not set for {host}: give every host its address on the CX7 "
                            f"link in the inventory (e.g. {host}: {{dgxspark_vllm_cx7_ip: 192.168.100.1{rank + 1}}})")
            continue
        entry: dict[str, Any] = {"cx7_ip": cx7_ip, "head": host in inputs.head, "rank": rank}
        for key in ("cx7_iface", "ib_hca", "gid_index"):
            value = hostvars.get(PREFIX + key, _MISSING)
            unset = value is _MISSING or value is None or value == ""
            # unset: detected on the node later ("" for the names, None for the GID index)
            entry[key] = (None if key == "gid_index" else "") if unset else value
        nodes[host] = entry
    return nodes if len(problems) == count else None


def _check_settings(profile: Profile, settings: dict[str, Any], name: Any, problems: list[str]) -> bool:
    if profile.launcher == "docker_run":
        try:
            resolve_settings(profile, settings, name)
        except SpecError as exc:
            problems.extend(_examples_for(exc, name))
            return False
        return True
    count = len(problems)   # the kit decides its own flags: check what the collection passes to it
    for key in ("image", "container_name", "served_model_name", "port", "max_model_len", "gpu_memory_utilization"):
        check, optional = _SETTING_CHECKS.get(key, (None, True))
        if settings.get(key) is None and (optional or key in ("max_model_len", "gpu_memory_utilization")):
            continue   # unset: the kit's own default
        try:
            if check is None:   # gpu_memory_utilization: the same limit as the render's
                _gpu_memory_utilization(settings.get(key), settings.get("allow_high_gpu_memory_utilization") is True,
                                        name)
            else:
                check(name(key), settings.get(key))
        except SpecError as exc:
            problems.extend(_examples_for(exc, name, key))
    return len(problems) == count


def _examples_for(exc: SpecError, name: Any, key: str | None = None) -> list[str]:
    examples = _examples()
    out = []
    for problem, problem_key in zip(exc.problems, exc.keys if key is None else [key] * len(exc.problems)):
        example = examples.get(problem_key or "")
        if example and "e.g." not in problem:
            problem = f"{problem} (e.g. {name(problem_key)}: {example})"
        source = getattr(name, "sources", {}).get(problem_key or "", "")
        if source.startswith("profile "):
            problem = f"{problem} [the value comes from {source}; set {name(problem_key)} to override it]"
        out.append(problem)
    return out


def _check_render(profile: Profile, settings: dict[str, Any], nodes: Mapping[str, Mapping[str, Any]], name: Any,
                  problems: list[str]) -> None:
    described = [{"name": host, "cx7_ip": entry["cx7_ip"], "head": entry["head"],
                  **{key: entry[key] for key in ("cx7_iface", "ib_hca", "gid_index") if entry[key] not in (None, "")}}
                 for host, entry in nodes.items()]

    def node_field(host: str, key: str) -> str:
        return f"dgxspark_vllm_{key} of {host}"
    try:
        render_cluster(profile, described, settings, None, name, node_field, pending_identity=True)
    except SpecError as exc:
        # the render names its own options (settings.x, nodes[].x): name the inventory's variables instead
        for problem in _examples_for(exc, name):
            problem = re.sub(r"nodes\[\]\.(\w+)", lambda match: f"{PREFIX}{match.group(1)} (per host)", problem)
            # the render's own "settings.x" only, not one a name() already made ("dgxspark_vllm_settings.x")
            problem = re.sub(r"(?<![\w.])settings\.(\w+)",
                             lambda match: name(match.group(1)) if match.group(1) in RENDER_KEYS else match.group(0),
                             problem)
            problem = problem.replace(f"{name('remove_env')}", "dgxspark_vllm_settings.remove_env").replace(
                f"{name('remove_args')}", "dgxspark_vllm_settings.remove_args")
            problems.append(problem)


def _with_examples(problems: list[str]) -> list[str]:
    return list(dict.fromkeys(problems))


def describe_sources(config: Mapping[str, Any]) -> list[str]:
    """One line per setting: its value and where it came from (shown with -v)."""
    lines = []
    sources = config.get("sources", {})
    values = dict(config.get("settings", {}))
    values.update({key: config[key] for key in config if key not in ("settings", "sources", "profile", "nodes")})
    values["profile"] = config.get("profile_name")
    timing = config.get("timing") or {}
    values.update({f"timing.{key}": value for key, value in timing.items() if key != "budgets"})
    values.update({f"timing.budgets.{phase}": value for phase, value in (timing.get("budgets") or {}).items()})
    for key in sorted(sources):
        shown = "(hidden)" if VARIABLES.get(key, Variable(key)).kind == "secret" else repr(values.get(key))
        lines.append(f"{key} = {shown} ({sources[key]})")
    return lines
