# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_bench's short benchmark (verify's baseline): its parameters, its two cases, the baseline from their results.

The result files come from tests/fixtures/bench (keys as vLLM 0.32.0's benchmarks/serve.py writes them).
"""
from __future__ import annotations

import copy
import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench as b

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "bench",
                       "vllm-0.32.0-assembled-results.json")
PARAMS = {"input_tokens": 32, "output_tokens": 16, "decode_prompts": 2, "concurrency": 4, "prompts": 4}


@pytest.fixture()
def results() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        recorded = json.load(handle)
    return {"decode": recorded["decode"], "concurrency-4": recorded["concurrency-4"]}


def test_the_two_cases_use_the_benchmarks_own_flags_with_the_short_parameters():
    cases = b.plan_baseline(port=8000, served_model_name="m", tokenizer=None, params=PARAMS, result_dir="/tmp/s",
                            seed=11)
    assert cases[0]["argv"] == b.case_argv("decode", port=8000, served_model_name="m", tokenizer=None,
                                           input_tokens=32, output_tokens=16, num_prompts=2, concurrency=1, seed=11,
                                           result_dir="/tmp/s")
    assert cases[1]["argv"] == b.case_argv("concurrency-4", port=8000, served_model_name="m", tokenizer=None,
                                           input_tokens=32, output_tokens=16, num_prompts=4, concurrency=4, seed=12,
                                           result_dir="/tmp/s")
    assert [(c["name"], c["kind"], c["concurrency"]) for c in cases] == [
        ("decode", "decode", 1), ("concurrency-4", "concurrency", 4)]


@pytest.mark.parametrize("over, message", [
    ({"concurrency": 0}, "concurrency must be a positive integer, got 0"),
    ({"output_tokens": 1}, "output_tokens must be at least 2"),
    ({"prompts": 3}, "prompts (3) must be at least the concurrency (4)"),
    ({"input_tokens": "64"}, "input_tokens must be a positive integer, got '64'"),
    ({"decode_prompts": True}, "decode_prompts must be a positive integer, got True"),
])
def test_parameters_it_cannot_measure_with_are_refused(over, message):
    with pytest.raises(b.BenchError) as failure:
        b.baseline_params(**dict(PARAMS, **over))
    assert message in str(failure.value)


def test_a_prompt_and_output_beyond_the_served_length_are_refused():
    with pytest.raises(b.BenchError, match="exceed the served max_model_len 40"):
        b.plan_baseline(port=8000, served_model_name="m", tokenizer=None, params=PARAMS, result_dir="/tmp/s", seed=1,
                        max_model_len=40)


def test_the_baseline_is_the_decode_rate_and_the_loaded_cases_ttft_and_throughput(results):
    summary = b.summarize(results)
    baseline = b.baseline_from(summary, PARAMS, measured_at="2026-12-05T08:00:00Z", elapsed_s=39.9,
                               vllm_version="0.32.0")
    rows = {row["case"]: row for row in summary["rows"]}
    assert baseline == {
        "decode_tok_s": rows["decode"]["decode_tok_s"], "ttft_ms_p50": rows["concurrency-4"]["ttft_ms_p50"],
        "output_throughput": rows["concurrency-4"]["output_throughput"], "concurrency": 4, "params": PARAMS,
        "measured_at": "2026-12-05T08:00:00Z", "duration_s": 39.9,
        "bench_s": round(rows["decode"]["duration_s"] + rows["concurrency-4"]["duration_s"], 3),
        "vllm_version": "0.32.0"}
    # the decode rate is vLLM's: 1000 / mean TPOT of the single stream
    assert baseline["decode_tok_s"] == round(1000.0 / results["decode"]["mean_tpot_ms"], 2)
    assert b.baseline_line(baseline).startswith(f"decode {baseline['decode_tok_s']} tok/s at concurrency 1; at "
                                                "concurrency 4: TTFT p50 ")


def test_without_the_whole_runs_time_the_cases_time_is_the_duration(results):
    baseline = b.baseline_from(b.summarize(results), PARAMS, measured_at="t")
    assert baseline["duration_s"] == baseline["bench_s"] > 0


def test_a_missing_case_or_a_figure_that_is_not_positive_is_no_baseline(results):
    with pytest.raises(b.BenchError, match=r"needs the cases decode and concurrency-4; it has \['decode'\]"):
        b.baseline_from(b.summarize({"decode": results["decode"]}), PARAMS, measured_at="t")
    broken = copy.deepcopy(results)
    broken["concurrency-4"]["output_throughput"] = 0.0
    with pytest.raises(b.BenchError, match="measured no usable output_throughput 0.0"):
        b.baseline_from(b.summarize(broken), PARAMS, measured_at="t")
