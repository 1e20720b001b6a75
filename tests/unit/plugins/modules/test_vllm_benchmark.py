# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_benchmark (the report) over a driver output built from vLLM 0.32.0 result files (tests/fixtures/bench)."""
from __future__ import annotations

import csv
import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_benchmark
from helpers.module_runner import ModuleFail, run_module

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "bench",
                       "vllm-0.32.0-assembled-results.json")


@pytest.fixture()
def results() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture()
def cases() -> list:
    return _bench.plan_cases(port=8000, served_model_name="glm-5.3-flash", tokenizer=None, max_tokens=32,
                             large_prompt_tokens=1024, concurrency=[1, 2, 4], result_dir="/tmp/dgxspark-bench-1",
                             seed=1)


def run_output(results: dict, errors: dict | None = None) -> dict:
    doc = {"vllm_version": "0.32.0", "tokenizer": "/var/tmp/models/tiny-glm53", "results": results,
           "errors": errors or {}}
    stdout = "INFO ... vLLM's own output\n" + _bench.RESULT_MARKER + " " + json.dumps(doc)
    return {"changed": True, "stdout": stdout, "stderr": "", "rc": 1 if errors else 0}


def args(tmp_path, run, cases, profile="glm53_flash_nvfp4"):
    return {"run": run, "cases": cases, "model": "glm-5.3-flash", "profile": profile,
            "output_dir": str(tmp_path / "bench")}


def test_writes_json_csv_png(tmp_path, results, cases):
    result = run_module(vllm_benchmark.main, args(tmp_path, run_output(results), cases))
    assert result["changed"] is True
    files = result["files"]
    assert sorted(files) == ["csv", "json", "png"]
    assert all(os.path.dirname(path) == str(tmp_path / "bench") for path in files.values())
    with open(files["png"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(files["csv"], encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["case"] for r in rows] == ["decode", "ttft", "concurrency-1", "concurrency-2", "concurrency-4"]
    with open(files["json"], encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["results"] == results
    assert report["cases"] == cases and report["vllm_version"] == "0.32.0" and report["tool"] == "vllm bench serve"
    assert report["reference"]["decode_tok_s"] == 23.3
    for row in report["summary"]["rows"]:
        for metric in ("ttft", "itl"):
            assert {f"{metric}_ms_p{p}" for p in (50, 90, 99)} <= set(row)
    assert result["decode_tok_s"] == round(1000.0 / results["decode"]["mean_tpot_ms"], 2)
    assert set(result["ttft_ms"]) == {"p50", "p90", "p99"}
    assert result["ttft_prompt_tokens"] == 1024
    assert result["tokenizer"] == "/var/tmp/models/tiny-glm53"
    assert len(result["lines"]) == 6 and result["lines"][-1].startswith("written: ")
    assert "(recipe NVFP4: 23.3 tok/s)" in result["lines"][0]


def test_no_reference_for_the_lab(tmp_path, results, cases):
    result = run_module(vllm_benchmark.main, args(tmp_path, run_output(results), cases, profile="lab_cpu"))
    assert result["reference"] is None
    assert "recipe" not in " ".join(result["lines"])


def test_check_mode_reads_and_writes_nothing(tmp_path, cases):
    skipped = {"skipped": True, "msg": "remote module does not support check mode", "changed": False}
    result = run_module(vllm_benchmark.main, args(tmp_path, skipped, cases), check_mode=True)
    assert result["changed"] is True and "check mode" in result["lines"][0]
    assert not (tmp_path / "bench").exists()


def test_a_failed_case_fails_with_vllms_reason(tmp_path, results, cases):
    results["concurrency-4"]["failed"] = 1
    results["concurrency-4"]["completed"] = 15
    results["concurrency-4"]["errors"][3] = "Traceback (most recent call last):\nTimeoutError: read timed out"
    with pytest.raises(ModuleFail, match="case concurrency-4: 1 of 16 requests failed: TimeoutError: read timed out"):
        run_module(vllm_benchmark.main, args(tmp_path, run_output(results), cases))
    assert not (tmp_path / "bench").exists()


def test_the_driver_stopped_at_a_case(tmp_path, results, cases):
    partial = {name: results[name] for name in ("decode",)}
    with pytest.raises(ModuleFail, match="vllm bench serve failed: ttft: not finished within 900 s"):
        run_module(vllm_benchmark.main, args(tmp_path, run_output(partial, {"ttft": "not finished within 900 s"}),
                                             cases))


def test_a_missing_case_fails(tmp_path, results, cases):
    del results["concurrency-2"]
    with pytest.raises(ModuleFail, match=r"missing \['concurrency-2'\]"):
        run_module(vllm_benchmark.main, args(tmp_path, run_output(results), cases))


@pytest.mark.parametrize("run, message", [
    ({"failed": True, "msg": "Error: No such container: vllm_glm53"},
     "could not start in the serve container: Error: No such container: vllm_glm53"),
    ({"stdout": "python3: can't open file", "stderr": "ModuleNotFoundError: No module named 'vllm'", "rc": 1},
     "(?s)printed no results.*No module named 'vllm'"),
    ({"skipped": True}, "did not run in the serve container"),
])
def test_the_run_did_not_happen(tmp_path, cases, run, message):
    with pytest.raises(ModuleFail, match=message):
        run_module(vllm_benchmark.main, args(tmp_path, run, cases))


def test_without_matplotlib_names_the_package(tmp_path, results, cases, monkeypatch):
    monkeypatch.setattr(vllm_benchmark, "HAS_MATPLOTLIB", False)
    monkeypatch.setattr(vllm_benchmark, "MATPLOTLIB_IMPORT_ERROR", "ImportError: No module named 'matplotlib'")
    with pytest.raises(ModuleFail) as failed:
        run_module(vllm_benchmark.main, args(tmp_path, run_output(results), cases))
    msg = failed.value.result["msg"]
    assert "matplotlib" in msg and "pip install matplotlib" in msg
