# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the KV calibration key, cache file and choice (_kv_calibration)."""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import (
    CACHE_FORMAT,
    GIB,
    KEY_FLAGS,
    CalibrationError,
    block_size,
    cache_key,
    choose,
    dump_cache,
    empty_cache,
    flag_values,
    key_parts,
    load_cache,
    lookup,
    record,
    round_down_to_block,
    same_values,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import parse_log
from helpers.fixtures import read_log


COMMAND = [
    "/var/tmp/models/m", "--served-model-name", "glm", "--tensor-parallel-size", "2",
    "--gpu-memory-utilization", "0.85", "--max-model-len", "262144", "--block-size", "2304",
    "--kv-cache-dtype", "fp8_e4m3", "--enforce-eager", "--speculative-config",
    '{"method":"mtp","num_speculative_tokens":4}', "--kv-cache-memory-bytes", "45000000000",
]
GB10 = {"gpu_name": "NVIDIA GB10", "driver": "580.95.05", "gpu_memory": "[N/A]", "mem_total_bytes": 128526278656}
NODES = [
    {"name": "spark-a", "image_id": "sha256:aaa", "hardware": dict(GB10)},
    {"name": "spark-b", "image_id": "sha256:aaa", "hardware": dict(GB10)},
]


def _parts(command: list[str] | None = None, nodes: list[dict[str, Any]] | None = None,
           revision: str = "c0ffee") -> dict[str, Any]:
    return key_parts(command or COMMAND, "/var/tmp/models/m", revision, nodes or copy.deepcopy(NODES))


def _log(name: str) -> dict[str, Any]:
    return parse_log(read_log(name)).as_dict()


# ------------------------------------------------------------------------------------------------ flags

def test_flag_values_reads_spaced_equals_and_bare_flags() -> None:
    flags = flag_values(["model", "--a", "1", "--b=x=y", "--bare", "--c", "2", "--last"])
    assert flags == {"--a": "1", "--b": "x=y", "--bare": True, "--c": "2", "--last": True}


def test_block_size_from_command_or_default() -> None:
    assert block_size(COMMAND) == 2304
    assert block_size(["m", "--max-model-len", "10"]) == 16
    assert block_size(["m"], default=128) == 128
    with pytest.raises(CalibrationError, match="integer"):
        block_size(["m", "--block-size", "big"])
    with pytest.raises(CalibrationError, match="positive"):
        block_size(["m", "--block-size", "0"])


@pytest.mark.parametrize(("length", "block", "expected"), [
    (1920, 16, 1920), (1927, 16, 1920), (131071, 2304, 129024), (15, 16, 0), (2304, 2304, 2304),
])
def test_round_down_to_block(length: int, block: int, expected: int) -> None:
    assert round_down_to_block(length, block) == expected


def test_round_down_refuses_nonsense() -> None:
    with pytest.raises(CalibrationError):
        round_down_to_block(100, 0)
    with pytest.raises(CalibrationError):
        round_down_to_block(-1, 16)


# -------------------------------------------------------------------------------------------------- key

def test_key_parts_take_the_memory_flags_and_never_the_kv_bytes() -> None:
    parts = _parts()
    assert set(parts["flags"]) == set(KEY_FLAGS)
    assert parts["flags"]["--max-model-len"] == "262144"
    assert parts["flags"]["--enforce-eager"] is True
    assert parts["flags"]["--moe-backend"] is None
    assert "--kv-cache-memory-bytes" not in parts["flags"]
    assert [n["name"] for n in parts["nodes"]] == ["spark-a", "spark-b"]
    # the KV byte value does not change the key: a calibrated relaunch looks itself up under the same key
    without_kv = COMMAND[:-2]
    assert cache_key(_parts(without_kv)) == cache_key(parts)


def test_key_is_stable_across_calls_and_dict_order() -> None:
    reordered = [{"hardware": dict(reversed(list(GB10.items()))), "image_id": "sha256:aaa", "name": n}
                 for n in ("spark-a", "spark-b")]
    assert cache_key(_parts()) == cache_key(_parts(nodes=reordered))
    assert len(cache_key(_parts())) == 20


