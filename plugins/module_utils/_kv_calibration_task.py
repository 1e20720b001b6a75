# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_kv_calibration task: its arguments, the cache file's I/O, and the lookup/record run.

Private module: may change at any time. Shared by the module (plugins/modules/vllm_kv_calibration.py) and its
action plugin (plugins/action/vllm_kv_calibration.py), which runs the same code in the controller's process:
the cache file lives on the controller, and a module run costs a Python start and a module transfer per call.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import (
    CalibrationError,
    block_size,
    cache_key,
    choose,
    dump_cache,
    key_parts,
    load_cache,
    lookup,
    record,
    round_down_to_block,
    same_values,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["lookup", "record"], "default": "lookup"},
    "command": {"type": "list", "elements": "str", "required": True},
    "model_path": {"type": "str", "required": True},
    "model_revision": {"type": "str", "required": True},
    "nodes": {"type": "list", "elements": "dict", "required": True, "options": {
        "name": {"type": "str", "required": True},
        "image_id": {"type": "str", "required": True},
        "hardware": {"type": "dict", "required": True},
    }},
    "reports": {"type": "dict"},
    "estimated_max_model_len": {"type": "int"},
    "policy": {"type": "str", "choices": ["requested", "full"], "default": "requested"},
    "margin_bytes": {"type": "int", "default": 0},
    "default_block_size": {"type": "int", "default": 16},
}
MUTUALLY_EXCLUSIVE = [("reports", "estimated_max_model_len")]
REQUIRED_IF = [("state", "record", ("reports", "estimated_max_model_len"), True)]


class CalibrationTaskError(Exception):
    """The task fails: msg for the user, extra keys for the result."""

    def __init__(self, msg: str, **extra: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


@contextlib.contextmanager
def record_lock(path: str | None) -> Iterator[None]:
    """Hold the record's lock (flock on ``<path>.lock``) from its read to its write: runs of different clusters
    share one record on the controller and may plan at the same time; without the lock one run's write would
    drop the entry the other wrote in between. No path: nothing to lock."""
    if not path:
        yield
        return
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_text(path: str, text: str) -> None:
    """Replace path atomically (a temporary file in the same directory, then rename), mode 0644."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kv-calibration.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def missing_directory(path: str) -> str | None:
    """What is wrong when the record's directory does not exist (None: it does), checked before anything starts."""
    if os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return None
    return (f"the directory of the KV calibration file {path} does not exist: create it or set "
            "launch_kv_calibration_file to a path in an existing directory")


def run(p: Mapping[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
    """Look up (or record) the entry of the key p describes; the task's result, or CalibrationTaskError."""
    path = p["path"]
    problem = missing_directory(path)
    if problem:
        raise CalibrationTaskError(problem)
    with record_lock(None if check_mode else path):
        return _run_locked(p, path, check_mode, diff)


def _run_locked(p: Mapping[str, Any], path: str, check_mode: bool, diff: bool) -> dict[str, Any]:
    try:
        parts = key_parts(p["command"], p["model_path"], p["model_revision"], p["nodes"])
        key = cache_key(parts)
        block = block_size(p["command"], p["default_block_size"])
        cache = load_cache(read_text(path), path)
    except CalibrationError as exc:
        raise CalibrationTaskError(str(exc)) from exc
    before = lookup(cache, key)
    result: dict[str, Any] = {"key": key, "parts": parts, "found": before is not None, "changed": False}
    entry = before
    if p["state"] == "record":
        if p["reports"] is not None:
            try:
                chosen = choose(p["reports"], p["policy"], p["margin_bytes"])
            except CalibrationError as exc:
                raise CalibrationTaskError(f"KV calibration failed: {exc}", key=key, parts=parts) from exc
            result["chosen"] = chosen
            values = dict(chosen)
        else:
            if p["estimated_max_model_len"] <= 0:
                raise CalibrationTaskError(
                    f"estimated_max_model_len must be positive, got {p['estimated_max_model_len']}")
            values = {"estimated_max_model_len": p["estimated_max_model_len"]}
        if not same_values(before, values):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            updated = record(cache, key, parts, values, stamp)
            entry = lookup(updated, key)
            result["changed"] = True
            if diff:
                result["diff"] = {"before": dump_cache({"entry": before}) if before else "",
                                  "after": dump_cache({"entry": entry}),
                                  "before_header": f"{path} [{key}]", "after_header": f"{path} [{key}]"}
            if not check_mode:
                try:
                    write_text(path, dump_cache(updated))
                except OSError as exc:
                    raise CalibrationTaskError(f"cannot write the KV calibration file {path}: {exc}") from exc
    entry = entry or None
    result["entry"] = entry
    result["kv_cache_memory_bytes"] = entry.get("kv_cache_memory_bytes") if entry else None
    result["estimated_max_model_len"] = entry.get("estimated_max_model_len") if entry else None
    result["block_size"] = block
    result["max_model_len_fit"] = (round_down_to_block(result["estimated_max_model_len"], block)
                                   if result["estimated_max_model_len"] else None)
    return result
