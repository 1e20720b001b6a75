# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A systemd unit's state and the files it runs from, compared with what should be there (pure).

Used by dgxspark.vllm.service_files_info: one read per node tells a role whether its service is installed as
planned and running, so that a re-run that finds everything in place changes nothing and costs one round trip.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

# What `systemctl show` is asked for, one --property each. ExecMainStartTimestampMonotonic: when the unit's running
# process started, in microseconds of the monotonic clock (0: it has not run since boot).
UNIT_PROPERTIES: tuple[str, ...] = ("LoadState", "ActiveState", "UnitFileState", "ExecMainStartTimestampMonotonic")
# ActiveState values of a unit that runs or is about to (a stop is still due for each)
_RUNNING_STATES = ("active", "activating", "reloading")
_STOPPED_STATES = ("inactive", "failed")


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show --property=...` output (KEY=value lines) as a dict; lines without '=' are ignored."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    return found


def unit_state(name: str, properties: Mapping[str, str], clock: tuple[float, float] | None = None) -> dict[str, Any]:
    """The unit as the caller judges it: loaded (its unit file exists), running (active), stopped (inactive or
    failed: not active, activating - a restart loop's wait too -, reloading or deactivating) and enabled at boot;
    installed (systemd knows its unit file, also with a bad setting) and at rest (stopped and not enabled at boot:
    nothing for a stop to do).

    ``clock`` is the node's (wall clock, monotonic clock) read together, in seconds: with it, ``started_at`` is when
    the running process started on the wall clock (the clock of the files' mtimes), else None (not running, or never
    started since boot)."""
    load = properties.get("LoadState", "")
    active = properties.get("ActiveState", "")
    enabled = properties.get("UnitFileState", "")
    return {"name": name, "load_state": load, "active_state": active, "unit_file_state": enabled,
            "loaded": load == "loaded", "running": active == "active", "stopped": active in _STOPPED_STATES,
            "enabled": enabled == "enabled", "installed": load != "not-found",
            "at_rest": active in _STOPPED_STATES and enabled != "enabled",
            "started_at": _started_at(properties.get("ExecMainStartTimestampMonotonic", ""), clock)
            if active == "active" else None}


def _started_at(monotonic_us: str, clock: tuple[float, float] | None) -> float | None:
    """The wall-clock time of a monotonic timestamp in microseconds, given the node's clocks read together."""
    if clock is None:
        return None
    try:
        micro = int(monotonic_us)
    except ValueError:
        return None
    if micro <= 0:
        return None
    wall, monotonic = clock
    return wall - (monotonic - micro / 1e6)


def stale_files(unit: Mapping[str, Any] | None, files: Sequence[Mapping[str, Any]]) -> list[str]:
    """The files a running unit's process predates: each one that exists with a ``mtime`` later than the unit's
    ``started_at`` (``files`` as file_state gives them). A file written after the process started is one it has not
    loaded: an install whose restart did not happen (the run failed before its handlers, or was stopped). Empty when
    the unit does not run or its start is not known."""
    if unit is None or not unit.get("running") or unit.get("started_at") is None:
        return []
    started = float(unit["started_at"])
    return [str(item["path"]) for item in files
            if item.get("exists") and item.get("mtime") is not None and float(item["mtime"]) > started]


def planned_stale_files(unit: Mapping[str, Any] | None, files: Sequence[Mapping[str, Any]]) -> list[str]:
    """stale_files among the files that hold their planned content (a file that differs is named as differing, and
    a file only read is never judged): what the unit's ``stale_files`` and its difference line name."""
    return stale_files(unit, [item for item in files if item["matches"]])


class ServiceFilesError(ValueError):
    """A list of files that cannot be read as asked (a name given to two files, an empty name)."""


def check_names(files: Sequence[Mapping[str, Any]], where: str) -> None:
    """Each file's optional ``name`` is its key in the result's mapping (``by_name``): not empty, and given to one file
    of ``files`` only; a file's optional ``part_of`` names another file's ``name`` (and then it has no name itself).
    ServiceFilesError names every problem at once (``where``: the option, e.g. ``also.files``)."""
    problems: list[str] = []
    paths: dict[str, list[str]] = {}
    for item in files:
        name = item.get("name")
        if name is None:
            continue
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{where}: the name of {item.get('path')} is empty: give it a name or leave name out")
            continue
        paths.setdefault(name, []).append(str(item.get("path")))
    for name, given in paths.items():
        if len(given) > 1:
            problems.append(f"{where}: the name {name!r} is given to {len(given)} files ({', '.join(given)}): "
                            "give each its own")
    for item in files:
        whole = item.get("part_of")
        if whole is None:
            continue
        if item.get("name") is not None:
            problems.append(f"{where}: {item.get('path')} has both a name and part_of: give it one of them")
        elif whole not in paths:
            problems.append(f"{where}: {item.get('path')} is part_of {whole!r}, which no file is named")
    if problems:
        raise ServiceFilesError("; ".join(problems))


def by_name(files: Sequence[Mapping[str, Any]], states: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The states of the files given a ``name`` (``states`` in the order of ``files``), by that name.

    Files ``part_of`` a named one (a program's module_utils, part of the program) fold into its entry: ``parts``
    lists their states, and the entry's ``exists`` and ``matches`` hold only when they hold for each part too (its
    own ``sha256`` and ``content`` stay its own)."""
    found = {item["name"]: dict(state) for item, state in zip(files, states) if item.get("name") is not None}
    for item, state in zip(files, states):
        whole = found.get(item.get("part_of"))   # check_names refused a part_of that names no file
        if whole is None:
            continue
        whole.setdefault("parts", []).append(state)
        whole["exists"] = whole["exists"] and state["exists"]
        if whole["matches"] is not None:
            whole["matches"] = whole["matches"] and bool(state["matches"])
    return found


def file_state(path: str, data: bytes | None, wanted: str | None, read: bool,
               mtime: float | None = None) -> dict[str, Any]:
    """One file: whether it exists, its SHA-256, its modification time (``mtime``, seconds of the wall clock; None
    when absent or not given), whether it holds exactly ``wanted`` (None when no content was given) and, with
    ``read``, its text (None when absent)."""
    state: dict[str, Any] = {"path": path, "exists": data is not None,
                             "sha256": hashlib.sha256(data).hexdigest() if data is not None else None,
                             "mtime": mtime if data is not None else None, "matches": None}
    if wanted is not None:
        state["matches"] = data is not None and data == wanted.encode("utf-8")
    if read:
        state["content"] = data.decode("utf-8", errors="replace") if data is not None else None
    return state


def differences(unit: Mapping[str, Any] | None, files: Sequence[Mapping[str, Any]], running: bool | None = True,
                enabled: bool | None = True) -> list[str]:
    """What keeps the service from being as planned, one phrase each (empty: installed as planned, and the unit
    active or not as ``running`` asks, enabled at boot or not as ``enabled`` asks; ``None``: either way, not
    compared - a caller that installs and leaves the unit's state as it finds it). A running unit whose process
    predates a compared file (stale_files) is not as planned either way: it runs what was there before."""
    found: list[str] = []
    for item in files:
        if item["matches"] is None:
            continue
        if not item["exists"]:
            found.append(f"{item['path']} is missing")
        elif not item["matches"]:
            found.append(f"{item['path']} differs from the planned content")
    if unit is not None:
        if not unit["loaded"]:
            found.append(f"the unit {unit['name']} is not installed ({unit['load_state'] or 'unknown'})")
        else:
            if running is True and not unit["running"]:
                found.append(f"the unit {unit['name']} is {unit['active_state'] or 'in an unknown state'}, not active")
            elif running is False and unit["active_state"] in _RUNNING_STATES:
                found.append(f"the unit {unit['name']} is {unit['active_state']}, not stopped")
            if enabled is True and not unit["enabled"]:
                found.append(f"the unit {unit['name']} is {unit['unit_file_state'] or 'not enabled'} at boot, "
                             "not enabled")
            elif enabled is False and unit["enabled"]:
                found.append(f"the unit {unit['name']} is enabled at boot, not disabled")
        stale = planned_stale_files(unit, files)
        if stale:
            found.append(f"the unit {unit['name']} runs a process started before {', '.join(stale)} changed: it "
                         "needs a restart to run what is installed")
    return found
