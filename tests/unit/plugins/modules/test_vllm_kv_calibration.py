# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_kv_calibration module: a real file in tmp_path."""
from __future__ import annotations

import json
import os
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_kv_calibration
from helpers.calibration import AUTO, BASE, HW
from helpers.module_runner import ModuleFail, run_module


def _run(path: str, check_mode: bool = False, diff: bool = False, **extra: Any) -> dict[str, Any]:
    args = dict(BASE, path=path, **extra)
    if diff:
        args["_ansible_diff"] = True
    return run_module(vllm_kv_calibration.main, args, check_mode=check_mode)


def test_lookup_on_a_missing_file_finds_nothing_and_writes_nothing(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    result = _run(path)
    assert (result["found"], result["changed"], result["kv_cache_memory_bytes"], result["entry"]) == (False, False, None, None)
    assert not os.path.exists(path)


def test_record_writes_then_lookup_reuses_then_same_record_changes_nothing(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    first = _run(path, state="record", reports=AUTO)
    assert first["changed"] is True
    assert first["kv_cache_memory_bytes"] == int(1.25 * (1 << 30))
    assert first["chosen"]["source"] == "cpu_auto"
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    assert data["entries"][first["key"]]["kv_cache_memory_bytes"] == first["kv_cache_memory_bytes"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    again = _run(path)
    assert (again["found"], again["key"], again["kv_cache_memory_bytes"]) == (True, first["key"], first["kv_cache_memory_bytes"])
    same = _run(path, state="record", reports=AUTO)
    assert same["changed"] is False
    other = _run(path, command=["/m", "--max-model-len", "2048", "--gpu-memory-utilization", "0.1"])
    assert other["found"] is False and other["key"] != first["key"]


def test_check_mode_and_diff_show_the_record_without_writing(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    result = _run(path, check_mode=True, diff=True, state="record", reports=AUTO)
    assert result["changed"] is True
    assert '"kv_cache_memory_bytes": 1342177280' in result["diff"]["after"]
    assert not os.path.exists(path)


def test_estimated_max_model_len_is_recorded_beside_the_budget(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    result = _run(path, state="record", estimated_max_model_len=1920)
    assert (result["changed"], result["estimated_max_model_len"], result["kv_cache_memory_bytes"]) == (True, 1920, None)
    again = _run(path, default_block_size=128)
    assert (again["estimated_max_model_len"], again["block_size"], again["max_model_len_fit"]) == (1920, 128, 1920)
    blocks = _run(path, command=BASE["command"] + ["--block-size", "256"])
    assert blocks["found"] is False  # the block size is part of the key
    odd = _run(path, state="record", estimated_max_model_len=1927)
    assert (odd["max_model_len_fit"], odd["block_size"]) == (1920, 16)


@pytest.mark.parametrize(("extra", "message"), [
    ({"state": "record"}, "state is record but any of the following are missing"),
    ({"state": "record", "estimated_max_model_len": 0}, "must be positive"),
    ({"state": "record", "reports": {"head": {"suggestions": [], "cpu_kv_cache": None}}}, "KV calibration failed: no KV estimate"),
    ({"nodes": [{"name": "head", "image_id": "", "hardware": HW}]}, "image_id is empty"),
])
def test_bad_inputs_fail_with_a_message(tmp_path: Any, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ModuleFail, match=message):
        _run(str(tmp_path / "kv.json"), **extra)
    assert not os.path.exists(tmp_path / "kv.json")


def test_a_corrupt_file_is_refused_and_kept(tmp_path: Any) -> None:
    path = tmp_path / "kv.json"
    path.write_text("{oops", encoding="utf-8")
    with pytest.raises(ModuleFail, match="not valid JSON"):
        _run(str(path), state="record", reports=AUTO)
    assert path.read_text(encoding="utf-8") == "{oops"


def test_a_missing_directory_is_named(tmp_path: Any) -> None:
    with pytest.raises(ModuleFail, match="does not exist"):
        _run(str(tmp_path / "nope" / "kv.json"))