@pytest.mark.parametrize("change", [
    "max_model_len", "gpu_memory_utilization", "kv_dtype", "image", "revision", "gpu_name", "driver",
    "mem_total", "enforce_eager_removed", "tp",
])
def test_every_key_part_changes_the_key(change: str) -> None:
    command = list(COMMAND)
    nodes = copy.deepcopy(NODES)
    revision = "c0ffee"
    if change == "max_model_len":
        command[command.index("--max-model-len") + 1] = "131072"
    elif change == "gpu_memory_utilization":
        command[command.index("--gpu-memory-utilization") + 1] = "0.80"
    elif change == "kv_dtype":
        command[command.index("--kv-cache-dtype") + 1] = "auto"
    elif change == "image":
        nodes[1]["image_id"] = "sha256:bbb"
    elif change == "revision":
        revision = "deadbeef"
    elif change == "gpu_name":
        nodes[0]["hardware"]["gpu_name"] = "NVIDIA H100"
    elif change == "driver":
        nodes[1]["hardware"]["driver"] = "590.10"
    elif change == "mem_total":
        nodes[0]["hardware"]["mem_total_bytes"] = 64 * GIB
    elif change == "enforce_eager_removed":
        command.remove("--enforce-eager")
    elif change == "tp":
        command[command.index("--tensor-parallel-size") + 1] = "4"
    assert cache_key(_parts(command, nodes, revision)) != cache_key(_parts())


def test_node_order_is_part_of_the_key() -> None:
    nodes = copy.deepcopy(NODES)
    nodes[1]["hardware"]["driver"] = "other"
    assert cache_key(_parts(nodes=nodes)) != cache_key(_parts(nodes=list(reversed(nodes))))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model_path": ""}, "model_path"),
    ({"model_revision": ""}, "model_revision"),
    ({"nodes": []}, "every node"),
    ({"nodes": [{"name": "a", "image_id": "", "hardware": GB10}]}, "not on that node"),
    ({"nodes": [{"name": "", "image_id": "x", "hardware": GB10}]}, "needs a name"),
    ({"nodes": [{"name": "a", "image_id": "x", "hardware": "GB10"}]}, "hardware must be a mapping"),
    ({"nodes": [{"name": "a", "image_id": "x", "hardware": {"gpu_name": "x"}}]}, "mem_total_bytes"),
])
def test_key_parts_refuse_missing_inputs(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"command": COMMAND, "model_path": "/m", "model_revision": "c", "nodes": NODES}
    args.update(kwargs)
    with pytest.raises(CalibrationError, match=message):
        key_parts(**args)


# ------------------------------------------------------------------------------------------------ cache

def test_empty_and_blank_files_are_empty_caches() -> None:
    assert load_cache(None) == empty_cache()
    assert load_cache("  \n") == {"format": CACHE_FORMAT, "entries": {}}


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not valid JSON"),
    ("[]", "no 'entries'"),
    ('{"format": 1}', "no 'entries'"),
    ('{"format": 99, "entries": {}}', "format 99"),
])
def test_bad_files_are_refused_with_the_fix(text: str, message: str) -> None:
    with pytest.raises(CalibrationError, match=message) as info:
        load_cache(text, "/inv/kv.json")
    assert "/inv/kv.json" in str(info.value)


def test_record_then_lookup_round_trips_through_json() -> None:
    parts = _parts()
    key = cache_key(parts)
    cache = record(empty_cache(), key, parts, {"kv_cache_memory_bytes": 123, "source": "suggestion"}, "T1")
    again = load_cache(dump_cache(cache))
    entry = lookup(again, key)
    assert entry is not None
    assert entry["kv_cache_memory_bytes"] == 123
    assert entry["parts"] == json.loads(json.dumps(parts))
    assert entry["recorded_at"] == "T1"
    assert lookup(again, "0" * 20) is None


