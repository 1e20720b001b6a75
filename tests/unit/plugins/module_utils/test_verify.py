# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify judge: recorded responses and samples in, checks out."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _verify as v

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "verify")
URL = "http://10.77.1.11:8000"
MODEL = "glm-5.3-flash"


def read(name: str) -> str:
    with open(os.path.join(FIX, name), encoding="utf-8") as handle:
        return handle.read()


def ok(name: str, elapsed: int = 1) -> dict:
    """A uri result with a 200 and the fixture as body (uri fills both json and content)."""
    text = read(name)
    return {"status": 200, "json": json.loads(text), "content": text, "elapsed": elapsed, "msg": "OK (unknown bytes)"}


REFUSED = {"status": -1, "elapsed": 0, "url": URL + "/v1/models",
           "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"}
TIMED_OUT = {"status": -1, "elapsed": 300, "msg": "Status code was -1 and not [200]: Request failed: <urlopen error timed out>"}


def sample(name: str, start: str) -> dict:
    return {"rc": 0, "stdout": read(name), "stderr": "", "start": start, "end": start[:-3] + "900"}


DEAD = {"rc": 1, "stdout": "", "stderr": "Error response from daemon: container 4f1c is not running", "start": "2026-11-30 21:00:00.000000",
        "end": "2026-11-30 21:00:00.100000"}


# ------------------------------------------------------------------------------------------ models
def test_models_good_with_expected_len():
    c = v.judge_models(ok("models_good.json"), "lab-worker", URL, MODEL, 4096)
    assert (c.result, c.node, c.data["max_model_len"]) == ("pass", "lab-worker", 4096)
    assert "as expected" in c.evidence


def test_models_good_without_expected_len_is_not_compared():
    c = v.judge_models(ok("models_good.json"), "controller", URL, MODEL, None)
    assert c.result == "pass" and "as expected" not in c.evidence


@pytest.mark.parametrize("response, model, max_len, needle", [
    (REFUSED, MODEL, None, "connection refused"),
    (TIMED_OUT, MODEL, None, "timed out"),
    ({"status": 401, "json": {"error": "Unauthorized"}, "elapsed": 0}, MODEL, None, "HTTP 401"),
    ("models_good.json", "other-model", None, "not 'other-model'"),
    ("models_good.json", MODEL, 262144, "expected 262144"),
    ({"status": 200, "content": "<html>nginx</html>", "elapsed": 0}, MODEL, None, "without a model list"),
])
def test_models_failures_name_the_problem(response, model, max_len, needle):
    resp = ok(response) if isinstance(response, str) else response
    c = v.judge_models(resp, "lab-worker", URL, model, max_len)
    assert c.result == "fail"
    assert needle in c.evidence
    assert c.cause and c.fix


def test_refused_cause_mentions_firewall():
    c = v.judge_models(REFUSED, "lab-worker", URL, MODEL)
    assert "firewall" in c.cause and "iptables" in c.fix


def test_models_skipped_task_result():
    assert v.judge_models({"skipped": True}, "lab-head", URL, MODEL).result == "skipped"


# ------------------------------------------------------------------------------------------ containers
@pytest.mark.parametrize("info, result, needle", [
    ({"exists": True, "container": {"State": {"Running": True, "StartedAt": "2026-11-30T21:00:00Z"}}}, "pass", "running"),
    ({"exists": True, "container": {"State": {"Running": False, "Status": "exited", "ExitCode": 137}}}, "fail", "exited"),
    ({"exists": False, "container": None}, "fail", "no serve container"),
    ({}, "fail", "no serve container"),
])
def test_containers(info, result, needle):
    [c] = v.judge_containers([{"node": "lab-worker", "role": "worker", "info": info}])
    assert (c.result, c.node) == (result, "lab-worker")
    assert needle in c.evidence


# ------------------------------------------------------------------------------------------ chat
def test_chat_good_passes_both():
    chat, parser = v.judge_chat(ok("chat_good.json"), URL)
    assert (chat.result, parser.result) == ("pass", "pass")
    assert chat.data["completion_tokens"] == 15


def test_chat_empty_fails_both():
    chat, parser = v.judge_chat(ok("chat_empty.json"), URL)
    assert (chat.result, parser.result) == ("fail", "fail")
    assert "no text" in chat.evidence


def test_reasoning_only_is_text_but_parser_fails():
    chat, parser = v.judge_chat(ok("chat_reasoning_only.json"), URL)
    assert (chat.result, parser.result) == ("pass", "fail")
    assert "reasoning-parser" in parser.fix


