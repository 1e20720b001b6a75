# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.vllm_benchmark_baseline: the driver's output of the short benchmark read into a baseline."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench as b
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_benchmark_baseline
from helpers.module_runner import ModuleFail, run_module

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "bench",
                       "vllm-0.32.0-assembled-results.json")
PARAMS = {"input_tokens": 32, "output_tokens": 16, "decode_prompts": 2, "concurrency": 4, "prompts": 4}


@pytest.fixture()
def results() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        recorded = json.load(handle)
    return {"decode": recorded["decode"], "concurrency-4": recorded["concurrency-4"]}


def args(doc: dict) -> dict:
    cases = b.plan_baseline(port=8000, served_model_name="m", tokenizer=None, params=PARAMS, result_dir="/tmp/r",
                            seed=3)
    return {"run": {"stdout": "vLLM's own output\n" + b.RESULT_MARKER + " " + json.dumps(doc), "stderr": "", "rc": 0},
            "cases": cases, "params": PARAMS}


def test_the_baseline_holds_the_recorded_figures_the_parameters_and_the_whole_runs_time(results):
    out = run_module(vllm_benchmark_baseline.main, args({"vllm_version": "0.32.0", "results": results,
                                                         "errors": {}, "elapsed_s": 41.25}))
    rows = {row["case"]: row for row in b.summarize(results)["rows"]}
    baseline = out["baseline"]
    assert not out["changed"]
    assert baseline["decode_tok_s"] == rows["decode"]["decode_tok_s"] > 0
    assert baseline["ttft_ms_p50"] == rows["concurrency-4"]["ttft_ms_p50"] > 0
    assert baseline["output_throughput"] == rows["concurrency-4"]["output_throughput"] > 0
    assert baseline["params"] == PARAMS and baseline["concurrency"] == 4 and baseline["duration_s"] == 41.25
    assert baseline["vllm_version"] == "0.32.0" and baseline["measured_at"].endswith("Z")
    assert out["line"].startswith(f"decode {baseline['decode_tok_s']} tok/s at concurrency 1; at concurrency 4")


def test_a_benchmark_that_failed_fails_with_vllms_reason(results):
    doc = {"vllm_version": "0.32.0", "results": {"decode": results["decode"]},
           "errors": {"concurrency-4": "ClientConnectorError: Cannot connect to host 127.0.0.1:8000"}}
    with pytest.raises(ModuleFail) as failure:
        run_module(vllm_benchmark_baseline.main, args(doc))
    assert "the short benchmark (vllm bench serve) failed" in failure.value.result["msg"]
    assert "concurrency-4: ClientConnectorError" in failure.value.result["msg"]


def test_a_skipped_or_unstarted_run_fails_naming_why(results):
    with pytest.raises(ModuleFail) as failure:
        run_module(vllm_benchmark_baseline.main, dict(args({}), run={"skipped": True}))
    assert "did not run in the serve container" in failure.value.result["msg"]
    with pytest.raises(ModuleFail) as failure:
        run_module(vllm_benchmark_baseline.main, dict(args({}), run={"msg": "No such container: vllm_glm53",
                                                                     "failed": True}))
    assert "could not start in the serve container: No such container" in failure.value.result["msg"]