def test_record_merges_into_an_entry_and_leaves_the_input_alone() -> None:
    parts = _parts()
    key = cache_key(parts)
    first = record(empty_cache(), key, parts, {"estimated_max_model_len": 1920}, "T1")
    snapshot = copy.deepcopy(first)
    second = record(first, key, parts, {"kv_cache_memory_bytes": 5}, "T2")
    assert first == snapshot
    entry = lookup(second, key)
    assert entry is not None
    assert (entry["estimated_max_model_len"], entry["kv_cache_memory_bytes"], entry["recorded_at"]) == (1920, 5, "T2")


def test_same_values() -> None:
    assert not same_values(None, {"a": 1})
    assert same_values({"a": 1, "b": 2}, {"a": 1})
    assert not same_values({"a": 1}, {"a": 2})


# ----------------------------------------------------------------------------------------------- choice

def _gpu(*pairs: tuple[int, int], rank0: int = 0) -> dict[str, Any]:
    return {"phase": "api_up", "cpu_kv_cache": None, "engine_error": None, "suggestions": [
        {"requested_limit_bytes": r, "gpu_limit_bytes": g, "rank": rank0 + i} for i, (r, g) in enumerate(pairs)]}


def test_gpu_choice_is_the_minimum_across_every_rank_of_every_node() -> None:
    reports = {"spark-a": _gpu((50, 90)), "spark-b": _gpu((45, 95), rank0=1)}
    chosen = choose(reports)
    assert chosen == {"kv_cache_memory_bytes": 45, "source": "suggestion", "policy": "requested",
                      "margin_bytes": 0, "per_node": {"spark-a": 50, "spark-b": 45}}
    full = choose(reports, "full", 10)
    assert (full["kv_cache_memory_bytes"], full["per_node"]) == (80, {"spark-a": 90, "spark-b": 95})


def test_gpu_choice_needs_every_node() -> None:
    reports = {"spark-a": _gpu((50, 90)), "spark-b": {"phase": "weights_loaded", "suggestions": [],
                                                      "engine_error": "worker died"}}
    with pytest.raises(CalibrationError, match=r"spark-b \(phase weights_loaded, engine error: worker died\)"):
        choose(reports)


def test_choice_refuses_bad_policy_margin_and_an_empty_budget() -> None:
    reports = {"a": _gpu((50, 90))}
    with pytest.raises(CalibrationError, match="unknown KV policy"):
        choose(reports, "most")
    with pytest.raises(CalibrationError, match=">= 0"):
        choose(reports, margin_bytes=-1)
    with pytest.raises(CalibrationError, match="no KV budget left"):
        choose(reports, margin_bytes=50)
    with pytest.raises(CalibrationError, match="no node reports"):
        choose({})


def test_gpu_choice_from_format_fixture_logs() -> None:
    """Two ranks on one node whose suggestions disagree: the smaller requested value wins."""
    report = _log("fmt_gpu_single_node_tp2_ready.log")
    assert choose({"spark-a": report})["kv_cache_memory_bytes"] == 56132132454


def _cpu(mode: str, gib: float) -> dict[str, Any]:
    return {"phase": "api_up", "suggestions": [], "engine_error": None,
            "cpu_kv_cache": {"kv_gib": gib, "total_gib": 23.4, "mode": mode, "numa_node": 0}}


def test_cpu_auto_sized_kv_is_the_estimate_when_no_node_has_a_suggestion() -> None:
    chosen = choose({"head": _cpu("auto", 1.84), "worker": _cpu("auto", 1.9)}, margin_bytes=1024)
    assert chosen["source"] == "cpu_auto"
    assert chosen["per_node"] == {"head": int(1.84 * GIB), "worker": int(1.9 * GIB)}
    assert chosen["kv_cache_memory_bytes"] == int(1.84 * GIB) - 1024


@pytest.mark.parametrize("reports", [
    {"head": _cpu("explicit", 1.0), "worker": _cpu("explicit", 1.0)},
    {"head": _cpu("auto", 1.0), "worker": _cpu("explicit", 1.0)},
    {"head": _cpu("auto", 1.0), "worker": {"phase": "rendezvous", "suggestions": [], "cpu_kv_cache": None}},
])
def test_no_estimate_without_suggestions_or_auto_sizing_everywhere(reports: dict[str, Any]) -> None:
    with pytest.raises(CalibrationError, match="no KV estimate in the logs of"):
        choose(reports)