def test_chat_500_fails_and_skips_parser():
    resp = {"status": 500, "json": {"object": "error", "message": "EngineCore encountered an issue", "code": 500}, "elapsed": 2}
    chat, parser = v.judge_chat(resp, URL)
    assert (chat.result, parser.result) == ("fail", "skipped")
    assert "EngineCore encountered an issue" in chat.evidence and "dead rank" in chat.cause
    # the parser check says why it was not judged, and does not repeat the request's failure as its own
    assert (parser.evidence, parser.cause, parser.fix, parser.node) == ("no completion to judge", None, None, "controller")


def test_chat_without_a_message_skips_the_parser_with_its_reason():
    chat, parser = v.judge_chat({"status": 200, "json": {"object": "chat.completion", "choices": []}}, URL, node="lab-worker")
    assert (chat.result, parser.result, parser.evidence, parser.node) == ("fail", "skipped", "no completion to judge", "lab-worker")


def test_chat_not_sent_reason_is_shown():
    chat, parser = v.judge_chat({"skipped": True, "false_condition": "__verify_api_ok"}, URL, not_sent="API down")
    assert chat.result == parser.result == "skipped"
    assert "API down" in chat.evidence
    assert parser.evidence == chat.evidence == "not sent: API down"


# ------------------------------------------------------------------------------------------ tool call
def test_tool_good():
    c = v.judge_tool_call(ok("tool_good.json"), URL, "get_weather")
    assert c.result == "pass"
    assert c.data["arguments"] == [{"city": "Paris", "unit": "celsius"}]


def test_tool_broken_json_is_truncation():
    c = v.judge_tool_call(ok("tool_broken_json.json"), URL, "get_weather")
    assert c.result == "fail"
    assert "not JSON" in c.evidence and "max_tokens" in c.cause


def test_tool_none_blames_parser():
    c = v.judge_tool_call(ok("tool_none.json"), URL, "get_weather")
    assert c.result == "fail" and "tool-call-parser" in c.fix


@pytest.mark.parametrize("arguments, needle", [
    ('["Paris"]', "not a JSON object"),
    ("null", "not a JSON object"),
])
def test_tool_arguments_must_be_an_object(arguments, needle):
    resp = ok("tool_good.json")
    resp["json"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    c = v.judge_tool_call(resp, URL, "get_weather")
    assert c.result == "fail" and needle in c.evidence and "guided decoding" in c.cause


def test_tool_wrong_function_name():
    c = v.judge_tool_call(ok("tool_good.json"), URL, "get_time")
    assert c.result == "fail" and "not 'get_time'" in c.evidence


# ------------------------------------------------------------------------------------------ UTF-8
def test_utf8_good():
    c = v.judge_utf8(ok("chat_utf8_good.json"), URL)
    assert c.result == "pass" and c.data["non_ascii_chars"] > 20


def test_utf8_fffd_fails_with_issue():
    c = v.judge_utf8(ok("chat_utf8_fffd.json"), URL)
    assert c.result == "fail"
    assert "4 U+FFFD" in c.evidence and "54150" in c.cause


@pytest.mark.parametrize("text, problems", [
    ("plain", 0),
    ("a\ufffdb", 1),
    ("lone \ud800 surrogate", 1),
    ("\ufffd\ud800", 2),
])
def test_utf8_problems(text, problems):
    assert len(v.utf8_problems(text)) == problems


def test_utf8_invalid_raw_bytes():
    resp = ok("chat_utf8_good.json")
    resp["content"] = b'{"x": "\xff"}'
    c = v.judge_utf8(resp, URL)
    assert c.result == "fail" and "not valid UTF-8" in c.evidence


# ------------------------------------------------------------------------------------------ busy (CPU)
def test_parse_proc_stat_comm_with_spaces_and_parens():
    stats = v.parse_proc_stat(read("proc_stat_head_after.txt"))
    assert stats[118] == (7000 + 160 * 3, 1200 + 160)
    assert set(stats) == {1, 61, 118, 402, 409}


@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("100\n", {}),
    ("12 (x) S 1 2", {}),
    ("abc (x) S 1 1 1 0 -1 0 0 0 0 0 5 6", {}),
])
def test_parse_proc_stat_ignores_junk(text, expected):
    assert v.parse_proc_stat(text) == expected


def _cpu_samples(role: str, after: str | None = None):
    return [sample(f"proc_stat_{role}_idle_start.txt", "2026-11-30 21:00:00.000000"),
            sample(f"proc_stat_{role}_before.txt", "2026-11-30 21:00:03.000000"),
            sample(after or f"proc_stat_{role}_after.txt", "2026-11-30 21:00:09.000000")]


@pytest.mark.parametrize("role", ["head", "worker"])
def test_busy_cpu_pass(role):
    c = v.judge_busy_cpu(f"lab-{role}", _cpu_samples(role), True)
    assert c.result == "pass"
    assert c.data["busy_cpu_seconds"] > 1.0


