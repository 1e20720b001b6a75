# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the dgxspark.vllm.preflight_report module, run in-process."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from helpers.module_runner import ModuleFail, run_module

from ansible_collections.dgxspark.vllm.plugins.modules.preflight_report import main

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "module_utils"))
import test_preflight as probes  # noqa: E402  (the probe samples of the module_utils tests)

LAB_ARGS = {"cx7_subnet": "10.77.1.0/24", "model_path": "/var/tmp/models/tiny-glm53", "lab": True,
            "checkpoint_size_bytes": 10 ** 9, "disk_margin_bytes": 10 ** 9, "mem_available_floor_bytes": 2 ** 31}


def args(nodes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return dict(LAB_ARGS, nodes=nodes, **extra)


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_lab_nodes_pass_and_detect(check_mode: bool) -> None:
    result = run_module(main, args([probes.lab_node("lab-head"), probes.lab_node("lab-worker")]), check_mode)
    assert result["changed"] is False
    assert result["ok"] is True
    assert result["detected"]["lab-head"] == {"cx7_iface": "enp1s0f1np1", "ib_hca": "rocep1s0f1,roceP2p1s0f1",
                                              "gid_index": 3}
    assert result["detected"]["lab-worker"]["gid_index"] == 4
    assert set(result) >= {"ok", "reports", "detected", "failures", "summary", "message"}
    assert "failed" not in result
    json.dumps(result["reports"])


def test_failed_checks_are_returned_not_raised() -> None:
    head = probes.lab_node("lab-head", listeners=probes.cmd(probes.SS_HTTP_SERVER))
    result = run_module(main, args([head, probes.lab_node("lab-worker")]))
    assert result["ok"] is False
    assert "failed" not in result
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("lab-head", "port.8000")]
    assert "python3 (pid 2211)" in result["message"]


def test_ports_come_from_the_arguments() -> None:
    head = probes.lab_node("lab-head", listeners=probes.cmd(probes.SS_HTTP_SERVER))
    result = run_module(main, args([head, probes.lab_node("lab-worker")], api_port=8001))
    assert result["ok"] is True
    assert [c["name"] for c in result["reports"]["lab-head"]["checks"] if c["name"].startswith("port.")] == [
        "port.8001", "port.29521"]


@pytest.mark.parametrize(("extra", "message"), [
    ({"lab": False, "rdma_skip": True}, "preflight_rdma_skip is honoured only in the lab"),
    ({"disk_margin_bytes": -1}, "disk_margin_bytes must be >= 0"),
])
def test_unusable_input_fails(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ModuleFail) as failed:
        run_module(main, args([probes.lab_node("lab-head")], **extra))
    assert failed.value.result["msg"].startswith("preflight_report: ")
    assert message in failed.value.result["msg"]


def test_repeated_node_names_fail() -> None:
    with pytest.raises(ModuleFail, match="node names repeat"):
        run_module(main, args([{"name": "a"}, {"name": "a"}]))


def test_documentation_matches_the_argument_spec() -> None:
    import yaml
    from unittest import mock

    from ansible_collections.dgxspark.vllm.plugins.modules import preflight_report

    docs = yaml.safe_load(preflight_report.DOCUMENTATION)["options"]
    yaml.safe_load(preflight_report.EXAMPLES)
    returned = set(yaml.safe_load(preflight_report.RETURN))
    seen: dict[str, Any] = {}

    def capture(self: Any, argument_spec: dict[str, Any], **_kwargs: Any) -> None:
        seen.update(argument_spec)
        raise RuntimeError("captured")

    with mock.patch("ansible.module_utils.basic.AnsibleModule.__init__", capture), pytest.raises(RuntimeError):
        main()
    assert set(docs) == set(seen)
    for name, spec in seen.items():
        assert docs[name]["type"] == spec["type"], name
        assert docs[name].get("default") == spec.get("default"), name
    result = run_module(main, args([probes.lab_node("lab-head"), probes.lab_node("lab-worker")]))
    assert returned == set(result) - {"changed"}
