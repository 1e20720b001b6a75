# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KV-cache calibration: the key a measured KV budget belongs to, the controller's cache file, the choice.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports.

The recipe: "do not copy a byte value from someone else's hardware. Launch once, read vLLM's own reported
estimate for your box, and set it from that." The launch role does exactly that and remembers the answer
under a *key*: everything that changes how much memory the engine needs besides the KV cache, and what the
box has. A change of any key part means a new calibration; the same key reuses the value.

Key parts (`key_parts`): the image ID on every node, the model path and its staged commit, the serve flags
in `KEY_FLAGS` as rendered (a bare flag counts as ``true``; an absent one as ``null``), and each node's
hardware identity (GPU name, driver, total GPU memory as nvidia-smi reports it, and MemTotal: the GB10's
memory is unified). The KV byte flag itself is never part of the key.

Cache file (JSON, written next to the inventory by default)::

    {"format": 1,
     "entries": {"<key>": {"kv_cache_memory_bytes": 45175492096, "source": "suggestion", "policy": "requested",
                           "margin_bytes": 0, "per_node": {"spark-a": 45175492096, "spark-b": 45300000000},
                           "recorded_at": "2026-12-01T00:00:00Z", "parts": {...}}}}

An entry may instead (or also) hold ``estimated_max_model_len``: what the engine reported when the
max-model-len of that key did not fit.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import (
    POLICIES,
    KvChoiceError,
    KvSuggestion,
    choose_kv_bytes,
)

CACHE_FORMAT = 1
"""Version of the cache file layout; a file of another version is refused, never rewritten."""

HEAD_PATH = "/var/lib/dgxspark/kv-calibration.json"
"""The cluster's own copy of the record, on its head (root-only): a run from another controller (a second checkout,
an AWX job whose execution environment is thrown away) finds the measured budgets there."""

KEY_FLAGS: tuple[str, ...] = (
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-dtype",
    "--block-size",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--speculative-config",
    "--enforce-eager",
    "--moe-backend",
    "--quantization",
    "--dtype",
)
"""Serve flags whose value changes the memory the engine needs outside the KV cache (or the KV per token)."""

KV_FLAG = "--kv-cache-memory-bytes"
DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size when the command sets no ``--block-size``."""

GIB = 1 << 30


class CalibrationError(ValueError):
    """Inputs that cannot make a key, a cache file that cannot be used, or logs that give no KV value."""


# ---------------------------------------------------------------------------------------------- flags

def flag_values(command: Sequence[str]) -> dict[str, str | bool]:
    """``--flag value``, ``--flag=value`` and bare ``--flag`` (True) from a command list; the last one wins."""
    out: dict[str, str | bool] = {}
    items = [str(item) for item in command]
    for pos, item in enumerate(items):
        if not item.startswith("--"):
            continue
        if "=" in item:
            name, value = item.split("=", 1)
            out[name] = value
            continue
        following = items[pos + 1] if pos + 1 < len(items) else None
        if following is None or following.startswith("--"):
            out[item] = True
        else:
            out[item] = following
    return out


def block_size(command: Sequence[str], default: int = DEFAULT_BLOCK_SIZE) -> int:
    """The ``--block-size`` the command renders, or vLLM's default."""
    value = flag_values(command).get("--block-size")
    if value is None or value is True:
        return default
    try:
        size = int(str(value))
    except ValueError as exc:
        raise CalibrationError(f"--block-size must be an integer, got {value!r}") from exc
    if size <= 0:
        raise CalibrationError(f"--block-size must be positive, got {size}")
    return size


def round_down_to_block(length: int, block: int) -> int:
    """The largest multiple of block that is <= length (0 when length < block)."""
    if block <= 0:
        raise CalibrationError(f"block size must be positive, got {block}")
    if length < 0:
        raise CalibrationError(f"a model length cannot be negative, got {length}")
    return length - length % block


# ------------------------------------------------------------------------------------------------ key

