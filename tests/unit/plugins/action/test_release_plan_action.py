# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release_plan action: the upgrade role's decisions on the controller; a refusal fails the task with its reason."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.release_plan import ActionModule
from ansible_collections.dgxspark.vllm.plugins.modules import release_plan
from helpers.action_runner import run_action
from helpers.module_runner import ModuleFail, run_module

HISTORY = {"format": 1, "cluster": "", "serving": None, "releases": []}


def test_a_plan_without_history_is_a_first_start() -> None:
    result = run_action(ActionModule, {"mode": "plan", "history": HISTORY, "config": {"image": "a:1"}})
    assert not result.get("failed") and result["changed"] is False
    assert result["plan"]["kind"] == "first_start" and result["msg"].startswith("first start")


def test_an_unknown_release_fails_the_task_naming_it() -> None:
    result = run_action(ActionModule, {"mode": "rollback", "history": HISTORY, "release": "000000000000"})
    assert result["failed"] is True and "release '000000000000' is not in the cluster's history" in result["msg"]


def test_the_mode_is_required_and_the_module_says_it_runs_on_the_controller() -> None:
    with pytest.raises(AnsibleActionFail, match="missing required arguments: mode"):
        run_action(ActionModule, {})
    with pytest.raises(ModuleFail, match="runs on the controller"):
        run_module(release_plan.main, {"mode": "plan"})
