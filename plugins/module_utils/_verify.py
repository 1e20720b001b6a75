# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verification of a serving vLLM cluster: raw HTTP answers and node samples in, judged checks out.

Private to the collection; may change at any time. Pure: the role does the I/O (ansible.builtin.uri from
every node and from the controller, docker inspect, /proc/<pid>/stat or nvidia-smi samples) and hands the
raw results here. Every decision (what passes, what the likely cause is, what to do about it) is made here.

A "response" is the result dict of ansible.builtin.uri (keys status, json, content, msg, elapsed, url);
a "sample" is the result dict of ansible.builtin.command (keys rc, stdout, stderr, start, end).
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

PASS = "pass"
FAIL = "fail"
SKIPPED = "skipped"
RESULTS = (PASS, FAIL, SKIPPED)

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
REPLACEMENT_CHAR = "\ufffd"
NOT_REPORTED = ("[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "")


class VerifyError(ValueError):
    """Input the judge cannot interpret (a programming or wiring error, not a failed check)."""


@dataclass
class Check:
    """One judged check, on one node (or the cluster, node None)."""

    name: str
    result: str
    evidence: str
    node: str | None = None
    cause: str | None = None
    fix: str | None = None
    seconds: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise VerifyError(f"check {self.name!r}: result {self.result!r} is not one of {', '.join(RESULTS)}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ helpers
def _elapsed(response: Mapping[str, Any] | None) -> float | None:
    if not response:
        return None
    value = response.get("elapsed")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _status(response: Mapping[str, Any] | None) -> int:
    if not response:
        return -1
    status = response.get("status", -1)
    try:
        return int(status)
    except (TypeError, ValueError):
        return -1


def _body(response: Mapping[str, Any]) -> Any:
    """The parsed JSON body: uri's `json`, else `content` parsed, else None."""
    body = response.get("json")
    if body is not None:
        return body
    content = response.get("content")
    if isinstance(content, str) and content.strip():
        try:
            return json.loads(content)
        except ValueError:
            return None
    return None


def _short(text: Any, limit: int = 160) -> str:
    value = str(text if text is not None else "")
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _error_message(response: Mapping[str, Any]) -> str:
    body = _body(response)
    if isinstance(body, Mapping):
        err = body.get("error", body.get("message", body.get("detail")))
        if isinstance(err, Mapping):
            err = err.get("message", err)
        if err:
            return _short(err)
    return _short(response.get("msg") or response.get("content") or "no answer")


def http_failure(response: Mapping[str, Any] | None, what: str, url: str) -> tuple[str, str, str]:
    """(evidence, cause, fix) for an HTTP exchange that did not return 200."""
    status = _status(response)
    msg = _error_message(response or {})
    lowered = msg.lower()
    if status == -1 or status == 0:
        if "refused" in lowered:
            return (f"{what}: connection refused ({url}): {msg}",
                    "nothing accepts connections on the API port from here: the head's engine is not serving "
                    "(still loading, or dead), or a firewall on the head rejects the port",
                    "check the head: `docker logs` of the serve container, `ss -ltn` for the port, and "
                    "`iptables -S INPUT` for a REJECT rule on the port; run playbooks/status.yml")
        if "timed out" in lowered or "timeout" in lowered:
            return (f"{what}: timed out ({url}): {msg}",
                    "the request was accepted but not answered in time: a hung engine (a rank lost during "
                    "generation, a stalled handshake) or the first request's kernel compile still running",
                    "run playbooks/status.yml and the logs playbook; if the engine is only slow, raise "
                    "verify_request_timeout")
        if "no route" in lowered or "unreachable" in lowered or "name or service" in lowered:
            return (f"{what}: no route to {url}: {msg}",
                    "this machine cannot reach the head's address (wrong IP, link down, or not on that network)",
                    "check dgxspark_vllm_cx7_ip of the head and the link; from the controller, set "
                    "verify_controller_api_host to an address the controller can reach")
        return (f"{what}: request failed ({url}): {msg}", "the HTTP request did not complete",
                "check the head's address and port, and that the serve container runs")
    if status == 401:
        return (f"{what}: HTTP 401 ({url}): {msg}",
                "the server requires an API key and the one sent is missing or wrong",
                "set dgxspark_vllm_api_key to the key the engine was launched with (relaunch after a change)")
    if status == 404:
        return (f"{what}: HTTP 404 ({url}): {msg}",
                "the model name is not served under that name, or the endpoint does not exist",
                "compare dgxspark_vllm_served_model_name with --served-model-name of the running container")
    if status == 400:
        return (f"{what}: HTTP 400 ({url}): {msg}",
                "the engine refused the request (a parameter its flags do not allow, e.g. tools without "
                "--enable-auto-tool-choice, or a prompt over max_model_len)",
                "read the message; check the launch flags for the tool and reasoning parsers")
    if status >= 500:
        return (f"{what}: HTTP {status} ({url}): {msg}",
                "the engine failed while serving the request (a dead rank, an engine error, or a kernel "
                "compile failing on the first request)",
                "read the head's serve log (playbooks/logs.yml) and the worker's; a dead rank needs a relaunch "
                "of the whole group")
    return (f"{what}: HTTP {status} ({url}): {msg}", f"unexpected HTTP status {status}",
            "read the head's serve log")


def not_sent_response(response: Mapping[str, Any] | None) -> bool:
    """True for a request that was not sent: None, or a task result Ansible skipped."""
    return response is None or bool(response.get("skipped"))


def request_outcome(name: str, response: Mapping[str, Any] | None, what: str, url: str, node: str,
                    skipped: str) -> Check | None:
    """The check a request ends as before its body is judged: skipped when not sent, failed on a non-200
    answer; None when there is a 200 answer to judge."""
    if not_sent_response(response):
        return Check(name, SKIPPED, skipped, node=node)
    if _status(response) != 200:
        evidence, cause, fix = http_failure(response, what, url)
        return Check(name, FAIL, evidence, node=node, cause=cause, fix=fix, seconds=_elapsed(response))
    return None


def _message(body: Any) -> Mapping[str, Any] | None:
    if not isinstance(body, Mapping):
        return None
    choices = body.get("choices")
    if not isinstance(choices, Sequence) or isinstance(choices, (str, bytes)) or not choices:
        return None
    first = choices[0]
    if not isinstance(first, Mapping):
        return None
    message = first.get("message")
    return message if isinstance(message, Mapping) else None


def _finish_reason(body: Any) -> str | None:
    try:
        return body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _reasoning(message: Mapping[str, Any]) -> str:
    return _text(message.get("reasoning_content")) or _text(message.get("reasoning"))


# ---------------------------------------------------------------------------------- sampling, plan
def sampling_from_generation_config(text: str | None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Sampling parameters from a checkpoint's generation_config.json text, overridden by `overrides`.

    Only SAMPLING_KEYS are taken; a missing or unreadable file gives {} (the engine's own defaults).
    An override of None removes the key.
    """
    sampling: dict[str, Any] = {}
    if text and text.strip():
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise VerifyError(f"generation_config.json is not valid JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise VerifyError("generation_config.json is not a JSON object")
        for key in SAMPLING_KEYS:
            if key in data and data[key] is not None and not isinstance(data[key], bool):
                sampling[key] = data[key]
    for key, value in (overrides or {}).items():
        if key not in SAMPLING_KEYS:
            raise VerifyError(f"sampling override {key!r} is not one of {', '.join(SAMPLING_KEYS)}")
        if value is None:
            sampling.pop(key, None)
        else:
            sampling[key] = value
    return sampling


def tool_choice_value(mode: str, tool_name: str) -> Any:
    """The request's tool_choice: a named function or the string "required"."""
    if mode == "named":
        return {"type": "function", "function": {"name": tool_name}}
    if mode == "required":
        return "required"
    raise VerifyError(f"tool choice mode {mode!r} is not 'named' or 'required'")


def plan_requests(model: str, sampling: Mapping[str, Any], prompts: Mapping[str, str], tool: Mapping[str, Any],
                  tool_choice: str, max_tokens: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Request bodies for the chat, tool-call, UTF-8 and busy-rank completions (thinking disabled)."""
    for key in ("chat", "utf8", "tool_call", "busy"):
        if not prompts.get(key):
            raise VerifyError(f"prompt {key!r} is missing or empty")
        if int(max_tokens.get(key, 0)) < 1:
            raise VerifyError(f"max_tokens for {key!r} must be >= 1")
    function = tool.get("function") if isinstance(tool.get("function"), Mapping) else None
    if tool.get("type") != "function" or function is None or not function.get("name"):
        raise VerifyError("the tool must be {type: function, function: {name: ..., parameters: {...}}}")
    base = {"model": model, "chat_template_kwargs": {"enable_thinking": False}, **dict(sampling)}

    def body(key: str, **extra: Any) -> dict[str, Any]:
        return {**base, "messages": [{"role": "user", "content": prompts[key]}],
                "max_tokens": int(max_tokens[key]), **extra}

    return {
        "chat": body("chat"),
        "utf8": body("utf8"),
        "tool_call": body("tool_call", tools=[dict(tool)],
                          tool_choice=tool_choice_value(tool_choice, str(function["name"]))),
        "busy": body("busy", ignore_eos=True),
    }


# ------------------------------------------------------------------------------------ API checks
def judge_models(response: Mapping[str, Any] | None, node: str, url: str, served_model_name: str,
                 max_model_len: int | None = None) -> Check:
    """`/v1/models` fetched from `node`: reachable, serving `served_model_name`, with max_model_len."""
    name = "api_models"
    early = request_outcome(name, response, f"GET /v1/models from {node}", url, node, f"not requested from {node}")
    if early is not None:
        return early
    seconds = _elapsed(response)
    body = _body(response)
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        return Check(name, FAIL, f"/v1/models from {node} answered 200 without a model list: {_short(body)}",
                     node=node, cause="something other than vLLM answers on the port",
                     fix="check which process listens on the API port on the head", seconds=seconds)
    ids = [m.get("id") for m in data if isinstance(m, Mapping)]
    match = next((m for m in data if isinstance(m, Mapping) and m.get("id") == served_model_name), None)
    if match is None:
        return Check(name, FAIL, f"/v1/models from {node} lists {ids}, not {served_model_name!r}", node=node,
                     cause="the engine serves under another name (an older or different launch)",
                     fix="relaunch with the launch role, or set dgxspark_vllm_served_model_name to what runs",
                     seconds=seconds, data={"models": ids})
    served_len = match.get("max_model_len")
    data_out = {"models": ids, "max_model_len": served_len, "root": match.get("root")}
    if max_model_len is not None and served_len != max_model_len:
        return Check(name, FAIL,
                     f"{served_model_name!r} is served with max_model_len {served_len}, expected {max_model_len}",
                     node=node, cause="the running engine was launched with another --max-model-len",
                     fix="relaunch (the launch role restarts a group whose config hash differs)",
                     seconds=seconds, data=data_out)
    len_text = f", max_model_len {served_len}" + (" as expected" if max_model_len is not None else "")
    return Check(name, PASS, f"{url} from {node}: {served_model_name!r}{len_text}", node=node,
                 seconds=seconds, data=data_out)


def judge_containers(states: Sequence[Mapping[str, Any]]) -> list[Check]:
    """One check per node from community.docker.docker_container_info results ({node, role, info})."""
    checks = []
    for item in states:
        node = str(item.get("node"))
        info = item.get("info") or {}
        container = info.get("container") or {}
        state = container.get("State") or {}
        if not info.get("exists"):
            checks.append(Check("rank_container", FAIL, f"no serve container on {node}", node=node,
                                cause=f"the {item.get('role', 'rank')} on {node} was never started or was removed",
                                fix="relaunch the whole group (playbooks/launch.yml); one rank alone never serves"))
        elif not state.get("Running"):
            checks.append(Check("rank_container", FAIL,
                                f"serve container on {node} is {state.get('Status', 'not running')} "
                                f"(exit code {state.get('ExitCode')}, finished {state.get('FinishedAt')})",
                                node=node, cause=f"the {item.get('role', 'rank')} on {node} died",
                                fix="read its log (playbooks/logs.yml), then relaunch the whole group, head "
                                    "first down, workers first up"))
        else:
            checks.append(Check("rank_container", PASS,
                                f"serve container on {node} running since {state.get('StartedAt')}", node=node,
                                data={"started_at": state.get("StartedAt")}))
    return checks


def judge_chat(response: Mapping[str, Any] | None, url: str, node: str = "controller",
               not_sent: str = "not requested") -> list[Check]:
    """One real chat completion (thinking disabled): non-empty text, and content non-empty (reasoning parser)."""
    early = request_outcome("chat_completion", response, "POST /v1/chat/completions", url, node, f"not sent: {not_sent}")
    if early is not None:
        follow = early.evidence if early.result == SKIPPED else "no completion to judge"
        return [early, Check("reasoning_parser", SKIPPED, follow, node=node)]
    seconds = _elapsed(response)
    body = _body(response)
    message = _message(body)
    if message is None:
        return [Check("chat_completion", FAIL, f"200 without choices[0].message: {_short(body)}", node=node,
                      cause="the answer is not an OpenAI chat completion", fix="check what serves on the port",
                      seconds=seconds),
                Check("reasoning_parser", SKIPPED, "no completion to judge", node=node)]
    content = _text(message.get("content"))
    reasoning = _reasoning(message)
    usage = body.get("usage") if isinstance(body, Mapping) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    data = {"content_chars": len(content), "reasoning_chars": len(reasoning), "completion_tokens": tokens,
            "finish_reason": _finish_reason(body)}
    checks = []
    if content.strip() or reasoning.strip():
        checks.append(Check("chat_completion", PASS,
                            f"{tokens} tokens, text {_short(content or reasoning, 80)!r}", node=node,
                            seconds=seconds, data=data))
    else:
        checks.append(Check("chat_completion", FAIL, f"HTTP 200 but no text (completion_tokens {tokens}, "
                            f"finish_reason {data['finish_reason']})", node=node,
                            cause="the engine answers but generates nothing: a broken checkpoint, a chat "
                                  "template that ends the turn at once, or an EOS on the first token",
                            fix="send the same request by hand and read the head's log; check the checkpoint",
                            seconds=seconds, data=data))
    if content.strip():
        checks.append(Check("reasoning_parser", PASS,
                            f"content has {len(content)} characters with enable_thinking false", node=node, data=data))
    elif reasoning.strip():
        checks.append(Check("reasoning_parser", FAIL,
                            f"content empty, reasoning_content has {len(reasoning)} characters with thinking disabled",
                            node=node,
                            cause="the reasoning parser put the whole answer in reasoning_content: the parser "
                                  "does not match the model, or chat_template_kwargs was not applied",
                            fix="launch with the recipe's --reasoning-parser glm45 and check that the chat template "
                                "honours enable_thinking", data=data))
    else:
        checks.append(Check("reasoning_parser", FAIL, "content and reasoning_content are both empty", node=node,
                            cause="no text at all (see chat_completion)", fix="see chat_completion", data=data))
    return checks


def judge_tool_call(response: Mapping[str, Any] | None, url: str, tool_name: str, node: str = "controller",
                    not_sent: str = "not requested") -> Check:
    """A forced tool call: parsed tool_calls present, naming the tool, arguments a JSON object."""
    name = "tool_call"
    early = request_outcome(name, response, "POST /v1/chat/completions (forced tool)", url, node, f"not sent: {not_sent}")
    if early is not None:
        return early
    seconds = _elapsed(response)
    body = _body(response)
    message = _message(body)
    calls = message.get("tool_calls") if message is not None else None
    finish = _finish_reason(body)
    if not isinstance(calls, list) or not calls:
        content = _text(message.get("content")) if message is not None else ""
        return Check(name, FAIL, f"no parsed tool_calls (finish_reason {finish}, content {_short(content, 80)!r})",
                     node=node,
                     cause="the tool-call parser did not turn the output into tool_calls: the server runs without "
                           "--enable-auto-tool-choice / --tool-call-parser, or with a parser that does not match "
                           "the model's tool markup",
                     fix="launch with the recipe's --enable-auto-tool-choice --tool-call-parser glm47",
                     seconds=seconds)
    problems = []
    parsed_args = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            problems.append(f"tool_calls[{index}] has no function")
            continue
        if function.get("name") != tool_name:
            problems.append(f"tool_calls[{index}] calls {function.get('name')!r}, not {tool_name!r}")
        raw = function.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else None
        except ValueError as exc:
            problems.append(f"tool_calls[{index}].function.arguments is not JSON ({exc}): {_short(raw, 80)!r}")
            continue
        if not isinstance(args, dict):
            problems.append(f"tool_calls[{index}].function.arguments is not a JSON object: {_short(raw, 80)!r}")
            continue
        parsed_args.append(args)
    data = {"tool_calls": len(calls), "finish_reason": finish, "arguments": parsed_args}
    if problems:
        truncated = finish == "length"
        return Check(name, FAIL, "; ".join(problems), node=node,
                     cause=("the arguments were cut off at max_tokens" if truncated else
                            "the tool call came back malformed although the tool was forced: guided decoding or the "
                            "tool-call parser is broken on this engine"),
                     fix=("raise verify_max_tokens.tool_call" if truncated else
                          "check the --tool-call-parser and the image's structured-output backend"),
                     seconds=seconds, data=data)
    return Check(name, PASS, f"{len(calls)} tool call(s) to {tool_name!r}, arguments {_short(parsed_args, 100)}",
                 node=node, seconds=seconds, data=data)


def utf8_problems(text: str) -> list[str]:
    """What is wrong with `text` as decoded model output: U+FFFD characters, unpaired surrogates."""
    problems = []
    count = text.count(REPLACEMENT_CHAR)
    if count:
        problems.append(f"{count} U+FFFD replacement character(s), first at offset {text.index(REPLACEMENT_CHAR)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        problems.append(f"not encodable as UTF-8 (unpaired surrogate at offset {exc.start})")
    return problems


def judge_utf8(response: Mapping[str, Any] | None, url: str, node: str = "controller",
               not_sent: str = "not requested") -> Check:
    """Token integrity on a non-English prompt: no U+FFFD, valid UTF-8 (vLLM issue #54150)."""
    name = "token_integrity"
    early = request_outcome(name, response, "POST /v1/chat/completions (non-English prompt)", url, node,
                            f"not sent: {not_sent}")
    if early is not None:
        return early
    seconds = _elapsed(response)
    raw = response.get("content")
    problems = []
    if isinstance(raw, bytes):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"the HTTP body is not valid UTF-8 (byte {exc.start})")
    message = _message(_body(response))
    if message is None:
        return Check(name, FAIL, "200 without choices[0].message", node=node, cause="not a chat completion",
                     fix="check what serves on the port", seconds=seconds)
    text = _text(message.get("content")) + _reasoning(message)
    problems += utf8_problems(text)
    data = {"chars": len(text), "non_ascii_chars": sum(1 for ch in text if ord(ch) > 127)}
    if problems:
        return Check(name, FAIL, "; ".join(problems), node=node,
                     cause="the engine emits invalid UTF-8 byte tokens while HTTP stays 200 (the signature of vLLM "
                           "issue #54150, seen with the ModelOpt NVFP4 GLM-5.3-Flash checkpoint)",
                     fix="use the recipe's checkpoint (RedHatAI/GLM-5.3-Flash-NVFP4, compressed-tensors) and an "
                         "image with the fix; do not serve this checkpoint",
                     seconds=seconds, data=data)
    if not text:
        return Check(name, FAIL, "no text to check", node=node, cause="the completion was empty",
                     fix="see chat_completion", seconds=seconds, data=data)
    return Check(name, PASS, f"{data['chars']} characters ({data['non_ascii_chars']} non-ASCII), no U+FFFD, valid UTF-8",
                 node=node, seconds=seconds, data=data)


# --------------------------------------------------------------------------------- busy ranks
def parse_proc_stat(text: str) -> dict[int, tuple[int, int]]:
    """`cat /proc/[0-9]*/stat` output → {pid: (utime, stime)} in clock ticks.

    The comm field may hold spaces and parentheses: fields are counted after the last ')'. Lines that are
    not stat lines (a CLK_TCK line, blank lines, a process that vanished mid-read) are ignored.
    """
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        head, sep, tail = line.rpartition(")")
        if not sep or "(" not in head:
            continue
        pid_text = head.split("(", 1)[0].strip()
        fields = tail.split()
        # after comm: state(0) ppid(1) pgrp(2) session(3) tty_nr(4) tpgid(5) flags(6) minflt(7) cminflt(8)
        # majflt(9) cmajflt(10) utime(11) stime(12)
        if not pid_text.isdigit() or len(fields) < 13:
            continue
        try:
            out[int(pid_text)] = (int(fields[11]), int(fields[12]))
        except ValueError:
            continue
    return out


def _clk_tck(text: str, default: int = 100) -> int:
    for line in text.splitlines():
        value = line.strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
        if value:
            break
    return default


def _timestamp(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
            try:
                return datetime.strptime(value, fmt).timestamp()
            except ValueError:
                continue
    return None


def _sample_time(sample: Mapping[str, Any]) -> float | None:
    start, end = _timestamp(sample.get("start")), _timestamp(sample.get("end"))
    if start is not None and end is not None:
        return (start + end) / 2
    return start if start is not None else end


def cpu_seconds(sample: Mapping[str, Any]) -> float:
    """Total CPU seconds (utime + stime) of the processes in one sample (from the first line's CLK_TCK)."""
    text = str(sample.get("stdout") or "")
    ticks = sum(u + s for u, s in parse_proc_stat(text).values())
    return ticks / _clk_tck(text)


def _sample_error(sample: Mapping[str, Any] | None) -> str | None:
    if not sample:
        return "no sample"
    if sample.get("skipped"):
        return "sample skipped"
    if int(sample.get("rc", 1)) != 0:
        return _short(sample.get("stderr") or sample.get("msg") or f"rc {sample.get('rc')}")
    if not parse_proc_stat(str(sample.get("stdout") or "")):
        return "no engine process found in the container"
    return None


def judge_busy_cpu(node: str, samples: Sequence[Mapping[str, Any] | None], completion_ok: bool,
                   min_cpu_seconds: float = 0.5) -> Check:
    """CPU-time growth of the serve container's processes on `node` during a long completion.

    samples: [idle_start, before, after] (command results). The rank is busy when it used at least
    `min_cpu_seconds` during the completion, and more CPU per second than while idle (the idle baseline is the
    first two samples). A missing sample (container gone) fails; a completion that failed skips the judgement.
    """
    name = "rank_busy"
    if len(samples) != 3:
        raise VerifyError(f"busy samples for {node}: expected 3 (idle start, before, after), got {len(samples)}")
    for label, sample in zip(("idle start", "before", "after"), samples):
        error = _sample_error(sample)
        if error is not None:
            return Check(name, FAIL, f"{node}: cannot sample the serve container ({label}): {error}", node=node,
                         cause=f"the serve container on {node} is not running: that rank is dead",
                         fix="read its log (playbooks/logs.yml), then relaunch the whole group")
    idle0, before, after = samples  # type: ignore[misc]
    times = [_sample_time(s) for s in (idle0, before, after)]  # type: ignore[arg-type]
    cpu = [cpu_seconds(s) for s in (idle0, before, after)]  # type: ignore[arg-type]
    busy = round(cpu[2] - cpu[1], 3)
    data: dict[str, Any] = {"cpu_seconds": [round(c, 3) for c in cpu], "busy_cpu_seconds": busy}
    if None in times:
        raise VerifyError(f"busy samples for {node} lack start/end timestamps")
    idle_wall = times[1] - times[0]  # type: ignore[operator]
    busy_wall = times[2] - times[1]  # type: ignore[operator]
    idle_rate = (cpu[1] - cpu[0]) / idle_wall if idle_wall > 0 else 0.0
    busy_rate = busy / busy_wall if busy_wall > 0 else 0.0
    data.update({"idle_cores": round(idle_rate, 3), "busy_cores": round(busy_rate, 3),
                 "window_seconds": round(busy_wall, 3)})
    if not completion_ok:
        return Check(name, SKIPPED, f"{node}: the long completion failed, nothing to judge "
                     f"({busy:.2f} CPU s in the window)", node=node, seconds=round(busy_wall, 3), data=data)
    evidence = (f"{node}: {busy:.2f} CPU s during the completion ({busy_rate:.2f} cores over {busy_wall:.1f} s; "
                f"idle {idle_rate:.2f} cores)")
    if busy < min_cpu_seconds or busy_rate <= idle_rate:
        return Check(name, FAIL, evidence, node=node,
                     cause=f"the rank on {node} stayed idle while the cluster generated: it is not taking part "
                           "(hung or disconnected from the head), or the engine runs on one node only",
                     fix="run playbooks/status.yml and playbooks/logs.yml; relaunch the whole group",
                     seconds=round(busy_wall, 3), data=data)
    return Check(name, PASS, evidence, node=node, seconds=round(busy_wall, 3), data=data)


def _number(value: str) -> float | None:
    cleaned = value.strip()
    if cleaned.lower() in NOT_REPORTED:
        return None
    cleaned = cleaned.replace("%", "").replace("MiB", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def parse_nvidia_smi_csv(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=... --format=csv[,nounits]` (header once or repeated) → rows.

    Keys are the query names without units (`utilization.gpu`); numeric fields become floats and
    `[N/A]` / `[Not Supported]` (GB10 reports its unified memory that way) become None; text fields stay.
    """
    rows: list[dict[str, Any]] = []
    header: list[str] | None = None
    for record in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not record or not any(cell.strip() for cell in record):
            continue
        if any("utilization." in cell or "memory." in cell or cell.strip() in ("index", "name", "timestamp")
               for cell in record):
            header = [cell.split("[")[0].strip() for cell in record]
            continue
        if header is None:
            raise VerifyError("nvidia-smi CSV without a header line: query with --format=csv (not noheader)")
        row: dict[str, Any] = {}
        for key, cell in zip(header, record):
            if key in ("name", "timestamp", "pci.bus_id", "uuid"):
                row[key] = cell.strip()
            else:
                row[key] = _number(cell)
        rows.append(row)
    return rows


def judge_busy_gpu(node: str, sample: Mapping[str, Any] | None, completion_ok: bool, min_util: float = 10.0) -> Check:
    """nvidia-smi utilisation sampled on `node` while the long completion ran: the peak must reach `min_util`."""
    name = "rank_busy"
    if not sample or sample.get("skipped"):
        return Check(name, FAIL, f"{node}: no nvidia-smi sample", node=node, cause="the sampling did not run",
                     fix="check that nvidia-smi and coreutils' timeout exist on the node")
    rc = int(sample.get("rc", 1))
    # the sampling runs under `timeout`: 124 is its normal end
    if rc not in (0, 124):
        return Check(name, FAIL, f"{node}: nvidia-smi failed (rc {rc}): {_short(sample.get('stderr'))}", node=node,
                     cause="nvidia-smi cannot read the GPU: driver not loaded or the GPU is lost",
                     fix="run nvidia-smi on the node; reboot after an Xid error")
    try:
        rows = parse_nvidia_smi_csv(str(sample.get("stdout") or ""))
    except VerifyError as exc:
        return Check(name, FAIL, f"{node}: {exc}", node=node, cause="unexpected nvidia-smi output",
                     fix="report the output")
    utils = [r["utilization.gpu"] for r in rows if r.get("utilization.gpu") is not None]
    mem = [r.get("memory.used") for r in rows]
    mem_text = ("memory not reported ([N/A]: unified memory)" if rows and all(m is None for m in mem)
                else f"memory used up to {max(m for m in mem if m is not None):.0f} MiB" if rows else "")
    data = {"samples": len(rows), "max_utilization": max(utils) if utils else None,
            "mean_utilization": round(sum(utils) / len(utils), 1) if utils else None, "memory_reported": any(
                m is not None for m in mem)}
    if not utils:
        return Check(name, FAIL, f"{node}: no utilisation values in {len(rows)} sample(s)", node=node,
                     cause="nvidia-smi returned no GPU utilisation", fix="run nvidia-smi on the node", data=data)
    evidence = f"{node}: GPU utilisation peak {max(utils):.0f}% over {len(utils)} samples; {mem_text}"
    if not completion_ok:
        return Check(name, SKIPPED, f"the long completion failed, nothing to judge ({evidence})", node=node, data=data)
    if max(utils) < min_util:
        return Check(name, FAIL, evidence, node=node,
                     cause=f"the GPU on {node} stayed idle while the cluster generated: a hung or disconnected rank "
                           "(docker ps still says Up)",
                     fix="run playbooks/status.yml and playbooks/logs.yml; relaunch the whole group", data=data)
    return Check(name, PASS, evidence, node=node, data=data)


def busy_skipped(nodes: Sequence[str], reason: str) -> list[Check]:
    return [Check("rank_busy", SKIPPED, reason, node=node) for node in nodes]


# ------------------------------------------------------------------------------- report, table
def build_report(checks: Sequence[Check], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report: every check, a count per result, the failed checks, ok."""
    items = [c.as_dict() for c in checks]
    counts = {r: sum(1 for c in checks if c.result == r) for r in RESULTS}
    failed = [c.as_dict() for c in checks if c.result == FAIL]
    return {"ok": not failed, "counts": counts, "checks": items, "failed": failed, "meta": dict(meta or {})}


def render_table(report: Mapping[str, Any], width: int = 100) -> str:
    """A fixed-width table: check, node, result, seconds, evidence (cut to the width)."""
    rows = [("CHECK", "NODE", "RESULT", "SECONDS", "EVIDENCE")]
    for c in report.get("checks", []):
        seconds = c.get("seconds")
        rows.append((c["name"], c.get("node") or "-", c["result"].upper(),
                     "-" if seconds is None else f"{seconds:.1f}", c["evidence"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for row in rows:
        prefix = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4]))
        room = max(20, width - len(prefix) - 2)
        lines.append(f"{prefix}  {_short(row[4], room)}".rstrip())
    counts = report.get("counts", {})
    lines.append(f"{counts.get(PASS, 0)} passed, {counts.get(FAIL, 0)} failed, {counts.get(SKIPPED, 0)} skipped")
    return "\n".join(lines)


def failure_message(report: Mapping[str, Any]) -> str:
    """Every failed check with its node, evidence, likely cause and fix; '' when nothing failed."""
    failed = report.get("failed", [])
    if not failed:
        return ""
    lines = [f"verify: {len(failed)} check(s) failed"]
    for c in failed:
        where = f" on {c['node']}" if c.get("node") else ""
        lines.append(f"- {c['name']}{where}: {c['evidence']}")
        if c.get("cause"):
            lines.append(f"    cause: {c['cause']}")
        if c.get("fix"):
            lines.append(f"    fix:   {c['fix']}")
    return "\n".join(lines)


def judge_all(*, served_model_name: str, url: str, max_model_len: int | None = None,
              containers: Sequence[Mapping[str, Any]] = (), models: Sequence[Mapping[str, Any]] = (),
              chat: Mapping[str, Any] | None = None, tool_call: Mapping[str, Any] | None = None,
              tool_name: str = "", utf8: Mapping[str, Any] | None = None,
              busy: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
              not_sent_reason: str = "not requested") -> dict[str, Any]:
    """Judge everything the role collected; return the report (see build_report) with its table and message.

    models: [{node, response}]; containers: [{node, role, info}];
    busy: {mode: cpu|gpu|skip, completion: response, nodes: [{node, samples: [...]} | {node, sample}],
           min_cpu_seconds, min_utilization, reason}.
    """
    checks: list[Check] = []
    checks += judge_containers(containers)
    checks += [judge_models(m.get("response"), str(m.get("node")), url, served_model_name, max_model_len)
               for m in models]
    checks += judge_chat(chat, url, not_sent=not_sent_reason)
    checks.append(judge_tool_call(tool_call, url, tool_name, not_sent=not_sent_reason))
    checks.append(judge_utf8(utf8, url, not_sent=not_sent_reason))
    if busy:
        mode = busy.get("mode", "skip")
        nodes = busy.get("nodes") or []
        completion = None if mode == "skip" or not_sent_response(busy.get("completion")) else busy.get("completion")
        completion_ok = completion is not None and _status(completion) == 200
        if completion is not None and not completion_ok:
            evidence, cause, fix = http_failure(completion, "POST /v1/chat/completions (long, ignore_eos)", url)
            checks.append(Check("long_completion", FAIL, evidence, cause=cause, fix=fix, node="controller",
                                seconds=_elapsed(completion)))
        elif completion is not None:
            usage = (_body(completion) or {}).get("usage") or {}
            checks.append(Check("long_completion", PASS, f"{usage.get('completion_tokens')} tokens generated",
                                node="controller", seconds=_elapsed(completion)))
        if mode == "cpu":
            checks += [judge_busy_cpu(str(n["node"]), n.get("samples") or [None, None, None], completion_ok,
                                      float(busy.get("min_cpu_seconds", 0.5))) for n in nodes]
        elif mode == "gpu":
            checks += [judge_busy_gpu(str(n["node"]), n.get("sample"), completion_ok,
                                      float(busy.get("min_utilization", 10.0))) for n in nodes]
        elif mode == "skip":
            checks += busy_skipped([str(n["node"]) for n in nodes], str(busy.get("reason") or "not requested"))
        else:
            raise VerifyError(f"busy mode {mode!r} is not cpu, gpu or skip")
    report = build_report(checks, meta)
    report["table"] = render_table(report)
    report["message"] = failure_message(report)
    return report
