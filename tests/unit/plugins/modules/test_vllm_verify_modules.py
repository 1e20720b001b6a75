# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_verify_plan and vllm_verify_judge through main()."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_verify_judge, vllm_verify_plan
from helpers.module_runner import ModuleFail, run_module

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "verify")
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
PLAN = {"served_model_name": "glm-5.3-flash", "prompts": {"chat": "hi", "utf8": "你好", "tool_call": "w?", "busy": "s"},
        "tool": TOOL, "max_tokens": {"chat": 8, "utf8": 8, "tool_call": 64, "busy": 256}}


def _ok(name: str) -> dict:
    with open(os.path.join(FIX, name), encoding="utf-8") as handle:
        return {"status": 200, "json": json.load(handle), "elapsed": 1}


def test_plan_reads_generation_config_and_overrides():
    args = dict(PLAN, generation_config='{"temperature": 1.0}', sampling={"top_p": 0.9})
    result = run_module(vllm_verify_plan.main, args)
    assert result["changed"] is False
    assert result["sampling"] == {"temperature": 1.0, "top_p": 0.9}
    assert result["requests"]["busy"]["ignore_eos"] is True
    assert result["tool_name"] == "get_weather"


def test_plan_bad_generation_config_fails():
    with pytest.raises(ModuleFail, match="not valid JSON"):
        run_module(vllm_verify_plan.main, dict(PLAN, generation_config="{"))


def test_judge_returns_failed_checks_not_failed():
    result = run_module(vllm_verify_judge.main, {
        "served_model_name": "glm-5.3-flash", "api_url": "http://h:8000",
        "models": [{"node": "w", "response": _ok("models_good.json")}],
        "chat": _ok("chat_empty.json"), "utf8": _ok("chat_utf8_good.json")})
    assert "failed" not in result   # would make Ansible treat the task itself as failed
    assert result["ok"] is False
    assert [c["name"] for c in result["failed_checks"]] == ["chat_completion", "reasoning_parser"]
    assert "chat_completion on controller" in result["message"]


def test_judge_bad_busy_mode_fails_the_module():
    with pytest.raises(ModuleFail, match="busy mode"):
        run_module(vllm_verify_judge.main, {"served_model_name": "m", "api_url": "u", "busy": {"mode": "tpu"}})