def test_busy_cpu_idle_rank_fails_naming_node():
    c = v.judge_busy_cpu("lab-worker", _cpu_samples("worker", "proc_stat_worker_idle_after.txt"), True)
    assert c.result == "fail" and "lab-worker" in c.cause
    assert c.data["busy_cpu_seconds"] == 0.0


def test_busy_cpu_dead_rank_fails():
    samples = _cpu_samples("worker")
    samples[2] = DEAD
    c = v.judge_busy_cpu("lab-worker", samples, True)
    assert c.result == "fail" and "not running" in c.evidence and "dead" in c.cause


def test_busy_cpu_no_judgement_when_completion_failed():
    assert v.judge_busy_cpu("lab-head", _cpu_samples("head"), False).result == "skipped"


def test_busy_cpu_rate_must_beat_idle():
    # the rank burnt as much while idle as during the completion: not working for the cluster
    samples = _cpu_samples("head")
    samples[0] = dict(samples[0], stdout=read("proc_stat_head_idle_start.txt"))
    samples[1] = dict(samples[1], stdout=read("proc_stat_head_after.txt"), start="2026-11-30 21:00:03.000000")
    samples[2] = dict(samples[2], stdout=read("proc_stat_head_after.txt").replace(" 7480 1360 ", " 7700 1400 "))
    c = v.judge_busy_cpu("lab-head", samples, True, min_cpu_seconds=0.1)
    assert c.result == "fail"


def test_busy_cpu_needs_three_samples():
    with pytest.raises(v.VerifyError):
        v.judge_busy_cpu("lab-head", _cpu_samples("head")[:2], True)


# ------------------------------------------------------------------------------------------ busy (GPU)
def test_nvidia_smi_gb10_na_memory():
    rows = v.parse_nvidia_smi_csv(read("nvidia_smi_gb10_busy.csv"))
    assert len(rows) == 5
    assert rows[1] == {"index": 0.0, "name": "NVIDIA GB10", "utilization.gpu": 87.0, "memory.used": None,
                       "memory.total": None}


def test_nvidia_smi_repeated_header_and_not_supported():
    text = read("nvidia_smi_gb10_idle.csv") + read("nvidia_smi_gb10_idle.csv")
    rows = v.parse_nvidia_smi_csv(text)
    assert len(rows) == 8 and all(r["memory.used"] is None for r in rows)


def test_nvidia_smi_without_header_is_refused():
    with pytest.raises(v.VerifyError):
        v.parse_nvidia_smi_csv("0, NVIDIA GB10, 3 %, [N/A], [N/A]\n")


def test_busy_gpu_pass_reports_memory_not_reported():
    c = v.judge_busy_gpu("spark-2", {"rc": 124, "stdout": read("nvidia_smi_gb10_busy.csv")}, True)
    assert c.result == "pass" and "peak 96%" in c.evidence and "[N/A]" in c.evidence


def test_busy_gpu_idle_fails_naming_node():
    c = v.judge_busy_gpu("spark-2", {"rc": 124, "stdout": read("nvidia_smi_gb10_idle.csv")}, True)
    assert c.result == "fail" and "spark-2" in c.cause


@pytest.mark.parametrize("smp", [None, {"skipped": True}, {"rc": 127, "stdout": "", "stderr": "nvidia-smi: not found"}])
def test_busy_gpu_no_sample_fails(smp):
    assert v.judge_busy_gpu("spark-1", smp, True).result == "fail"


# ------------------------------------------------------------------------------------------ plan
def test_sampling_from_recipe_generation_config():
    text = '{"temperature": 1.0, "eos_token_id": [2, 9, 10], "do_sample": true}'
    assert v.sampling_from_generation_config(text) == {"temperature": 1.0}


def test_sampling_overrides_and_removal():
    text = '{"temperature": 1.0, "top_p": 0.95}'
    assert v.sampling_from_generation_config(text, {"temperature": 0.6, "top_p": None, "top_k": 40}) == \
        {"temperature": 0.6, "top_k": 40}


@pytest.mark.parametrize("text, overrides", [("{not json", None), ("[1]", None), ("", {"seed": 1})])
def test_sampling_errors(text, overrides):
    with pytest.raises(v.VerifyError):
        v.sampling_from_generation_config(text, overrides)


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
PROMPTS = {"chat": "hi", "utf8": "你好", "tool_call": "weather?", "busy": "story"}
MAXT = {"chat": 8, "utf8": 8, "tool_call": 64, "busy": 256}


@pytest.mark.parametrize("mode, choice", [
    ("named", {"type": "function", "function": {"name": "get_weather"}}),
    ("required", "required"),
])
def test_plan_requests(mode, choice):
    plan = v.plan_requests(MODEL, {"temperature": 1.0}, PROMPTS, TOOL, mode, MAXT)
    assert plan["tool_call"]["tool_choice"] == choice
    assert plan["busy"]["ignore_eos"] is True and plan["busy"]["max_tokens"] == 256
    for body in plan.values():
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["temperature"] == 1.0 and body["model"] == MODEL
    assert "tools" not in plan["chat"]


