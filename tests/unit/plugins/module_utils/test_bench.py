# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _bench: the `vllm bench serve` argv of each case, the driver's output, the summary, the references.

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


@pytest.fixture()
def results() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        return json.load(handle)


def plan(**overrides):
    args = {"port": 8000, "served_model_name": "glm-5.3-flash", "tokenizer": "/var/tmp/models/m",
            "max_tokens": 256, "large_prompt_tokens": 32768, "concurrency": [1, 2, 4],
            "result_dir": "/tmp/dgxspark-bench-7", "seed": 7}
    args.update(overrides)
    return b.plan_cases(**args)


COMMON_TAIL = ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]


def test_plan_decode_argv_is_exact():
    decode = plan()[0]
    assert decode["argv"] == [
        "vllm", "bench", "serve", "--backend", "vllm", "--base-url", "http://127.0.0.1:8000",
        "--endpoint", "/v1/completions", "--model", "glm-5.3-flash", "--tokenizer", "/var/tmp/models/m",
        "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "256",
        "--num-prompts", "3", "--max-concurrency", "1", "--ignore-eos", "--temperature", "0", "--seed", "7",
        *COMMON_TAIL, "--label", "decode", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", "/tmp/dgxspark-bench-7", "--result-filename", "decode.json",
    ]
    assert {k: decode[k] for k in ("name", "kind", "concurrency", "input_tokens", "output_tokens", "num_prompts",
                                   "seed")} == {"name": "decode", "kind": "decode", "concurrency": 1,
                                                "input_tokens": 128, "output_tokens": 256, "num_prompts": 3, "seed": 7}


@pytest.mark.parametrize("index, name, options", [
    (1, "ttft", {"--random-input-len": "32768", "--random-output-len": "8", "--num-prompts": "1",
                 "--max-concurrency": "1", "--seed": "8"}),
    (2, "concurrency-1", {"--random-input-len": "512", "--random-output-len": "256", "--num-prompts": "4",
                          "--max-concurrency": "1", "--seed": "9"}),
    (3, "concurrency-2", {"--random-input-len": "512", "--num-prompts": "8", "--max-concurrency": "2",
                          "--seed": "10"}),
    (4, "concurrency-4", {"--random-input-len": "512", "--num-prompts": "16", "--max-concurrency": "4",
                          "--seed": "11", "--result-filename": "concurrency-4.json", "--label": "concurrency-4"}),
])
def test_plan_cases_in_order_with_their_options(index, name, options):
    case = plan()[index]
    assert case["name"] == name
    argv = case["argv"]
    for flag, value in options.items():
        assert argv[argv.index(flag) + 1] == value, flag
    for flag in ("--ignore-eos", "--save-result", "--disable-tqdm"):
        assert flag in argv
    assert argv[:3] == ["vllm", "bench", "serve"]


def test_plan_has_no_key_and_no_header_anywhere():
    for case in plan():
        text = " ".join(case["argv"]).lower()
        assert "--header" not in text and "authorization" not in text and "api-key" not in text
        assert "api_key" not in text and "bearer" not in text


def test_plan_without_tokenizer_leaves_it_to_the_driver():
    for case in plan(tokenizer=None):
        assert "--tokenizer" not in case["argv"]
    driver = b.driver_plan(plan(tokenizer=None), port=8000, served_model_name="glm-5.3-flash",
                           result_dir="/tmp/dgxspark-bench-7", case_timeout=900, resolve_tokenizer=True)
    assert driver["resolve_tokenizer"] is True
    assert driver["base_url"] == "http://127.0.0.1:8000" and driver["model"] == "glm-5.3-flash"
    assert [c["name"] for c in driver["cases"]] == ["decode", "ttft", "concurrency-1", "concurrency-2",
                                                    "concurrency-4"]
    assert set(driver["cases"][0]) == {"name", "argv"}


def test_exec_argv_moves_the_key_between_environment_variables_only():
    driver = b.driver_plan(plan(), port=8000, served_model_name="m", result_dir="/tmp/dgxspark-bench-7",
                           case_timeout=900, resolve_tokenizer=False)
    argv = b.exec_argv(driver)
    assert argv[:2] == ["sh", "-c"]
    assert argv[2] == '[ -z "${VLLM_API_KEY:-}" ] || export OPENAI_API_KEY="$VLLM_API_KEY"; exec python3 - "$@"'
    assert argv[3] == "dgxspark-bench" and json.loads(argv[4]) == driver and len(argv) == 5
    assert b.exec_timeout(driver) == 900 * 5 + b.DRIVER_ALLOWANCE_S


def test_plan_checks_max_model_len():
    assert len(plan(max_model_len=32768 + 8)) == 5
    with pytest.raises(b.BenchError, match="case ttft: a 32768-token prompt plus 8 generated tokens exceed the "
                                           "served max_model_len 4096; lower large_prompt_tokens"):
        plan(max_model_len=4096)
    with pytest.raises(b.BenchError, match="case decode: .* lower max_tokens"):
        plan(max_tokens=5000, large_prompt_tokens=100, max_model_len=4096)