def _hardware(node: Mapping[str, Any]) -> dict[str, Any]:
    hardware = node.get("hardware")
    if not isinstance(hardware, Mapping):
        raise CalibrationError(f"node {node.get('name')!r}: hardware must be a mapping, got {hardware!r}")
    out = {}
    for field in ("gpu_name", "driver", "gpu_memory", "mem_total_bytes"):
        value = hardware.get(field)
        out[field] = None if value in (None, "") else value
    if out["mem_total_bytes"] is None:
        raise CalibrationError(f"node {node.get('name')!r}: hardware.mem_total_bytes is required")
    return out


def key_parts(
    command: Sequence[str],
    model_path: str,
    model_revision: str,
    nodes: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Everything a KV budget depends on, as a JSON-able dict.

    nodes: one mapping per node in rank order, with ``name``, ``image_id`` and ``hardware`` (``gpu_name``,
    ``driver``, ``gpu_memory``, ``mem_total_bytes``). Raises `CalibrationError` on a missing part.
    """
    if not model_path:
        raise CalibrationError("model_path is required for the calibration key")
    if not model_revision:
        raise CalibrationError(
            "model_revision is required for the calibration key (the staged commit from the checkpoint stamp, "
            "or dgxspark_vllm_model_revision)"
        )
    if not nodes:
        raise CalibrationError("nodes must list every node of the cluster")
    flags = flag_values(command)
    node_parts = []
    for node in nodes:
        name = node.get("name")
        image_id = node.get("image_id")
        if not name:
            raise CalibrationError(f"every node needs a name, got {dict(node)!r}")
        if not image_id:
            raise CalibrationError(
                f"node {name!r}: image_id is empty: the serve image is not on that node (stage it first: "
                "--tags image)"
            )
        node_parts.append({"name": name, "image_id": image_id, "hardware": _hardware(node)})
    return {
        "model_path": model_path,
        "model_revision": model_revision,
        "flags": {flag: flags.get(flag) for flag in KEY_FLAGS},
        "nodes": node_parts,
    }


def cache_key(parts: Mapping[str, Any]) -> str:
    """A stable 20-hex-digit digest of the key parts (canonical JSON)."""
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------- cache

def empty_cache() -> dict[str, Any]:
    return {"format": CACHE_FORMAT, "entries": {}}


def load_cache(text: str | None, path: str = "the KV calibration cache") -> dict[str, Any]:
    """Parse the cache file's text (None or blank: an empty cache). Raises `CalibrationError` with the fix."""
    if text is None or not text.strip():
        return empty_cache()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CalibrationError(
            f"{path} is not valid JSON ({exc}). Fix it or delete it (the next launch recalibrates)."
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise CalibrationError(f"{path} has no 'entries' mapping. Fix it or delete it (the next launch recalibrates).")
    if data.get("format") != CACHE_FORMAT:
        raise CalibrationError(
            f"{path} has format {data.get('format')!r}; this collection reads format {CACHE_FORMAT}. "
            "Move it aside (the next launch recalibrates)."
        )
    return data


def dump_cache(cache: Mapping[str, Any]) -> str:
    return json.dumps(cache, indent=1, sort_keys=True) + "\n"


def lookup(cache: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    entry = cache.get("entries", {}).get(key)
    return dict(entry) if isinstance(entry, Mapping) else None


def record(cache: Mapping[str, Any], key: str, parts: Mapping[str, Any], values: Mapping[str, Any],
           recorded_at: str) -> dict[str, Any]:
    """A copy of the cache with values merged into the entry of key (created with its parts when new)."""
    updated = copy.deepcopy(dict(cache))
    entries = updated.setdefault("entries", {})
    entry = dict(entries.get(key) or {})
    entry.update(copy.deepcopy(dict(values)))
    entry["parts"] = copy.deepcopy(dict(parts))
    entry["recorded_at"] = recorded_at
    entries[key] = entry
    return updated


def merge(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """Both records' entries: an entry in one only is kept; of an entry in both, the one recorded later (ties keep
    ``mine``). Neither input is changed."""
    merged = copy.deepcopy(dict(mine))
    entries = merged.setdefault("entries", {})
    for key, entry in (theirs.get("entries") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        current = entries.get(key)
        if not isinstance(current, Mapping) or str(entry.get("recorded_at") or "") > str(current.get("recorded_at") or ""):
            entries[key] = copy.deepcopy(dict(entry))
    return merged


def same_values(entry: Mapping[str, Any] | None, values: Mapping[str, Any]) -> bool:
    """Would recording values leave the entry as it is (apart from its time)?"""
    if entry is None:
        return False
    return all(entry.get(name) == value for name, value in values.items())


# --------------------------------------------------------------------------------------------- choice

def choose(
    reports: Mapping[str, Mapping[str, Any]],
    policy: str = "requested",
    margin_bytes: int = 0,
) -> dict[str, Any]:
    """The KV budget for the cluster from each node's `vllm_kv_estimate_info` result.

    GPU engines: every node must show its ranks' ``--kv-cache-memory=`` suggestions; the minimum across all
    ranks of the policy's field, minus the margin (``source: suggestion``). CPU engines print no suggestion:
    when no node has one and every node auto-sized its KV cache (``Auto set (X/Y) GiB``: vLLM's estimate of
    what fits into the requested memory), the smallest X (GiB, as logged with two decimals) is used
    (``source: cpu_auto``). Anything else raises `CalibrationError` naming the nodes and what they showed.
    """
    if not reports:
        raise CalibrationError("no node reports to calibrate from")
    if policy not in POLICIES:
        raise CalibrationError(f"unknown KV policy {policy!r}: use one of {', '.join(POLICIES)}")
    if margin_bytes < 0:
        raise CalibrationError(f"the KV safety margin must be >= 0 bytes, got {margin_bytes}")
    with_suggestions = {node: r for node, r in reports.items() if r.get("suggestions")}
    if with_suggestions:
        missing = sorted(set(reports) - set(with_suggestions))
        if missing:
            raise CalibrationError(
                "no --kv-cache-memory= suggestion from " + ", ".join(_describe(n, reports[n]) for n in missing)
                + ": every rank must finish memory profiling before the cluster's minimum is known"
            )
        suggestions = [
            KvSuggestion(int(s["requested_limit_bytes"]), int(s["gpu_limit_bytes"]), int(s.get("rank", 0)), node)
            for node, report in with_suggestions.items() for s in report["suggestions"]
        ]
        try:
            value = choose_kv_bytes(suggestions, policy, margin_bytes)
        except KvChoiceError as exc:
            raise CalibrationError(str(exc)) from exc
        field = "requested_limit_bytes" if policy == "requested" else "gpu_limit_bytes"
        per_node = {node: min(getattr(s, field) for s in suggestions if s.node == node) for node in reports}
        return {"kv_cache_memory_bytes": value, "source": "suggestion", "policy": policy,
                "margin_bytes": margin_bytes, "per_node": per_node}
    autos = {node: r.get("cpu_kv_cache") for node, r in reports.items()}
    if all(isinstance(a, Mapping) and a.get("mode") == "auto" for a in autos.values()):
        per_node = {node: int(float(a["kv_gib"]) * GIB) for node, a in autos.items()}  # type: ignore[index]
        value = min(per_node.values()) - margin_bytes
        if value <= 0:
            raise CalibrationError(
                f"no KV budget left: the smallest auto-sized KV cache is {min(per_node.values())} bytes and the "
                f"margin is {margin_bytes} bytes"
            )
        return {"kv_cache_memory_bytes": value, "source": "cpu_auto", "policy": policy,
                "margin_bytes": margin_bytes, "per_node": per_node}
    raise CalibrationError(
        "no KV estimate in the logs of " + ", ".join(_describe(n, r) for n, r in sorted(reports.items()))
        + ". vLLM prints it only when --kv-cache-memory-bytes is unset (GPU: the `--kv-cache-memory=` "
        "suggestion after memory profiling; CPU: `Auto set (...) GiB for KV cache`)"
    )


def _describe(node: str, report: Mapping[str, Any]) -> str:
    what = f"phase {report.get('phase', '?')}"
    cpu = report.get("cpu_kv_cache")
    if isinstance(cpu, Mapping):
        what += f", CPU KV {cpu.get('mode')} {cpu.get('kv_gib')} GiB"
    if report.get("engine_error"):
        what += f", engine error: {report['engine_error']}"
    return f"{node} ({what})"
