# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _node_python: the preflight probe of each node's module Python, and its decision."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from ansible_collections.dgxspark.vllm.plugins.module_utils._node_python import (
    LIBRARIES,
    MIN_PYTHON,
    PROBE,
    NodePythonError,
    decide_node,
    evaluate,
    probe_argv,
)

TASKS = pathlib.Path(__file__).resolve().parents[4] / "roles" / "preflight" / "tasks" / "node_python.yml"


def probe_result(version: list[int], libraries: dict[str, Any], rc: int = 0) -> dict[str, Any]:
    out = json.dumps({"version": version, "executable": "/usr/bin/python3", "libraries": libraries})
    return {"rc": rc, "stdout": out, "stderr": "", "changed": False}


OK_REQUESTS = {"requests": {"ok": True, "version": "2.31.0"}}
NO_REQUESTS = {"requests": {"ok": False, "error": "ModuleNotFoundError: No module named 'requests'"}}


@pytest.mark.parametrize(("version", "libraries", "failed"), [
    ([3, 12, 3], OK_REQUESTS, []),                                  # DGX OS 7
    ([3, 10, 12], OK_REQUESTS, []),                                 # the minimum
    ([3, 11, 2], NO_REQUESTS, ["python.requests"]),
    ([3, 9, 18], OK_REQUESTS, ["python"]),
    ([3, 8, 10], NO_REQUESTS, ["python", "python.requests"]),
    ([3, 12, 3], {}, ["python.requests"]),                          # not probed counts as missing
])
def test_decide_node(version: list[int], libraries: dict[str, Any], failed: list[str]) -> None:
    report = decide_node("n1", "/usr/bin/python3", probe_result(version, libraries))
    assert [f["name"] for f in report["failures"]] == failed
    assert report["ok"] is (not failed)
    assert report["python"] == ".".join(map(str, version))
    for failure in report["failures"]:
        assert failure["fix"]
    if "python.requests" in failed:
        assert "sudo apt-get install -y python3-requests" in report["failures"][-1]["fix"]
        assert report["libraries"]["requests"] is None
    if "python" in failed:
        assert "%d.%d" % MIN_PYTHON in report["failures"][0]["fix"]


def test_interpreter_missing_is_a_finding() -> None:
    result = {"rc": 2, "stdout": "", "stderr": "", "msg": "[Errno 2] No such file or directory: b'/opt/py/bin/python3'",
              "failed": True}
    report = decide_node("n1", "/opt/py/bin/python3", result)
    assert [f["name"] for f in report["failures"]] == ["python"]
    assert "No such file" in report["failures"][0]["evidence"]
    assert "ansible_python_interpreter" in report["failures"][0]["fix"]


@pytest.mark.parametrize("result", [{"rc": 0, "stdout": "not json"}, {"rc": 0, "stdout": '{"version": "x"}'}])
def test_unusable_probe_output_raises(result: dict[str, Any]) -> None:
    with pytest.raises(NodePythonError):
        decide_node("n1", "python3", result)


@pytest.mark.parametrize("nodes", [[{"interpreter": "python3"}], ["lab-head"]])
def test_nodes_need_names(nodes: list[Any]) -> None:
    with pytest.raises(NodePythonError):
        evaluate(nodes)


def test_evaluate_message_names_every_failure() -> None:
    result = evaluate([
        {"name": "head", "interpreter": "/usr/bin/python3", "result": probe_result([3, 12, 3], OK_REQUESTS)},
        {"name": "worker", "interpreter": "/usr/bin/python3", "result": probe_result([3, 12, 3], NO_REQUESTS)},
    ])
    assert result["ok"] is False
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("worker", "python.requests")]
    assert result["message"].startswith("The Python that runs modules on 1 node(s) (worker)")
    assert "python3-requests" in result["message"]
    assert evaluate([{"name": "head", "result": probe_result([3, 12, 3], OK_REQUESTS)}]) == {
        "ok": True, "failures": [], "message": "",
        "reports": {"head": {"node": "head", "interpreter": "python3", "ok": True, "python": "3.12.3",
                             "executable": "/usr/bin/python3", "libraries": {"requests": "2.31.0"}, "failures": []}}}


def test_probe_runs_and_is_decided() -> None:
    """The real probe, run by this Python, prints what decide_node reads."""
    done = subprocess.run(probe_argv(sys.executable), capture_output=True, text=True, check=False)
    report = decide_node("local", sys.executable, {"rc": done.returncode, "stdout": done.stdout,
                                                   "stderr": done.stderr})
    has_requests = importlib.util.find_spec("requests") is not None
    assert ("python.requests" in [f["name"] for f in report["failures"]]) is (not has_requests)
    assert report["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_role_task_runs_the_same_probe() -> None:
    """roles/preflight/tasks/node_python.yml carries PROBE and LIBRARIES verbatim."""
    tasks = yaml.safe_load(TASKS.read_text())
    argv = tasks[0]["block"][0]["ansible.builtin.command"]["argv"]
    assert argv[1:3] == ["-c", PROBE]
    assert argv[3:] == [lib.name for lib in LIBRARIES]