@pytest.mark.parametrize("overrides, message", [
    ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
    ({"max_tokens": 1}, "max_tokens must be at least 2"),
    ({"max_tokens": True}, "max_tokens must be a positive integer"),
    ({"large_prompt_tokens": -5}, "large_prompt_tokens must be a positive integer, got -5"),
    ({"concurrency": []}, "concurrency must be a non-empty list"),
    ({"concurrency": "4"}, "concurrency must be a non-empty list"),
    ({"concurrency": [1, 0]}, "every concurrency level must be a positive integer, got 0"),
    ({"concurrency": [2, 2]}, "concurrency lists a level twice"),
    ({"port": 0}, "port must be a positive integer"),
    ({"port": 70000}, "port must be at most 65535"),
    ({"served_model_name": ""}, "served_model_name must be a non-empty string"),
    ({"tokenizer": ""}, "tokenizer must be a non-empty"),
    ({"result_dir": "tmp/x"}, "result_dir must be an absolute directory"),
    ({"result_dir": "/"}, "result_dir must be an absolute directory other than /"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"max_model_len": 0}, "max_model_len must be a positive integer"),
])
def test_plan_refuses_bad_options(overrides, message):
    with pytest.raises(b.BenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**overrides)


# --- the driver's output ------------------------------------------------------------------------------------
def driver_stdout(doc: dict) -> str:
    return ("INFO vLLM prints a lot\n============ Serving Benchmark Result ============\n"
            f"{b.RESULT_MARKER} {json.dumps(doc)}\n")


def test_parse_driver_output_takes_the_marker_line(results):
    doc = {"vllm_version": "0.32.0", "tokenizer": "/m", "results": results, "errors": {}}
    assert b.parse_driver_output(driver_stdout(doc)) == doc


def test_parse_driver_output_without_marker_shows_the_tail():
    with pytest.raises(b.BenchError, match=r"(?s)printed no results \(exit status 1\).*Traceback line.*stderr:\nboom"):
        b.parse_driver_output("a\nTraceback line\n", "boom", 1)


def test_parse_driver_output_reports_the_driver_errors():
    doc = {"results": {}, "errors": {"ttft": "not finished within 900 s (benchmark_timeout)"}}
    with pytest.raises(b.BenchError, match="vllm bench serve failed: ttft: not finished within 900 s"):
        b.parse_driver_output(driver_stdout(doc))


@pytest.mark.parametrize("line, message", [
    (f"{b.RESULT_MARKER} {{not json", "result line is not JSON"),
    (f"{b.RESULT_MARKER} []", "has no 'results' mapping"),
])
def test_parse_driver_output_bad_document(line, message):
    with pytest.raises(b.BenchError, match=message):
        b.parse_driver_output(line)


def test_check_complete():
    cases = plan()
    b.check_complete(cases, {c["name"]: {} for c in cases})
    with pytest.raises(b.BenchError, match=r"missing \['concurrency-4'\], unplanned \['other'\]"):
        b.check_complete(cases, {**{c["name"]: {} for c in cases[:-1]}, "other": {}})


# --- the summary --------------------------------------------------------------------------------------------
def test_summarize_rows_and_headline(results):
    summary = b.summarize(results)
    rows = summary["rows"]
    assert [r["case"] for r in rows] == ["decode", "ttft", "concurrency-1", "concurrency-2", "concurrency-4"]
    decode = rows[0]
    assert decode["decode_tok_s"] == round(1000.0 / results["decode"]["mean_tpot_ms"], 2)
    assert summary["decode_tok_s"] == decode["decode_tok_s"]
    assert decode["ttft_ms_p50"] == round(results["decode"]["p50_ttft_ms"], 2)
    assert decode["itl_ms_p99"] == round(results["decode"]["p99_itl_ms"], 2)
    assert decode["output_throughput"] == round(results["decode"]["output_throughput"], 2)
    assert decode["request_throughput"] == round(results["decode"]["request_throughput"], 4)
    assert (decode["completed"], decode["failed"], decode["input_tokens"], decode["output_tokens"]) == (3, 0, 128, 32)
    assert summary["ttft_ms"] == {f"p{p}": round(results["ttft"][f"p{p}_ttft_ms"], 2) for p in (50, 90, 99)}
    assert summary["ttft_prompt_tokens"] == 1024
    assert [r["concurrency"] for r in rows] == [1, 1, 1, 2, 4]
    for row in rows:
        for metric in ("ttft", "itl", "tpot", "e2el"):
            for p in (50, 90, 99):
                assert isinstance(row[f"{metric}_ms_p{p}"], float)
        assert row["spec_decode_acceptance_length"] is None


