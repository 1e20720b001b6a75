# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image_pin action: the image role's call on the controller - the reference every node pulls and the record each
keeps; a head with several digests of the repository fails the task with the pin to set."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.image_pin import ActionModule
from ansible_collections.dgxspark.vllm.plugins.modules import image_pin
from helpers.action_runner import run_action
from helpers.module_runner import ModuleFail, run_module

IMAGE = "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0"
REPO = "ghcr.io/dgxspark-lab/vllm-openai-cpu"
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def test_the_heads_pull_of_the_tag_is_what_every_node_pulls_and_records() -> None:
    result = run_action(ActionModule, {"image": IMAGE, "head_repo_digests": [f"{REPO}@{D1}"], "head": "lab-head"},
                        check_mode=True)
    assert not result.get("failed") and result["changed"] is False
    assert (result["reference"], result["digest"], result["source"]) == (f"{REPO}@{D1}", D1, "head")
    assert "lab-head" in result["message"] and f"dgxspark_vllm_image: {REPO}@{D1}" in result["message"]
    assert result["record"] == {"format": 1, "image": IMAGE, "reference": f"{REPO}@{D1}", "digest": D1,
                                "source": "head", "image_id": ""}


def test_several_digests_on_the_head_fail_the_task_with_the_pin() -> None:
    result = run_action(ActionModule, {"image": IMAGE, "head_repo_digests": [f"{REPO}@{D1}", f"{REPO}@{D2}"]})
    assert result["failed"] is True and "pin one with dgxspark_vllm_image" in result["msg"]


def test_the_image_is_required_and_the_module_says_it_runs_on_the_controller() -> None:
    with pytest.raises(AnsibleActionFail, match="missing required arguments: image"):
        run_action(ActionModule, {})
    with pytest.raises(ModuleFail, match="runs on the controller"):
        run_module(image_pin.main, {"image": IMAGE})
