# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long a start may take and how it is watched: one definition for the launch, the EXL3 kit and the guard.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

The configuration step (`_config.resolve`) resolves these once into the ``timing`` part of the
``dgxspark_vllm_config`` fact, each value with where it came from: the defaults below (some depend on the profile's
launcher), then the inventory's ``dgxspark_vllm_*`` variable. The launch role, the kit_launch role, the cluster
role's stop and the guard read that fact; none of them defines a value of its own.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import DEFAULT_BUDGETS
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import PHASES

# name in the fact (and dgxspark_vllm_<name>) -> (default, smallest value allowed, what it is)
SETTINGS: dict[str, tuple[Any, float, str]] = {
    "budgets": (None, 0, "seconds allowed to reach each startup phase, counted from the previous phase"),
    "poll_interval": (0.5, 0.1, "seconds between polls of a starting rank"),
    "peer_grace_seconds": (30, 1, "seconds a rank may go without a TCP connection to its peer once connected"),
    "stall_seconds": (900, 0, "seconds a load's log may stand still before it fails (0: no stall detection)"),
    "progress_interval": (15, 1, "seconds between the load's progress lines"),
    "api_timeout": (120, 1, "seconds to wait for the head's /v1/models from every node once the head serves"),
    "stop_grace_seconds": (10, 0, "seconds the head has after SIGTERM before SIGKILL (0: killed at once)"),
    "diagnosis_lines": (30, 1, "log lines of every rank a failed start shows"),
}
INTEGERS = frozenset({"stop_grace_seconds", "diagnosis_lines"})
"""Settings that are whole numbers (docker stop's --time, a count of lines)."""

# The EXL3 kit's start.sh starts the worker, waits for it, and only then starts the head: the head's container comes
# minutes after the watch began. EXL3's warm-up captures CUDA graphs per shape: the API comes later than NVFP4's.
# Each wait polls a docker inspect and a docker logs of the whole start: every 2 s while start.sh runs beside them.
LAUNCHER_DEFAULTS: dict[str, dict[str, Any]] = {
    "exl3_kit": {"budgets": {"container_started": 300, "api_up": 1800}, "poll_interval": 2},
}

# The roles' earlier variables, each now one dgxspark_vllm_* variable read by every role.
RENAMED: dict[str, str] = {
    "launch_budgets": "budgets",
    "kit_launch_budgets": "budgets",
    "launch_poll_interval": "poll_interval",
    "kit_launch_poll_interval": "poll_interval",
    "launch_peer_grace_seconds": "peer_grace_seconds",
    "kit_launch_peer_grace_seconds": "peer_grace_seconds",
    "launch_stall_seconds": "stall_seconds",
    "launch_progress_interval": "progress_interval",
    "launch_api_timeout": "api_timeout",
    "kit_launch_api_timeout": "api_timeout",
    "cluster_stop_head_grace": "stop_grace_seconds",
    "guard_stop_seconds": "stop_grace_seconds",
    "launch_diagnosis_lines": "diagnosis_lines",
    "kit_launch_diagnosis_lines": "diagnosis_lines",
}
PREFIX = "dgxspark_vllm_"
EXAMPLES: dict[str, str] = {
    "budgets": "{api_up: 1800}",
    "poll_interval": "2",
    "peer_grace_seconds": "60",
    "stall_seconds": "900",
    "progress_interval": "15",
    "api_timeout": "120",
    "stop_grace_seconds": "10",
    "diagnosis_lines": "30",
}


def renamed(given: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A problem for each earlier variable still set (per host: its variables as the inventory and extra vars give
    them), naming the variable that replaced it."""
    found: dict[str, list[str]] = {}
    for host, variables in given.items():
        for old in variables:
            if old in RENAMED:
                found.setdefault(old, []).append(host)
    return [f"{old} (on {', '.join(hosts)}) is no longer read: the launch, the EXL3 kit and the guard share one value, "
            f"set it as {PREFIX}{RENAMED[old]} (e.g. {PREFIX}{RENAMED[old]}: {EXAMPLES[RENAMED[old]]})"
            for old, hosts in sorted(found.items())]


def _as_number(value: Any) -> float | None:
    """value as a float; None for a boolean or anything float() refuses."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _number(name: str, value: Any, problems: list[str]) -> float | None:
    smallest = SETTINGS[name][1]
    shown = f"{PREFIX}{name}"
    number = _as_number(value)
    whole = name in INTEGERS
    if number is None or number < smallest or (whole and number != int(number)):
        kind = "a whole number" if whole else "a number of seconds"
        problems.append(f"{shown} must be {kind} of at least {smallest:g}, got {value!r} "
                        f"(e.g. {shown}: {EXAMPLES[name]})")
        return None
    return int(number) if whole or number == int(number) else number


def _budgets(value: Any, base: Mapping[str, float], problems: list[str]) -> dict[str, float] | None:
    shown = f"{PREFIX}budgets"
    if not isinstance(value, Mapping):
        problems.append(f"{shown} must be a mapping of startup phases to seconds, got {value!r} "
                        f"(e.g. {shown}: {EXAMPLES['budgets']})")
        return None
    out = dict(base)
    for phase, seconds in value.items():
        if phase not in PHASES:
            problems.append(f"{shown}.{phase} is not a startup phase (phases: {', '.join(PHASES)}; "
                            f"e.g. {shown}: {EXAMPLES['budgets']})")
            continue
        number = _as_number(seconds)
        if number is None or number <= 0:
            problems.append(f"{shown}.{phase} must be a positive number of seconds, got {seconds!r} "
                            f"(e.g. {shown}: {EXAMPLES['budgets']})")
            continue
        out[phase] = int(number) if number == int(number) else number
    return out


def resolve(launcher: str, given: Mapping[str, Any], problems: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(timing, sources): every setting's value for this launcher, with where it came from. ``given``: the
    inventory's values by setting name (budgets: the phases it sets, merged over the defaults)."""
    own = LAUNCHER_DEFAULTS.get(launcher, {})
    where = f"default (launcher {launcher})"
    timing: dict[str, Any] = {}
    sources: dict[str, str] = {}
    base = {phase: int(seconds) for phase, seconds in DEFAULT_BUDGETS.items()}
    base.update(own.get("budgets", {}))
    for phase in base:
        sources[f"budgets.{phase}"] = where if phase in own.get("budgets", {}) else "default"
    timing["budgets"] = base
    if "budgets" in given:
        budgets = _budgets(given["budgets"], base, problems)
        if budgets is not None:
            timing["budgets"] = budgets
            for phase in given["budgets"]:
                if phase in budgets:
                    sources[f"budgets.{phase}"] = PREFIX + "budgets"
    for name, (default, _smallest, _what) in SETTINGS.items():
        if name == "budgets":
            continue
        timing[name] = own.get(name, default)
        sources[name] = where if name in own else "default"
        if name in given:
            value = _number(name, given[name], problems)
            if value is not None:
                timing[name], sources[name] = value, PREFIX + name
    return timing, sources