def test_explicitly_set_cpu_kv_from_a_format_fixture_is_no_estimate() -> None:
    with pytest.raises(CalibrationError, match="CPU KV explicit 1.0 GiB"):
        choose({"head": _log("fmt_cpu_head_ready.log")})


# ------------------------------------------------------------------------------- captured from the lab

def test_lab_calibration_takes_the_auto_sized_kv_of_both_real_ranks() -> None:
    chosen = choose({"lab-head": _log("lab_cpu_tp2_head_auto_kv.log.gz"),
                     "lab-worker": _log("lab_cpu_tp2_worker_auto_kv.log.gz")})
    assert chosen["source"] == "cpu_auto"
    assert chosen["per_node"] == {"lab-head": int(1.21 * GIB), "lab-worker": int(1.21 * GIB)}
    assert chosen["kv_cache_memory_bytes"] == int(1.21 * GIB)


def test_lab_ready_logs_with_an_explicit_kv_size_give_no_estimate() -> None:
    with pytest.raises(CalibrationError, match=r"lab-head \(phase api_up, CPU KV explicit 1.0 GiB\)"):
        choose({"lab-head": _log("lab_cpu_tp2_head_ready.log.gz"),
                "lab-worker": _log("lab_cpu_tp2_worker_ready.log.gz")})


def test_lab_estimated_max_model_len_rounds_to_the_cpu_block_size() -> None:
    report = _log("lab_cpu_tp2_head_estimated_max_len.log.gz")
    assert report["estimated_max_model_len"] == 1048448
    assert round_down_to_block(report["estimated_max_model_len"], 128) == 1048448
    assert round_down_to_block(report["estimated_max_model_len"], 2304) == 1048320


def test_four_nodes_the_smallest_of_every_rank_counts_and_a_silent_rank_is_named() -> None:
    """TP=4 over four Sparks: one rank per node; the budget is the minimum over the four, the per-node record
    names all four; a rank that never reported stops the calibration with its name."""
    reports = {"spark-a": _gpu((50, 90)), "spark-b": _gpu((47, 91), rank0=1), "spark-c": _gpu((44, 92), rank0=2),
               "spark-d": _gpu((49, 89), rank0=3)}
    chosen = choose(reports)
    assert chosen["kv_cache_memory_bytes"] == 44
    assert chosen["per_node"] == {"spark-a": 50, "spark-b": 47, "spark-c": 44, "spark-d": 49}
    assert choose(reports, "full")["kv_cache_memory_bytes"] == 89
    cpu = {name: _cpu("auto", gib) for name, gib in zip(reports, (1.3, 1.25, 1.2, 1.28))}
    assert choose(cpu)["kv_cache_memory_bytes"] == int(1.2 * (1 << 30))
    reports["spark-c"] = {"phase": "weights_loaded", "suggestions": [], "engine_error": None}
    with pytest.raises(CalibrationError, match=r"spark-c \(phase weights_loaded"):
        choose(reports)


def test_merge_keeps_every_entry_and_the_later_of_two() -> None:
    from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import merge
    mine = {"format": 1, "entries": {"a": {"v": 1, "recorded_at": "2026-12-02T00:00:00Z"},
                                     "b": {"v": 2, "recorded_at": "2026-12-01T00:00:00Z"}}}
    theirs = {"format": 1, "entries": {"a": {"v": 3, "recorded_at": "2026-12-01T00:00:00Z"},
                                       "b": {"v": 4, "recorded_at": "2026-12-02T00:00:00Z"},
                                       "c": {"v": 5, "recorded_at": "2026-12-01T00:00:00Z"}, "bad": "x"}}
    merged = merge(mine, theirs)
    assert {key: entry["v"] for key, entry in merged["entries"].items()} == {"a": 1, "b": 4, "c": 5}
    assert mine["entries"]["b"]["v"] == 2 and "c" not in mine["entries"]   # the inputs are left as they were
    same = {"format": 1, "entries": {"a": {"v": 9, "recorded_at": "2026-12-02T00:00:00Z"}}}
    assert merge(mine, same)["entries"]["a"]["v"] == 1                       # a tie keeps mine
