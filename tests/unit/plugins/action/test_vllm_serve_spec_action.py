# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_serve_spec action plugin renders in the controller's process, with the module's result."""
from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.vllm_serve_spec import ActionModule
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_serve_spec
from helpers.action_runner import run_action
from helpers.module_runner import run_module
from helpers.profiles import PROFILES

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import as_data

NODES = [{"name": "lab-head", "cx7_ip": "10.77.1.11", "head": True, "cx7_iface": "eth1"},
         {"name": "lab-worker", "cx7_ip": "10.77.1.12", "cx7_iface": "eth1"}]
ARGS: dict[str, Any] = {"profile": "lab_cpu", "nodes": NODES, "node": "lab-worker",
                        "settings": {"model_path": "/var/tmp/models/tiny"}}


def _action(args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    return run_action(ActionModule, args, check_mode=check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("node", ["lab-head", "lab-worker"])
def test_same_result_as_the_module(node: str, check_mode: bool) -> None:
    args = dict(ARGS, node=node, api_key="lab-key-123")
    result = _action(args, check_mode=check_mode)   # the built-in profile by name, read from profiles/
    by_module = run_module(vllm_serve_spec.main, dict(args, profile_data=as_data(PROFILES["lab_cpu"])),
                           check_mode=check_mode)
    for field in ("container", "secret_env", "command_line", "config_hash", "rank", "role", "headless"):
        assert result[field] == by_module[field], field
    assert result["changed"] is False
    assert "lab-key-123" not in json.dumps(result)
    # only the head serves the API, so only its container gets the key
    assert result["secret_env"] == (["VLLM_API_KEY"] if node == "lab-head" else [])


def test_a_render_error_fails_the_task_with_the_message() -> None:
    result = _action(dict(ARGS, node="lab-nowhere"))
    assert result["failed"] is True and "lab-nowhere" in result["msg"]


def test_bad_arguments_fail_before_rendering() -> None:
    with pytest.raises(AnsibleActionFail, match="Unsupported parameters.*bogus"):
        _action(dict(ARGS, settings={"model_path": "/m", "bogus": 1}))


def test_profile_data_wins_over_the_name() -> None:
    data = as_data(PROFILES["lab_cpu"])
    data["settings"]["served_model_name"] = "another-name"
    result = _action(dict(ARGS, profile_data=data))
    command = result["container"]["command"]
    assert command[command.index("--served-model-name") + 1] == "another-name"


def test_an_unknown_profile_name_without_data_fails() -> None:
    result = _action(dict(ARGS, profile="nope"))
    assert result["failed"] is True and "'nope' is not a built-in profile" in result["msg"]
