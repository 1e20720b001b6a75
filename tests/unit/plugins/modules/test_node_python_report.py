# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the dgxspark.vllm.node_python_report module, run in-process."""
from __future__ import annotations

import json

import pytest

from helpers.module_runner import ModuleFail, run_module

from ansible_collections.dgxspark.vllm.plugins.modules.node_python_report import main


def node(name: str, requests_ok: bool) -> dict:
    libraries = {"requests": {"ok": True, "version": "2.31.0"} if requests_ok else
                 {"ok": False, "error": "ModuleNotFoundError: No module named 'requests'"}}
    return {"name": name, "interpreter": "/usr/bin/python3",
            "result": {"rc": 0, "stdout": json.dumps({"version": [3, 12, 3], "executable": "/usr/bin/python3",
                                                      "libraries": libraries}), "stderr": ""}}


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_passes_and_changes_nothing(check_mode: bool) -> None:
    result = run_module(main, {"nodes": [node("head", True), node("worker", True)]}, check_mode)
    assert result["changed"] is False
    assert result["ok"] is True
    assert result["reports"]["worker"]["libraries"] == {"requests": "2.31.0"}


def test_missing_requests_is_returned_not_raised() -> None:
    result = run_module(main, {"nodes": [node("head", True), node("worker", False)]})
    assert result["ok"] is False
    assert "failed" not in result
    assert "worker python.requests" in result["message"] and "python3-requests" in result["message"]


def test_unusable_input_fails() -> None:
    with pytest.raises(ModuleFail, match="node_python_report: every node needs a name"):
        run_module(main, {"nodes": [{"interpreter": "python3"}]})
