# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch_plan action plugin: renders and plans on the controller, reads the KV record and writes it when a
step measured something (never in check mode), and fails with the fix for what it cannot plan from."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.launch_plan import ActionModule
from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import GIB, dump_cache, load_cache
from ansible_collections.dgxspark.vllm.plugins.modules import launch_plan
from helpers.action_runner import run_action
from helpers.launch import HEAD, SERVED_METRICS, WORKER, answered, config, good_start, node_state, nodes, running
from helpers.module_runner import ModuleFail, run_module

AUTO = ("lab_cpu_tp2_head_auto_kv.log.gz", "lab_cpu_tp2_worker_auto_kv.log.gz")
READY = ("lab_cpu_tp2_head_ready.log.gz", "lab_cpu_tp2_worker_ready.log.gz")
BUDGET = int(1.21 * GIB)


def _args(path: Any, **extra: Any) -> dict[str, Any]:
    """The task's arguments as plan.yml passes them (JSON only, as templated variables are)."""
    calibration = dict({"path": str(path)} if path is not None else {}, **extra.pop("calibration", {}))
    args = {"config": config(**extra.pop("settings", {})), "nodes": extra.pop("nodes", None) or nodes(),
            "calibration": calibration, **extra}
    return json.loads(json.dumps(args))