def test_summarize_keeps_the_speculative_acceptance(results):
    results["decode"]["spec_decode_acceptance_length"] = 3.41234
    assert b.summarize(results)["rows"][0]["spec_decode_acceptance_length"] == 3.412


def test_summarize_partial_results_have_no_headline(results):
    summary = b.summarize({"concurrency-2": results["concurrency-2"]})
    assert summary["decode_tok_s"] is None and summary["ttft_ms"] is None and len(summary["rows"]) == 1


def test_summarize_fails_on_failed_requests_with_the_first_error(results):
    broken = copy.deepcopy(results)
    broken["concurrency-2"]["failed"] = 2
    broken["concurrency-2"]["completed"] = 6
    broken["concurrency-2"]["errors"] = ["", "Traceback ...\naiohttp.ClientConnectorError: refused", "Bad Request"]
    with pytest.raises(b.BenchError, match="case concurrency-2: 2 of 8 requests failed: "
                                           "aiohttp.ClientConnectorError: refused; Bad Request"):
        b.summarize(broken)


def test_summarize_fails_when_nothing_completed(results):
    results["decode"]["completed"] = 0
    with pytest.raises(b.BenchError, match="case decode: no request completed"):
        b.summarize(results)


def test_summarize_names_missing_keys(results):
    del results["ttft"]["p90_itl_ms"]
    del results["ttft"]["p50_e2el_ms"]
    with pytest.raises(b.BenchError, match="case ttft: vLLM's result lacks p90_itl_ms, p50_e2el_ms .*"
                                           "--percentile-metrics ttft,tpot,itl,e2el"):
        b.summarize(results)


@pytest.mark.parametrize("key, value, message", [
    ("p50_ttft_ms", float("nan"), "p50_ttft_ms is not a finite number"),
    ("duration", "12", "duration is not a finite number"),
    ("max_concurrency", 8, "was run with max_concurrency 8"),
])
def test_summarize_refuses_odd_values(results, key, value, message):
    results["concurrency-4"][key] = value
    with pytest.raises(b.BenchError, match=message):
        b.summarize(results)


@pytest.mark.parametrize("bad, message", [
    ({}, "no results"),
    ({"warmup": {}}, "unknown case 'warmup'"),
    ({"decode": []}, "case decode: the result is not a JSON object"),
])
def test_summarize_refuses_odd_documents(bad, message):
    with pytest.raises(b.BenchError, match=message):
        b.summarize(bad)


def test_csv_has_a_row_per_case(results):
    text = b.to_csv(b.summarize(results)["rows"])
    lines = text.splitlines()
    assert lines[0] == ",".join(b.CSV_FIELDS)
    assert len(lines) == 6
    assert lines[1].startswith("decode,1,3,3,0,128.0,32.0,")
    assert lines[1].endswith(",")  # no speculative decoding: empty last column


# --- references and text ------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile, decode, ttft", [
    ("glm53_flash_nvfp4", 23.3, [3.0, 12.0]),
    ("glm53_flash_exl3", 42.3, [325.0, 432.0]),
])
def test_reference_for_the_recipe_profiles(profile, decode, ttft):
    ref = b.reference_for(profile)
    assert ref["decode_tok_s"] == decode and ref["ttft_s"] == ttft and ref["profile"] == profile


@pytest.mark.parametrize("profile", ["lab_cpu", "my_nvfp4", ""])
def test_no_reference_for_other_profiles(profile):
    assert b.reference_for(profile) is None


def test_summary_lines(results):
    lines = b.summary_lines(b.summarize(results), b.reference_for("glm53_flash_nvfp4"))
    assert len(lines) == 5
    assert lines[0].startswith("decode (1 stream, 128-token prompts, 32 tokens out): decode ")
    assert "(recipe NVFP4: 23.3 tok/s)" in lines[0]
    assert "TTFT p50/p90/p99 " in lines[0] and "ITL p50/p90/p99" in lines[0]
    assert lines[1].startswith("ttft (1 stream, 1024-token prompt, 8 tokens out): ")
    assert "(recipe NVFP4: 3-12 s)" in lines[1]
    assert lines[4].startswith("concurrency-4 (4 streams, 512-token prompts, 32 tokens out): ")
    assert "output tok/s" in lines[4]
    assert "recipe" not in " ".join(b.summary_lines(b.summarize(results), None))


@pytest.mark.parametrize("profile, version, expected", [
    ("glm53_flash_nvfp4", "0.32.0",
     "glm-5.3-flash (profile glm53_flash_nvfp4) - vLLM 0.32.0 bench serve - 2026-12-01 08:30 UTC"),
    ("", None, "glm-5.3-flash - vllm bench serve - 2026-12-01 08:30 UTC"),
])
def test_chart_title(profile, version, expected):
    assert b.chart_title("glm-5.3-flash", profile, "20261201T083000Z", version) == expected
