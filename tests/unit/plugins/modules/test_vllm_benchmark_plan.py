# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_benchmark_plan: the cases and the driver's invocation, through main()."""
from __future__ import annotations

import json

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_benchmark_plan
from helpers.module_runner import ModuleFail, run_module

BASE = {"port": 8000, "served_model_name": "glm-5.3-flash", "max_tokens": 32, "large_prompt_tokens": 1024,
        "concurrency": [1, 2, 4], "timeout": 600}


def test_plan_with_a_seed(tmp_path):
    result = run_module(vllm_benchmark_plan.main, {**BASE, "seed": 5, "max_model_len": 4096})
    assert result["changed"] is False
    assert [c["name"] for c in result["cases"]] == ["decode", "ttft", "concurrency-1", "concurrency-2",
                                                    "concurrency-4"]
    assert [c["seed"] for c in result["cases"]] == [5, 6, 7, 8, 9]
    assert result["seed"] == 5 and result["result_dir"] == "/tmp/dgxspark-bench-5"
    assert result["exec_timeout"] == 600 * 5 + 600
    driver = json.loads(result["exec_argv"][4])
    assert driver == result["driver"]
    assert driver["resolve_tokenizer"] is True and driver["case_timeout"] == 600
    assert all("--tokenizer" not in c["argv"] for c in result["cases"])


def test_plan_draws_a_new_seed_each_run():
    first = run_module(vllm_benchmark_plan.main, BASE)
    second = run_module(vllm_benchmark_plan.main, BASE)
    assert first["seed"] != second["seed"]
    assert first["result_dir"] == f"/tmp/dgxspark-bench-{first['seed']}"


def test_plan_with_a_tokenizer_and_result_dir():
    result = run_module(vllm_benchmark_plan.main, {**BASE, "tokenizer": "/models/m", "result_dir": "/tmp/b",
                                                   "seed": 0})
    assert result["driver"]["resolve_tokenizer"] is False
    argv = result["cases"][0]["argv"]
    assert argv[argv.index("--tokenizer") + 1] == "/models/m"
    assert argv[argv.index("--result-dir") + 1] == "/tmp/b"


def test_plan_is_the_same_in_check_mode():
    assert run_module(vllm_benchmark_plan.main, {**BASE, "seed": 3}, check_mode=True)["cases"] == \
        run_module(vllm_benchmark_plan.main, {**BASE, "seed": 3})["cases"]


@pytest.mark.parametrize("overrides, message", [
    ({"concurrency": []}, "concurrency must be a non-empty list"),
    ({"max_tokens": 1}, "max_tokens must be at least 2"),
    ({"large_prompt_tokens": 8192, "max_model_len": 4096}, "lower large_prompt_tokens"),
    ({"timeout": 0}, "timeout must be a positive integer"),
])
def test_plan_fails_clearly(overrides, message):
    with pytest.raises(ModuleFail, match=message):
        run_module(vllm_benchmark_plan.main, {**BASE, **overrides})


def test_the_short_benchmark_plans_two_cases_and_returns_its_parameters():
    result = run_module(vllm_benchmark_plan.main, {"kind": "baseline", "port": 8000, "served_model_name": "m",
                                                   "input_tokens": 32, "max_tokens": 16, "decode_prompts": 2,
                                                   "num_prompts": 4, "concurrency": [4], "timeout": 120, "seed": 5,
                                                   "max_model_len": 4096})
    assert [(c["name"], c["concurrency"], c["num_prompts"], c["seed"]) for c in result["cases"]] == [
        ("decode", 1, 2, 5), ("concurrency-4", 4, 4, 6)]
    assert result["params"] == {"input_tokens": 32, "output_tokens": 16, "decode_prompts": 2, "concurrency": 4,
                                "prompts": 4}
    assert result["exec_timeout"] == 120 * 2 + 600
    assert "params" not in run_module(vllm_benchmark_plan.main, BASE)


@pytest.mark.parametrize("overrides, message", [
    ({"concurrency": [1, 4]}, "the baseline measures at one concurrency, got [1, 4]"),
    ({"num_prompts": 2}, "prompts (2) must be at least the concurrency (4)"),
    ({"max_tokens": 1}, "output_tokens must be at least 2"),
    ({"input_tokens": 4000, "max_model_len": 4096}, "exceed the served max_model_len 4096"),
])
def test_the_short_benchmark_refuses_what_it_cannot_measure(overrides, message):
    args = {"kind": "baseline", "port": 8000, "served_model_name": "m", "max_tokens": 200, "concurrency": [4],
            **overrides}
    with pytest.raises(ModuleFail) as failure:
        run_module(vllm_benchmark_plan.main, args)
    assert message in failure.value.result["msg"]
