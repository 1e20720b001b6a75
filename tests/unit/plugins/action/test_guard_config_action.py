# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard_config action: the document carries the install's fingerprint (the guard's files, the module_utils it
imports, the install settings), and `current` says whether the head's installed configuration is that document."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.guard_config import ActionModule
from helpers.action_runner import run_action

CONFIG = {"head": "spark1", "workers": ["spark2"], "container_name": "vllm_glm53", "port": 8000,
          "served_model_name": "glm-5", "nodes": {"spark1": {"cx7_ip": "10.77.1.11"}, "spark2": {"cx7_ip": "10.77.1.12"}}}
MODULE_UTILS = ["_guard.py", "_startup.py"]


def _run(tmp_path: Path, installed: str | None = None, **extra: Any) -> dict[str, Any]:
    program = tmp_path / "dgxspark_group_guard.py"
    if not program.exists():
        program.write_text("print('guard')\n", encoding="utf-8")
    args: dict[str, Any] = {"config": CONFIG, "payload": [str(program)], "module_utils": MODULE_UTILS,
                            "install": {"python": "/usr/bin/python3"}, **extra}
    if installed is not None:
        args["installed"] = installed
    result = run_action(ActionModule, args)
    if result.get("failed"):
        raise AnsibleActionFail(result["msg"])
    return result


def _as_written(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"   # the guard role's to_nice_json(indent=2)


def test_the_installed_document_is_current_and_any_change_is_not(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert len(first["document"]["_install"]) == 64
    assert first["current"] is False                       # nothing installed was given
    assert _run(tmp_path, _as_written(first["document"]))["current"] is True
    # the guard program changed (a collection upgrade): the fingerprint moves, the install runs
    (tmp_path / "dgxspark_group_guard.py").write_text("print('guard 2')\n", encoding="utf-8")
    second = _run(tmp_path, _as_written(first["document"]))
    assert second["current"] is False
    assert second["document"]["_install"] != first["document"]["_install"]
    # an install setting or a tunable changed
    assert _run(tmp_path, _as_written(second["document"]), install={"python": "/opt/py"})["current"] is False
    assert _run(tmp_path, _as_written(second["document"]), tunables={"grace_seconds": 5})["current"] is False


def test_the_module_utils_are_the_collections_own(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert _run(tmp_path, module_utils=MODULE_UTILS + ["_metrics.py"])["document"]["_install"] != first["document"]["_install"]


def test_a_missing_file_fails_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match=r"the group guard's file .*/nope\.py cannot be read"):
        _run(tmp_path, payload=[str(tmp_path / "nope.py")])
    with pytest.raises(AnsibleActionFail, match=r"_no_such_util\.py cannot be read"):
        _run(tmp_path, module_utils=["_no_such_util.py"])


def test_two_files_of_one_name_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "dgxspark_group_guard.py").write_text("print('other')\n", encoding="utf-8")
    (tmp_path / "dgxspark_group_guard.py").write_text("print('guard')\n", encoding="utf-8")
    with pytest.raises(AnsibleActionFail, match=r"share the name dgxspark_group_guard\.py"):
        _run(tmp_path, payload=[str(tmp_path / "dgxspark_group_guard.py"), str(other / "dgxspark_group_guard.py")])


T1 = "2027-01-15T09:00:00.000000001Z"
SERVING = {"spark1": T1, "spark2": T1}


def _armed(baseline: dict[str, str], status: str = "armed") -> str:
    return json.dumps({"status": status, "since": 1.0, "detail": "armed by launch.yml", "baseline": baseline,
                       "attempts": []})


def test_arm_is_skipped_only_when_the_installed_guard_keeps_this_group(tmp_path: Path) -> None:
    installed = _as_written(_run(tmp_path)["document"])
    quiet = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING))
    assert (quiet["current"], quiet["arm"]) == (True, False)
    assert "arming changes nothing" in quiet["arm_reason"]
    # the launch started the group in this run: it gives no container starts
    assert _run(tmp_path, installed, armed_state=_armed(SERVING))["arm"] is True
    # the guard keeps an older group, is disarmed, has no state, or a maintenance lock is left
    assert _run(tmp_path, installed, serving=SERVING, armed_state=_armed({"spark1": T1, "spark2": "x"}))["arm"] is True
    assert _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING, "disarmed"))["arm"] is True
    assert _run(tmp_path, installed, serving=SERVING)["arm_reason"] == "the guard has no state file yet"
    held = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING), maintenance_held=True)
    assert (held["arm"], held["arm_reason"]) == (True, "a maintenance lock is held")
    # a guard installed in this run is armed, whatever its state file says
    fresh = _run(tmp_path, serving=SERVING, armed_state=_armed(SERVING))
    assert (fresh["current"], fresh["arm"], fresh["arm_reason"]) == (False, True, "the guard is installed in this run")
