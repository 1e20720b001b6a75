# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for roles/operations/files/dgxspark_bench_serve.py (the operations role's `benchmark` entry point), the
driver that runs `vllm bench serve` cases in the serve container, without vLLM: its plan checks, its loopback and
key handling, and its dispatch against a stand-in ``vllm`` package that has the entry points the driver uses
(``vllm.benchmarks.serve.add_cli_args`` and ``main_async``/``main``, ``vllm.utils.argparse_utils.FlexibleArgumentParser``,
``vllm.platforms``, ``vllm.logger``). The plan comes from the collection's own planner, so planner and driver must agree.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers.programs import load_program
from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "operations" / "files" / "dgxspark_bench_serve.py"


driver = load_program(SCRIPT, "dgxspark_bench_serve")


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    """driver.main edits os.environ (NO_PROXY) and reads OPENAI_API_KEY: restore both after each test."""
    for var in ("no_proxy", "NO_PROXY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def make_plan(tmp_path, tokenizer=None, concurrency=(1, 2), timeout=60) -> dict:
    result_dir = str(tmp_path / "results")
    cases = _bench.plan_cases(port=8000, served_model_name="glm-5.3-flash", tokenizer=tokenizer, max_tokens=32,
                              large_prompt_tokens=1024, concurrency=list(concurrency), result_dir=result_dir,
                              seed=3)
    return _bench.driver_plan(cases, port=8000, served_model_name="glm-5.3-flash", result_dir=result_dir,
                              case_timeout=timeout, resolve_tokenizer=tokenizer is None)


# --- the plan ---------------------------------------------------------------------------------------------
def test_the_planners_plan_loads(tmp_path):
    plan = make_plan(tmp_path)
    assert driver.load_plan([json.dumps(plan)]) == plan
    assert driver.MARKER == _bench.RESULT_MARKER


def _case(plan: dict, **changes) -> dict:
    case = dict(plan["cases"][0], **changes)
    return dict(plan, cases=[case] + plan["cases"][1:])


@pytest.mark.parametrize("mutate, message", [
    (lambda p: None, "the plan must be a JSON object"),
    (lambda p: {k: v for k, v in p.items() if k != "model"}, "the plan has no 'model'"),
    (lambda p: dict(p, result_dir="relative"), "result_dir must be an absolute directory"),
    (lambda p: dict(p, result_dir="/"), "result_dir must be an absolute directory other than /"),
    (lambda p: dict(p, case_timeout=0), "case_timeout must be a positive integer"),
    (lambda p: dict(p, case_timeout=True), "case_timeout must be a positive integer"),
    (lambda p: dict(p, cases=[]), "the plan has no cases"),
    (lambda p: _case(p, name="../x"), "bad or repeated case name '../x'"),
    (lambda p: dict(p, cases=[p["cases"][0], p["cases"][0]]), "bad or repeated case name 'decode'"),
    (lambda p: _case(p, argv=["vllm", "serve", "x"]), "starting with 'vllm bench serve'"),
    (lambda p: _case(p, argv=p["cases"][0]["argv"] + ["--header", "Authorization=Bearer x"]), "refused option"),
    (lambda p: _case(p, argv=p["cases"][0]["argv"] + ["--header=Authorization=Bearer x"]), "refused option"),
    (lambda p: _case(p, argv=[a if a != "decode.json" else "other.json" for a in p["cases"][0]["argv"]]),
     "it must save .*/decode.json"),
    (lambda p: _case(p, argv=[a for a in p["cases"][0]["argv"] if a != "--save-result"]), "--save-result is missing"),
])
def test_bad_plans_are_refused(tmp_path, mutate, message):
    with pytest.raises(driver.PlanError, match=message):
        driver.load_plan([json.dumps(mutate(make_plan(tmp_path)))])


@pytest.mark.parametrize("args, message", [
    ([], "expected one argument"),
    (["{}", "{}"], "expected one argument"),
    (["{not json"], "the plan is not JSON"),
])
def test_bad_command_lines(args, message):
    with pytest.raises(driver.PlanError, match=message):
        driver.load_plan(args)


@pytest.mark.parametrize("argv, name, expected", [
    (["--model", "m", "--seed", "3"], "--seed", "3"),
    (["--model=m"], "--model", "m"),
    (["--model"], "--model", None),
    (["--model-x", "m"], "--model", None),
])
def test_option(argv, name, expected):
    assert driver.option(argv, name) == expected


def test_with_tokenizer():
    assert driver.with_tokenizer(["vllm", "bench", "serve"], "/m") == ["vllm", "bench", "serve", "--tokenizer", "/m"]
    assert driver.with_tokenizer(["--tokenizer", "/a"], "/m") == ["--tokenizer", "/a"]
    assert driver.with_tokenizer(["x"], None) == ["x"]


def test_loopback_bypasses_any_proxy():
    env = {"no_proxy": "example.com", "HTTP_PROXY": "http://proxy:3128"}
    driver.bypass_proxy_for_loopback(env)
    assert env["no_proxy"] == "example.com,127.0.0.1,localhost,::1"
    assert env["NO_PROXY"] == "127.0.0.1,localhost,::1"
    driver.bypass_proxy_for_loopback(env)
    assert env["no_proxy"] == "example.com,127.0.0.1,localhost,::1"


# --- the served model's path (/v1/models) -------------------------------------------------------------------
class Models(BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        Models.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"object": "list", "data": [
            {"id": "other", "object": "model", "root": "/x"},
            {"id": "glm-5.3-flash", "object": "model", "root": "/var/tmp/models/tiny-glm53", "max_model_len": 4096},
        ]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def models_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Models.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_served_root_with_the_key_from_the_environment(models_url):
    assert driver.served_root(models_url, "glm-5.3-flash", "sk-lab") == "/var/tmp/models/tiny-glm53"
    assert Models.seen == [("/v1/models", "Bearer sk-lab")]
    assert driver.served_root(models_url + "/", "glm-5.3-flash", None) == "/var/tmp/models/tiny-glm53"
    assert Models.seen[-1] == ("/v1/models", None)


def test_served_root_of_an_unknown_model(models_url):
    with pytest.raises(driver.PlanError, match=r"serves no model 'nope' .*\['other', 'glm-5.3-flash'\]"):
        driver.served_root(models_url, "nope", None)


# --- dispatch, against a stand-in vLLM ----------------------------------------------------------------------
FLAGS_WITH_VALUES = ("--backend", "--base-url", "--endpoint", "--model", "--tokenizer", "--dataset-name",
                     "--random-input-len", "--random-output-len", "--num-prompts", "--max-concurrency",
                     "--temperature", "--seed", "--percentile-metrics", "--metric-percentiles", "--label",
                     "--result-dir", "--result-filename")
FLAGS = ("--ignore-eos", "--disable-tqdm", "--save-result", "--save-detailed")


class FakeVllm:
    """Installs modules named like vLLM's in sys.modules; records what the driver calls."""

    def __init__(self, monkeypatch, behaviour=None, coroutine=True):
        self.calls: list = []
        self.behaviour = behaviour or {}
        self.logging_configured = 0
        fake = self

        def add_cli_args(parser):
            for flag in FLAGS_WITH_VALUES:
                parser.add_argument(flag)
            for flag in FLAGS:
                parser.add_argument(flag, action="store_true")

        def write(args):
            fake.calls.append((args, os.environ.get("OPENAI_API_KEY")))
            action = fake.behaviour.get(args.label)
            if action == "raise":
                raise RuntimeError("Initial test run failed")
            os.makedirs(args.result_dir, exist_ok=True)
            with open(os.path.join(args.result_dir, args.result_filename), "w", encoding="utf-8") as fh:
                json.dump({"label": args.label, "max_concurrency": int(args.max_concurrency)}, fh)

        async def main_async(args):
            if fake.behaviour.get(args.label) == "hang":
                await asyncio.sleep(30)
            write(args)
            return {}

        serve = types.ModuleType("vllm.benchmarks.serve")
        serve.add_cli_args = add_cli_args
        serve.main = write
        if coroutine:
            serve.main_async = main_async
        parsers = types.ModuleType("vllm.utils.argparse_utils")
        parsers.FlexibleArgumentParser = argparse.ArgumentParser
        platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = types.SimpleNamespace(is_unspecified=lambda: True)
        cpu = types.ModuleType("vllm.platforms.cpu")
        cpu.CpuPlatform = lambda: "cpu-platform"
        logger = types.ModuleType("vllm.logger")

        def configure_logging_from_args(args):
            fake.logging_configured += 1

        logger.configure_logging_from_args = configure_logging_from_args
        vllm = types.ModuleType("vllm")
        vllm.__version__ = "0.32.0"
        self.platforms = platforms
        for name, module in {"vllm": vllm, "vllm.benchmarks": types.ModuleType("vllm.benchmarks"),
                             "vllm.benchmarks.serve": serve, "vllm.utils": types.ModuleType("vllm.utils"),
                             "vllm.utils.argparse_utils": parsers, "vllm.platforms": platforms,
                             "vllm.platforms.cpu": cpu, "vllm.logger": logger}.items():
            monkeypatch.setitem(sys.modules, name, module)


def marker_doc(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith(driver.MARKER + " ")]
    assert len(lines) == 1
    return json.loads(lines[0][len(driver.MARKER) + 1:])


def test_every_case_runs_with_one_import(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    plan = make_plan(tmp_path, tokenizer="/models/m")
    assert driver.main([json.dumps(plan)]) == 0
    doc = marker_doc(capsys.readouterr().out)
    assert doc["errors"] == {} and doc["vllm_version"] == "0.32.0" and doc["tokenizer"] is None
    assert doc["results"] == {
        "decode": {"label": "decode", "max_concurrency": 1}, "ttft": {"label": "ttft", "max_concurrency": 1},
        "concurrency-1": {"label": "concurrency-1", "max_concurrency": 1},
        "concurrency-2": {"label": "concurrency-2", "max_concurrency": 2}}
    assert [args.label for args, _key in fake.calls] == ["decode", "ttft", "concurrency-1", "concurrency-2"]
    assert all(key == "sk-from-env" for _args, key in fake.calls)  # the key reaches vLLM's client by env only
    first = fake.calls[0][0]
    assert (first.model, first.tokenizer, first.base_url, first.num_prompts) == (
        "glm-5.3-flash", "/models/m", "http://127.0.0.1:8000", "3")
    assert first.save_result and first.ignore_eos
    assert fake.logging_configured == 4
    assert fake.platforms.current_platform == "cpu-platform"  # as `vllm bench` does for an unspecified platform
    assert not os.path.exists(plan["result_dir"])  # removed when done
    assert "127.0.0.1" in os.environ["NO_PROXY"]


def test_the_tokenizer_is_read_from_the_server(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch)
    monkeypatch.setattr(driver, "served_root", lambda url, model, key: f"/root-of/{model}")
    assert driver.main([json.dumps(make_plan(tmp_path, concurrency=(1,)))]) == 0
    doc = marker_doc(capsys.readouterr().out)
    assert doc["tokenizer"] == "/root-of/glm-5.3-flash"
    assert {args.tokenizer for args, _key in fake.calls} == {"/root-of/glm-5.3-flash"}


def test_an_unreadable_model_list_stops_before_any_case(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch)

    def refused(url, model, key):
        raise OSError("HTTP Error 401: Unauthorized")

    monkeypatch.setattr(driver, "served_root", refused)
    assert driver.main([json.dumps(make_plan(tmp_path))]) == 1
    doc = marker_doc(capsys.readouterr().out)
    assert "401" in doc["errors"]["tokenizer"] and fake.calls == []


def test_a_failing_case_stops_the_run(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch, {"ttft": "raise"})
    assert driver.main([json.dumps(make_plan(tmp_path, tokenizer="/m"))]) == 1
    out = capsys.readouterr()
    doc = marker_doc(out.out)
    assert list(doc["results"]) == ["decode"]
    assert doc["errors"] == {"ttft": "RuntimeError: Initial test run failed"}
    assert [args.label for args, _key in fake.calls] == ["decode", "ttft"]
    assert "Traceback" in out.err


def test_a_case_over_its_budget_is_cancelled(tmp_path, monkeypatch, capsys):
    FakeVllm(monkeypatch, {"decode": "hang"})
    assert driver.main([json.dumps(make_plan(tmp_path, tokenizer="/m", timeout=1))]) == 1
    doc = marker_doc(capsys.readouterr().out)
    assert doc["errors"] == {"decode": "not finished within 1 s (benchmark_timeout)"}


def test_arguments_vllm_refuses(tmp_path, monkeypatch, capsys):
    FakeVllm(monkeypatch)
    plan = make_plan(tmp_path, tokenizer="/m")
    plan["cases"][0]["argv"] = plan["cases"][0]["argv"] + ["--no-such-flag"]
    assert driver.main([json.dumps(plan)]) == 1
    errors = marker_doc(capsys.readouterr().out)["errors"]
    assert errors == {"decode": "vllm bench serve refused the arguments (exit 2)"}


def test_without_the_coroutine_main_is_called(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch, coroutine=False)
    assert driver.main([json.dumps(make_plan(tmp_path, tokenizer="/m", concurrency=(2,)))]) == 0
    assert len(marker_doc(capsys.readouterr().out)["results"]) == 3 and len(fake.calls) == 3


def test_no_vllm_in_the_container(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm... raises ImportError
    monkeypatch.setitem(sys.modules, "vllm.benchmarks.serve", None)
    assert driver.main([json.dumps(make_plan(tmp_path))]) == 1
    assert "cannot import vLLM's benchmark" in marker_doc(capsys.readouterr().out)["errors"]["import"]


def test_a_bad_plan_exits_2(capsys):
    assert driver.main(["[]"]) == 2
    assert "the plan must be a JSON object" in capsys.readouterr().err


def test_the_whole_runs_time_is_reported_with_vllms_import(tmp_path, monkeypatch, capsys):
    FakeVllm(monkeypatch)
    clock = iter([100.0, 141.5])
    monkeypatch.setattr(driver, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    assert driver.main([json.dumps(make_plan(tmp_path, tokenizer="/models/m", concurrency=(1,)))]) == 0
    assert marker_doc(capsys.readouterr().out)["elapsed_s"] == 41.5


def test_the_short_benchmarks_plan_runs_as_planned(tmp_path, monkeypatch, capsys):
    fake = FakeVllm(monkeypatch)
    params = _bench.baseline_params(input_tokens=32, output_tokens=16, decode_prompts=2, concurrency=4, prompts=4)
    result_dir = str(tmp_path / "short")
    cases = _bench.plan_baseline(port=8000, served_model_name="glm-5.3-flash", tokenizer="/models/m", params=params,
                                 result_dir=result_dir, seed=9)
    plan = _bench.driver_plan(cases, port=8000, served_model_name="glm-5.3-flash", result_dir=result_dir,
                              case_timeout=60, resolve_tokenizer=False)
    assert driver.main([json.dumps(plan)]) == 0
    doc = marker_doc(capsys.readouterr().out)
    assert doc["results"] == {"decode": {"label": "decode", "max_concurrency": 1},
                              "concurrency-4": {"label": "concurrency-4", "max_concurrency": 4}}
    assert [(args.num_prompts, args.random_input_len, args.random_output_len) for args, _key in fake.calls] == [
        ("2", "32", "16"), ("4", "32", "16")]
