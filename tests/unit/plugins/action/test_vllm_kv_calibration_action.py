# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_kv_calibration action plugin gives the module's result, in the controller's process."""
from __future__ import annotations

import json
import os
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.vllm_kv_calibration import ActionModule
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_kv_calibration
from helpers.action_runner import run_action
from helpers.calibration import AUTO, BASE
from helpers.module_runner import run_module


def _action(args: dict[str, Any], check_mode: bool = False, diff: bool = False) -> dict[str, Any]:
    return run_action(ActionModule, args, check_mode=check_mode, diff=diff)


def test_lookup_record_lookup_in_process_same_as_the_module(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    assert _action(dict(BASE, path=path))["found"] is False
    recorded = _action(dict(BASE, path=path, state="record", reports=AUTO))
    assert recorded["changed"] is True and recorded["kv_cache_memory_bytes"] == int(1.25 * (1 << 30))
    with open(path, encoding="utf-8") as handle:
        assert json.load(handle)["entries"][recorded["key"]]["kv_cache_memory_bytes"] == recorded["kv_cache_memory_bytes"]
    looked_up = _action(dict(BASE, path=path))
    by_module = run_module(vllm_kv_calibration.main, dict(BASE, path=path))
    for field in ("found", "key", "parts", "entry", "kv_cache_memory_bytes", "block_size", "max_model_len_fit"):
        assert looked_up[field] == by_module[field], field


def test_check_mode_records_nothing_and_diff_shows_the_entry(tmp_path: Any) -> None:
    path = str(tmp_path / "kv.json")
    result = _action(dict(BASE, path=path, state="record", estimated_max_model_len=2048), check_mode=True, diff=True)
    assert result["changed"] is True and "2048" in result["diff"]["after"]
    assert not os.path.exists(path)


@pytest.mark.parametrize("args, message", [
    ({"state": "record"}, "state is record but any of the following are missing: reports, estimated_max_model_len"),
    ({"state": "sideways"}, "value of state must be one of"),
    ({"reports": AUTO, "estimated_max_model_len": 5}, "mutually exclusive"),
])
def test_bad_arguments_fail_before_anything_is_read(tmp_path: Any, args: dict[str, Any], message: str) -> None:
    # the task executor reports AnsibleActionFail as the task's failure, with this message
    with pytest.raises(AnsibleActionFail, match=message):
        _action(dict(BASE, path=str(tmp_path / "kv.json"), **args))
    assert not os.path.exists(tmp_path / "kv.json")


def test_a_missing_directory_fails_with_the_fix(tmp_path: Any) -> None:
    result = _action(dict(BASE, path=str(tmp_path / "nowhere" / "kv.json")))
    assert result["failed"] is True and "launch_kv_calibration_file" in result["msg"]


def test_two_runs_recording_at_once_keep_both_entries(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of two clusters share the controller's record: the second waits for the first's read-and-write, so
    neither entry is lost. The first run stops right after its read until the test lets it go: without the lock
    the second run reads, writes and finishes meanwhile, and the first then writes over its entry."""
    import threading

    from ansible_collections.dgxspark.vllm.plugins.module_utils import _kv_calibration_task as task

    path = str(tmp_path / "kv.json")
    first_read, go = threading.Event(), threading.Event()
    real_read = task.read_text

    def read_then_wait(name: str) -> str | None:
        text = real_read(name)
        if threading.current_thread().name == "cluster-a":
            first_read.set()
            assert go.wait(30), "the test never let the first run go"
        return text

    monkeypatch.setattr(task, "read_text", read_then_wait)
    cluster_b = dict(BASE, model_path="/other", command=["/other", "--max-model-len", "4096"])
    results: dict[str, Any] = {}

    def record(name: str, args: dict[str, Any]) -> None:
        results[name] = task.run(dict(args, path=path, state="record", estimated_max_model_len=2048,
                                      reports=None, policy="min", margin_bytes=0, default_block_size=16),
                                 check_mode=False, diff=False)

    a = threading.Thread(target=record, args=("a", BASE), name="cluster-a")
    b = threading.Thread(target=record, args=("b", cluster_b), name="cluster-b")
    a.start()
    assert first_read.wait(30)
    b.start()
    b.join(2)            # with the lock, b is still waiting for a here
    b_waited = b.is_alive()
    go.set()
    a.join(30)
    b.join(30)
    with open(path, encoding="utf-8") as handle:
        entries = json.load(handle)["entries"]
    assert b_waited and set(entries) == {results["a"]["key"], results["b"]["key"]}
