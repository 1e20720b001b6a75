# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The firewall_plan action: the role's call on the controller, with each node's `ip -j addr show` text as registered
and the inventory's addresses (names resolved here); what it cannot plan from fails the task with why."""
from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.firewall_plan import ActionModule
from ansible_collections.dgxspark.vllm.plugins.modules import firewall_plan
from helpers.action_runner import run_action
from helpers.module_runner import ModuleFail, run_module

CONFIG: dict[str, Any] = {
    "head": "lab-head", "workers": ["lab-worker"], "port": 8000, "master_port": 29521, "api_allowed_cidrs": [],
    "nodes": {"lab-head": {"cx7_ip": "10.77.1.11", "cx7_iface": ""}, "lab-worker": {"cx7_ip": "10.77.1.12"}}}


def _ip(mgmt: str, iface: str, cx7: str) -> str:
    """`ip -j addr show` as the node prints it (the registered stdout)."""
    return json.dumps([
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "eth0", "addr_info": [{"family": "inet", "local": mgmt, "prefixlen": 24},
                                         {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        {"ifname": iface, "addr_info": [{"family": "inet", "local": cx7, "prefixlen": 24}]}])


ADDRESSES = {"lab-head": _ip("10.77.0.11", "enp1s0f1np1", "10.77.1.11"),
             "lab-worker": _ip("10.77.0.12", "enP2p1s0f1np1", "10.77.1.12")}


@pytest.mark.parametrize("check_mode", [False, True])
def test_the_rulesets_from_the_nodes_text_and_a_resolved_name(check_mode: bool) -> None:
    with mock.patch("socket.getaddrinfo", return_value=[(2, 1, 6, "", ("10.77.0.12", 0))]) as lookup:
        result = run_action(ActionModule, {"config": CONFIG, "addresses": ADDRESSES,
                                           "reached": {"lab-head": "10.77.0.11", "lab-worker": "worker.lan"},
                                           "controller": {"lab-head": "10.77.0.1 50022 10.77.0.11 22",
                                                          "lab-worker": "10.77.0.1 50023 10.77.0.12 22"}},
                            check_mode=check_mode)
    lookup.assert_called_once_with("worker.lan", None)
    assert not result.get("failed") and result["changed"] is False
    assert result["api_cidrs"] == ["10.77.0.1/32", "10.77.0.11/32", "10.77.0.12/32"]
    assert result["nodes"]["lab-worker"]["cx7_iface"] == "enP2p1s0f1np1"
    assert 'iifname "enp1s0f1np1" ip saddr @cx7_peers4 accept' in result["nodes"]["lab-head"]["ruleset"]


def test_what_cannot_be_planned_fails_the_task_with_why() -> None:
    with mock.patch("socket.getaddrinfo", side_effect=OSError("no such host")):
        result = run_action(ActionModule, {"config": CONFIG, "addresses": ADDRESSES,
                                           "reached": {"lab-head": "10.77.0.11", "lab-worker": "gone.lan"}})
    assert result["failed"] is True   # no controller session and no list: the API would answer the nodes alone
    assert result["msg"].startswith("the firewall cannot be planned: the API would answer the nodes alone: "
                                    "dgxspark_vllm_api_allowed_cidrs is empty")
    result = run_action(ActionModule, {"config": CONFIG, "addresses": dict(ADDRESSES, **{"lab-head": "{"}),
                                       "reached": {"lab-head": "10.77.0.11", "lab-worker": "10.77.0.12"}})
    assert result["failed"] is True and result["msg"].startswith(
        "the firewall cannot be planned: lab-head's `ip -j addr show` is not JSON")
    with pytest.raises(AnsibleActionFail, match="missing required arguments: reached"):
        run_action(ActionModule, {"config": CONFIG, "addresses": ADDRESSES})


def test_the_module_refuses_to_run_on_a_node() -> None:
    with pytest.raises(ModuleFail, match="runs on the controller through its action plugin"):
        run_module(firewall_plan.main, {"config": CONFIG, "addresses": ADDRESSES, "reached": {}})