@pytest.mark.parametrize("prompts, tool, mode, maxt", [
    ({**PROMPTS, "utf8": ""}, TOOL, "named", MAXT),
    (PROMPTS, {"type": "function", "function": {}}, "named", MAXT),
    (PROMPTS, TOOL, "auto", MAXT),
    (PROMPTS, TOOL, "named", {**MAXT, "busy": 0}),
])
def test_plan_errors(prompts, tool, mode, maxt):
    with pytest.raises(v.VerifyError):
        v.plan_requests(MODEL, {}, prompts, tool, mode, maxt)


# ------------------------------------------------------------------------------------------ report
def _healthy(**over):
    args = dict(
        served_model_name=MODEL, url=URL, max_model_len=4096,
        containers=[{"node": n, "role": r, "info": {"exists": True, "container": {"State": {"Running": True}}}}
                    for n, r in (("lab-head", "head"), ("lab-worker", "worker"))],
        models=[{"node": n, "response": ok("models_good.json")} for n in ("lab-head", "lab-worker", "controller")],
        chat=ok("chat_good.json"), tool_call=ok("tool_good.json"), tool_name="get_weather",
        utf8=ok("chat_utf8_good.json"),
        busy={"mode": "cpu", "completion": ok("chat_good.json", 5), "min_cpu_seconds": 0.5,
              "nodes": [{"node": "lab-head", "samples": _cpu_samples("head")},
                        {"node": "lab-worker", "samples": _cpu_samples("worker")}]},
        meta={"started": "2026-11-30T21:00:00Z"})
    args.update(over)
    return v.judge_all(**args)


def test_report_healthy():
    report = _healthy()
    assert report["ok"] and report["message"] == ""
    assert report["counts"] == {"pass": 12, "fail": 0, "skipped": 0}
    assert json.loads(json.dumps(report))["meta"]["started"] == "2026-11-30T21:00:00Z"
    assert "rank_busy" in report["table"] and "12 passed, 0 failed, 0 skipped" in report["table"]


def test_report_idle_rank_fails_naming_it():
    report = _healthy(busy={"mode": "cpu", "completion": ok("chat_good.json"), "nodes": [
        {"node": "lab-head", "samples": _cpu_samples("head")},
        {"node": "lab-worker", "samples": _cpu_samples("worker", "proc_stat_worker_idle_after.txt")}]})
    assert not report["ok"]
    assert [(c["name"], c["node"]) for c in report["failed"]] == [("rank_busy", "lab-worker")]
    assert "rank_busy on lab-worker" in report["message"] and "cause:" in report["message"]


def test_report_unreachable_api_names_it():
    models = [{"node": "lab-head", "response": ok("models_good.json")},
              {"node": "lab-worker", "response": REFUSED}, {"node": "controller", "response": REFUSED}]
    skipped = {"skipped": True}
    report = _healthy(models=models, chat=skipped, tool_call=skipped, utf8=skipped,
                      busy={"mode": "skip", "reason": "the API did not answer the controller", "completion": skipped,
                            "nodes": [{"node": "lab-head"}, {"node": "lab-worker"}]},
                      not_sent_reason="the API did not answer the controller")
    assert not report["ok"]
    expected = {("api_models", "lab-worker"), ("api_models", "controller")}
    assert {(c["name"], c["node"]) for c in report["failed"]} == expected
    assert "connection refused" in report["message"]
    assert report["counts"]["skipped"] == 6


def test_report_failed_long_completion_is_reported():
    report = _healthy(busy={"mode": "gpu", "completion": TIMED_OUT, "nodes": [
        {"node": "spark-1", "sample": {"rc": 124, "stdout": read("nvidia_smi_gb10_busy.csv")}}]})
    names = {(c["name"], c["result"]) for c in report["checks"]}
    assert ("long_completion", "fail") in names and ("rank_busy", "skipped") in names


def test_report_bad_busy_mode():
    with pytest.raises(v.VerifyError):
        _healthy(busy={"mode": "tpu", "nodes": []})


def test_check_rejects_unknown_result():
    with pytest.raises(v.VerifyError):
        v.Check("x", "maybe", "e")


def test_table_cuts_long_evidence():
    report = v.build_report([v.Check("x", "pass", "e" * 500, node="n", seconds=1.25)])
    table = v.render_table(report, width=80)
    first = table.splitlines()[1]
    assert first.endswith("...") and len(first) <= 80
    assert first.split()[:3] == ["x", "n", "PASS"] and first.split()[3] in ("1.2", "1.3")