def _action(args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    return run_action(ActionModule, args, check_mode=check_mode)


def _after(result: dict[str, Any], path: Any, observed: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The arguments of the call after a start (previous: the last result's state)."""
    return _args(path, previous=result["state"], observed=observed, **extra)


def _record(path: Path) -> dict[str, Any]:
    return load_cache(path.read_text(encoding="utf-8"), str(path))


def test_a_calibration_is_written_to_the_record_once_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "dgxspark-kv-calibration.json"
    first = _action(_args(path))
    assert (first["step"], first["changed"], first["attempt"]) == ("calibrate", False, 1)
    assert not path.exists()        # a missing record is an empty one; nothing is written before a measurement
    calibrated = _action(_after(first, path, good_start(*AUTO)))
    assert (calibrated["step"], calibrated["changed"], calibrated["kv"]["bytes"]) == ("start", True, BUDGET)
    entry = _record(path)["entries"][first["kv"]["key"]]
    assert (entry["kv_cache_memory_bytes"], entry["source"]) == (BUDGET, "cpu_auto")
    done = _action(_after(calibrated, path, good_start(*READY)))
    assert (done["step"], done["changed"]) == ("done", False)
    assert done["message"].startswith(f"KV cache: {BUDGET} bytes (calibrated now (cpu_auto")
    # the next launch: the record gives the budget, and the group already runs it
    again = _action(_args(path, nodes=running(calibrated["specs"])))
    assert (again["step"], again["changed"], again["kv"]["source"]) == ("nothing", False, "cache")
    assert again["kv"]["text"].startswith(f"recorded {entry['recorded_at']} in {path} for key ")


def test_check_mode_plans_the_same_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    first = _action(_args(path), check_mode=True)
    result = _action(_after(first, path, good_start(*AUTO)), check_mode=True)
    assert (result["step"], result["changed"], result["kv"]["bytes"]) == ("start", True, BUDGET)
    assert not path.exists()


def test_an_existing_record_is_kept_and_merged(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    other = {"format": 1, "entries": {"0" * 20: {"kv_cache_memory_bytes": 5, "recorded_at": "T", "parts": {}}}}
    path.write_text(dump_cache(other), encoding="utf-8")
    first = _action(_args(path))
    _action(_after(first, path, good_start(*AUTO)))
    assert set(_record(path)["entries"]) == {"0" * 20, first["kv"]["key"]}


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ('{"format": 1}', "has no 'entries' mapping. Fix it or delete it (the next launch recalibrates)."),
    ('{"format": 99, "entries": {}}', "has format 99; this collection reads format 1. Move it aside"),
])
def test_a_bad_record_fails_with_the_fix_and_is_left_alone(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kv.json"
    path.write_text(text, encoding="utf-8")
    result = _action(_args(path))
    assert result["failed"] is True
    assert result["msg"].startswith(f"the launch cannot be planned: {path} ")
    assert message in result["msg"]
    assert path.read_text(encoding="utf-8") == text


def test_an_unreadable_record_fails_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.mkdir()
    result = _action(_args(path))
    assert result["failed"] is True and str(path) in result["msg"]


def test_a_record_in_a_missing_directory_fails_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "missing-directory" / "kv.json"
    result = _action(_args(path))
    assert result["failed"] is True
    assert result["msg"] == (f"the directory of the KV calibration file {path} does not exist: create it or set "
                             "launch_kv_calibration_file to a path in an existing directory")


def test_calibration_needs_the_record_path() -> None:
    result = _action(_args(None))
    assert result["failed"] is True
    assert result["msg"] == "calibration.path is required when calibration.enabled is true"


def test_without_calibration_no_record_is_read_or_needed(tmp_path: Path) -> None:
    result = _action(_args(None, calibration={"enabled": False}))
    assert (result["step"], result["changed"], result["kv"]["source"]) == ("start", False, "off")
    path = tmp_path / "kv.json"
    path.write_text("{not json", encoding="utf-8")   # not read at all
    assert _action(_args(path, calibration={"enabled": False}))["step"] == "start"


def test_a_node_left_out_of_the_play_fails_the_plan(tmp_path: Path) -> None:
    # a --limit that leaves the worker out: its state was never read
    result = _action(_args(tmp_path / "kv.json", nodes={HEAD: node_state(HEAD)}))
    assert result["failed"] is True
    assert result["msg"] == (f"the launch cannot be planned: the launch needs every node of the cluster in this play "
                             f"(missing: {WORKER}): a --limit that selects a cluster selects all of it")


def test_a_node_state_read_without_its_name_fails_the_plan(tmp_path: Path) -> None:
    unnamed = {k: v for k, v in node_state(WORKER).items() if k not in ("node", "identity")}
    result = _action(_args(tmp_path / "kv.json", nodes={HEAD: node_state(HEAD), WORKER: unnamed}))
    assert result["failed"] is True
    assert result["msg"] == (f"the launch cannot be planned: no node state for {WORKER}: read every node with "
                             "dgxspark.vllm.vllm_node_state (name given) before the plan")


def test_a_node_without_the_image_is_a_fail_step_not_a_failed_task(tmp_path: Path) -> None:
    # the render entry point (status) still gets every node's container; the launch fails on the step itself
    result = _action(_args(tmp_path / "kv.json", nodes={HEAD: node_state(HEAD), WORKER: node_state(WORKER, image_id=None)}))
    assert "failed" not in result
    assert (result["step"], set(result["specs"])) == ("fail", {HEAD, WORKER})
    assert result["message"] == (f"The launch cannot start: node '{WORKER}': image_id is empty: the serve image is not "
                                 "on that node (stage it first: --tags image).")


def test_a_bad_profile_fails_the_plan(tmp_path: Path) -> None:
    args = _args(tmp_path / "kv.json")
    args["config"]["profile"] = {"name": "broken"}
    result = _action(args)
    assert result["failed"] is True and result["msg"].startswith("the launch cannot be planned: profile broken: ")


def test_the_api_key_is_named_never_returned(tmp_path: Path) -> None:
    result = _action(_args(tmp_path / "kv.json", api_key="lab-key-123"))
    assert "lab-key-123" not in json.dumps(result)
    assert result["specs"][HEAD]["secret_env"] == ["VLLM_API_KEY"]


def test_bad_arguments_fail_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match="value of policy must be one of: requested, full"):
        _action(_args(tmp_path / "kv.json", calibration={"policy": "most"}))
    assert not os.path.exists(tmp_path / "kv.json")


def test_the_module_itself_refuses_to_run_on_a_node() -> None:
    with pytest.raises(ModuleFail) as info:
        run_module(launch_plan.main, {"config": {}, "nodes": {}})
    assert "runs on the controller through its action plugin" in info.value.result["msg"]


def test_a_second_controller_finds_the_budget_in_the_heads_copy_and_keeps_it(tmp_path: Path) -> None:
    """The first controller calibrates; its record goes to the head. A second controller (an empty record of its
    own) finds the budget there: the group running it starts nothing, and its own record gets the head's entries."""
    first_path = tmp_path / "first" / "kv.json"
    first_path.parent.mkdir()
    first = _action(_args(first_path, calibration={"head_record": ""}))
    assert first["kv_record"] == {"text": dump_cache({"format": 1, "entries": {}}), "head_differs": False}
    calibrated = _action(_after(first, first_path, good_start(*AUTO), calibration={"head_record": ""}))
    assert calibrated["kv_record"]["head_differs"] is True            # the head must be written: the launch does it
    head_text = calibrated["kv_record"]["text"]
    assert load_cache(head_text)["entries"] == _record(first_path)["entries"]
    second_path = tmp_path / "second" / "kv.json"
    second_path.parent.mkdir()
    again = _action(_args(second_path, nodes=running(calibrated["specs"]), calibration={"head_record": head_text}))
    assert (again["step"], again["kv"]["source"], again["kv"]["bytes"]) == ("nothing", "cache", BUDGET)
    assert again["changed"] is True and _record(second_path) == load_cache(head_text)
    assert again["kv_record"]["head_differs"] is False
    # without the head's copy the second controller would calibrate again (a restart of the serving group)
    third_path = tmp_path / "third" / "kv.json"
    third_path.parent.mkdir()
    alone = _action(_args(third_path, nodes=running(calibrated["specs"]), calibration={"head_record": ""}))
    assert alone["step"] == "calibrate"


def test_of_an_entry_in_both_copies_the_later_one_wins_and_the_head_learns_the_controllers(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    key_a, key_b = "a" * 20, "b" * 20
    mine = {"format": 1, "entries": {key_a: {"kv_cache_memory_bytes": 1, "recorded_at": "2026-12-01T00:00:00Z"},
                                     key_b: {"kv_cache_memory_bytes": 2, "recorded_at": "2026-12-03T00:00:00Z"}}}
    head = {"format": 1, "entries": {key_a: {"kv_cache_memory_bytes": 3, "recorded_at": "2026-12-02T00:00:00Z"}}}
    path.write_text(dump_cache(mine), encoding="utf-8")
    result = _action(_args(path, calibration={"head_record": dump_cache(head)}))
    entries = _record(path)["entries"]
    assert (entries[key_a]["kv_cache_memory_bytes"], entries[key_b]["kv_cache_memory_bytes"]) == (3, 2)
    assert result["kv_record"]["head_differs"] is True                 # key_b is not on the head yet
    checked = _action(_args(path, calibration={"head_record": dump_cache(head)}), check_mode=True)
    assert checked["kv_record"]["head_differs"] is True


def test_a_bad_head_copy_fails_naming_it_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    result = _action(_args(path, calibration={"head_record": "{not json", "head_path": "spark-a:/var/lib/x.json"}))
    assert result["failed"] is True
    assert "spark-a:/var/lib/x.json is not valid JSON" in result["msg"]
    assert not path.exists()


def test_in_check_mode_the_heads_entries_are_used_but_not_written(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    first = _action(_args(tmp_path / "calibrating.json"))
    calibrated = _action(_after(first, tmp_path / "calibrating.json", good_start(*AUTO)))
    head_text = (tmp_path / "calibrating.json").read_text(encoding="utf-8")
    result = _action(_args(path, nodes=running(calibrated["specs"]), calibration={"head_record": head_text}),
                     check_mode=True)
    assert (result["step"], result["kv"]["source"]) == ("nothing", "cache")
    assert not path.exists()


def test_only_a_group_found_serving_with_the_heads_record_complete_leaves_run_plan_out(tmp_path: Path) -> None:
    """carry_out: false only when the first plan is `done` (found serving its render, answering everywhere), the head's
    copy of the KV record holds every entry and it is not check mode; playbooks/launch.yml then reports and skips
    run_plan."""
    path = tmp_path / "kv.json"
    first = _action(_args(path, calibration={"head_record": ""}))
    assert (first["step"], first["carry_out"]) == ("calibrate", True)
    calibrated = _action(_after(first, path, good_start(*AUTO), calibration={"head_record": ""}))
    head_text = calibrated["kv_record"]["text"]
    # the start's last plan is made inside run_plan, which reports it: never a second report by the caller
    started = _action(_after(calibrated, path, good_start(*READY), calibration={"head_record": head_text}))
    assert (started["step"], started["kv_record"]["head_differs"], started["carry_out"]) == ("done", False, True)
    serving = answered(running(calibrated["specs"]), SERVED_METRICS)
    done = _action(_args(path, nodes=serving, calibration={"head_record": head_text}))
    assert (done["step"], done["kv_record"]["head_differs"], done["carry_out"]) == ("done", False, False)
    # the head lacks the record: run_plan writes it there
    behind = _action(_args(path, nodes=serving, calibration={"head_record": ""}))
    assert (behind["step"], behind["kv_record"]["head_differs"], behind["carry_out"]) == ("done", True, True)
    # check mode shows each node's docker run line
    checked = _action(_args(path, nodes=serving, calibration={"head_record": head_text}), check_mode=True)
    assert (checked["step"], checked["carry_out"]) == ("done", True)
    # not answering everywhere yet: the API check with retries is run_plan's
    waiting = _action(_args(path, nodes=running(calibrated["specs"]), calibration={"head_record": head_text}))
    assert (waiting["step"], waiting["carry_out"]) == ("nothing", True)
