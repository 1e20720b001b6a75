# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark as vLLM's own ``vllm bench serve``: the cases to run, and their results summarised.

Private module: may change at any time. Pure functions over numbers and text, no I/O and no Ansible imports.

The measuring is vLLM's (``vllm/benchmarks/serve.py`` and ``vllm/benchmarks/lib/endpoint_request_func.py``):
its client streams ``/v1/completions`` and times every chunk. This file only decides which runs to make
(`plan_cases`: the exact ``vllm bench serve`` argv of each case) and reads the result JSON vLLM saves for each
(`summarize`). The driver shipped with ``playbooks/benchmark.yml`` runs the cases inside the head's serve
container, with one import of vLLM for all of them.

A result file of vLLM 0.32.0 (``main_async``, ``--save-result``) holds, among others::

    {"date": "20261130-210000", "backend": "vllm", "label": "decode", "model_id": "glm-5.3-flash",
     "tokenizer_id": "/var/tmp/models/...", "num_prompts": 3, "request_rate": "inf", "max_concurrency": 1,
     "duration": 33.2, "completed": 3, "failed": 0, "total_input_tokens": 384, "total_output_tokens": 768,
     "request_throughput": 0.09, "output_throughput": 23.1, "total_token_throughput": 34.7,
     "max_output_tokens_per_s": 25.0, "max_concurrent_requests": 1,
     "mean_ttft_ms": 180.0, "median_ttft_ms": ..., "std_ttft_ms": ..., "p50_ttft_ms": ..., "p90_ttft_ms": ...,
     "p99_ttft_ms": ...,  (the same for tpot, itl and e2el: ``--percentile-metrics``/``--metric-percentiles``)
     "spec_decode_acceptance_rate": 61.0, "spec_decode_acceptance_length": 3.4}   (only with speculation)

and, with ``--save-detailed``, the per-request lists ``ttfts``, ``itls``, ``latencies``, ``errors`` ...
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# --- what each case measures (fixed here so that runs compare) ---------------------------------------------
DECODE_INPUT_TOKENS = 128
"""Prompt of the single-stream decode case: short, as in the recipe's table."""
DECODE_PROMPTS = 3
TTFT_OUTPUT_TOKENS = 8
"""Output of the large-prompt case: enough for a few inter-token gaps, small next to the prefill."""
TTFT_PROMPTS = 1
"""One large prompt: on the EXL3 build a 32k-token prefill takes minutes (the recipe: 325-432 s)."""
SWEEP_INPUT_TOKENS = 512
PROMPTS_PER_STREAM = 4
"""Each sweep level sends this many prompts per concurrent stream (num-prompts = 4 x concurrency)."""
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
DRIVER_ALLOWANCE_S = 600
"""On top of the cases' budgets: importing vLLM (about 30 s in the lab) and loading the tokenizer."""

RESULT_MARKER = "DGXSPARK-BENCH-RESULTS"
"""The driver prints this word, a space and the results as one JSON line, after vLLM's own output."""
DRIVER_SHELL = '[ -z "${VLLM_API_KEY:-}" ] || export OPENAI_API_KEY="$VLLM_API_KEY"; exec python3 - "$@"'
"""How the driver starts in the serve container: vLLM's bench client sends ``OPENAI_API_KEY`` as a bearer
token (``endpoint_request_func._get_headers``); the container holds the key as ``VLLM_API_KEY``, so the key goes
from one environment variable to the other and is never on an argv. The driver's source comes on stdin."""

CASE_NAME_RE = re.compile(r"^(decode|ttft|concurrency-([1-9][0-9]*))$")

CSV_FIELDS: tuple[str, ...] = (
    "case", "concurrency", "num_prompts", "completed", "failed", "input_tokens", "output_tokens", "duration_s",
    "request_throughput", "output_throughput", "decode_tok_s",
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99",
    "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "e2el_ms_p50", "e2el_ms_p90", "e2el_ms_p99",
    "spec_decode_acceptance_length",
)
"""One CSV row per case. Throughputs in tokens (or requests) per second, latencies in milliseconds."""

REQUIRED_RESULT_KEYS: tuple[str, ...] = (
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
    "output_throughput", "mean_tpot_ms",
) + tuple(f"p{p}_{m}_ms" for m in PERCENTILE_METRICS for p in PERCENTILES)


class BenchError(ValueError):
    """Options the benchmark cannot use, or results it cannot trust; the message says which and why."""


# --- reference marks ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """The recipe's measured numbers for one build ("Measured performance (2-node cluster)")."""

    label: str
    decode_tok_s: float
    ttft_s: tuple[float, float]


REFERENCES: Mapping[str, Reference] = {
    # single-stream decode on a short code prompt at temperature 0; big-prompt TTFT "measured on large prompts
    # under concurrency" (the recipe gives neither the prompt size nor the load)
    "glm53_flash_nvfp4": Reference("NVFP4", 23.3, (3.0, 12.0)),
    "glm53_flash_exl3": Reference("EXL3 4bpw", 42.3, (325.0, 432.0)),
}


def reference_for(profile: str) -> dict[str, Any] | None:
    """The recipe's numbers for a built-in profile by name; None for any other (the lab's, a user's)."""
    ref = REFERENCES.get(profile)
    if ref is None:
        return None
    return {"profile": profile, "label": ref.label, "decode_tok_s": ref.decode_tok_s, "ttft_s": list(ref.ttft_s),
            "source": "the recipe's 'Measured performance (2-node cluster)': single-stream decode on a short "
                      "code prompt at temperature 0; big-prompt TTFT measured on large prompts under concurrency"}


# --- planning ----------------------------------------------------------------------------------------------
def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BenchError(f"{name} must be a positive integer, got {value!r}")
    return value


def case_argv(name: str, *, port: int, served_model_name: str, tokenizer: str | None, input_tokens: int,
              output_tokens: int, num_prompts: int, concurrency: int, seed: int, result_dir: str) -> list[str]:
    """The ``vllm bench serve`` argv of one case (no API key: vLLM's client reads ``OPENAI_API_KEY``)."""
    argv = ["vllm", "bench", "serve",
            "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
            "--model", served_model_name]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    argv += ["--dataset-name", "random", "--random-input-len", str(input_tokens),
             "--random-output-len", str(output_tokens), "--num-prompts", str(num_prompts),
             "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0", "--seed", str(seed),
             "--percentile-metrics", ",".join(PERCENTILE_METRICS),
             "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
             "--label", name, "--disable-tqdm",
             "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", f"{name}.json"]
    return argv


def plan_cases(*, port: int, served_model_name: str, tokenizer: str | None, max_tokens: int,
               large_prompt_tokens: int, concurrency: Sequence[int], result_dir: str, seed: int,
               max_model_len: int | None = None) -> list[dict[str, Any]]:
    """The cases, in the order they run: ``decode``, ``ttft``, then ``concurrency-<c>`` per sweep level.

    - ``decode``: single stream (max-concurrency 1), a short random prompt, ``max_tokens`` generated
      (``--ignore-eos``), a few prompts one after the other, temperature 0;
    - ``ttft``: one random prompt of ``large_prompt_tokens`` tokens, a few tokens generated;
    - ``concurrency-<c>``: max-concurrency c, 4 x c prompts of a few hundred tokens, ``max_tokens`` each.

    Every case talks to the head's own loopback (``--base-url http://127.0.0.1:<port>``: the serve container
    runs with ``--network host``) and saves ``<case>.json`` under ``result_dir``. Case i uses ``seed + i``:
    vLLM's random prompts follow the seed, and the server's prefix cache would otherwise serve a case (or a
    re-run with the same seed) a prompt it has already seen. With ``tokenizer`` None the argv has no
    ``--tokenizer``: the driver asks the server which path it loaded (``/v1/models`` ``root``).
    """
    port = _positive_int("port", port)
    if port > 65535:
        raise BenchError(f"port must be at most 65535, got {port}")
    if not isinstance(served_model_name, str) or not served_model_name:
        raise BenchError("served_model_name must be a non-empty string")
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer):
        raise BenchError("tokenizer must be a non-empty path or name when given")
    max_tokens = _positive_int("max_tokens", max_tokens)
    if max_tokens < 2:
        raise BenchError(f"max_tokens must be at least 2 (a decode rate needs two tokens), got {max_tokens}")
    large_prompt_tokens = _positive_int("large_prompt_tokens", large_prompt_tokens)
    if isinstance(concurrency, (str, bytes)) or not isinstance(concurrency, Sequence) or not concurrency:
        raise BenchError(f"concurrency must be a non-empty list of positive integers, got {concurrency!r}")
    levels = [_positive_int("every concurrency level", c) for c in concurrency]
    if len(set(levels)) != len(levels):
        raise BenchError(f"concurrency lists a level twice: {levels}")
    if not isinstance(result_dir, str) or not result_dir.startswith("/") or result_dir.rstrip("/") == "":
        raise BenchError(f"result_dir must be an absolute directory other than /, got {result_dir!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BenchError(f"seed must be an integer >= 0, got {seed!r}")
    if max_model_len is not None:
        max_model_len = _positive_int("max_model_len", max_model_len)

    specs = [("decode", DECODE_INPUT_TOKENS, max_tokens, DECODE_PROMPTS, 1),
             ("ttft", large_prompt_tokens, TTFT_OUTPUT_TOKENS, TTFT_PROMPTS, 1)]
    specs += [(f"concurrency-{c}", SWEEP_INPUT_TOKENS, max_tokens, PROMPTS_PER_STREAM * c, c) for c in levels]
    cases = []
    for index, (name, input_tokens, output_tokens, num_prompts, level) in enumerate(specs):
        if max_model_len is not None and input_tokens + output_tokens > max_model_len:
            knob = "large_prompt_tokens" if name == "ttft" else "max_tokens"
            raise BenchError(
                f"case {name}: a {input_tokens}-token prompt plus {output_tokens} generated tokens exceed the "
                f"served max_model_len {max_model_len}; lower {knob}")
        cases.append({
            "name": name, "kind": name.split("-")[0], "concurrency": level, "input_tokens": input_tokens,
            "output_tokens": output_tokens, "num_prompts": num_prompts, "seed": seed + index,
            "argv": case_argv(name, port=port, served_model_name=served_model_name, tokenizer=tokenizer,
                              input_tokens=input_tokens, output_tokens=output_tokens, num_prompts=num_prompts,
                              concurrency=level, seed=seed + index, result_dir=result_dir),
        })
    return cases


BASELINE_PARAMS: tuple[str, ...] = ("input_tokens", "output_tokens", "decode_prompts", "concurrency", "prompts")
"""What a baseline was measured with; two baselines compare only when all of these are equal."""


def baseline_params(*, input_tokens: int, output_tokens: int, decode_prompts: int, concurrency: int,
                    prompts: int) -> dict[str, int]:
    """The short benchmark's parameters, checked: every one a positive integer, at least two tokens out (a decode
    rate needs two), at least as many prompts as concurrent streams (else the level is never reached)."""
    params = {"input_tokens": _positive_int("input_tokens", input_tokens),
              "output_tokens": _positive_int("output_tokens", output_tokens),
              "decode_prompts": _positive_int("decode_prompts", decode_prompts),
              "concurrency": _positive_int("concurrency", concurrency),
              "prompts": _positive_int("prompts", prompts)}
    if params["output_tokens"] < 2:
        raise BenchError(f"output_tokens must be at least 2 (a decode rate needs two tokens), got {output_tokens}")
    if params["prompts"] < params["concurrency"]:
        raise BenchError(f"prompts ({prompts}) must be at least the concurrency ({concurrency}): fewer prompts never "
                         "reach that many concurrent requests")
    return params


def plan_baseline(*, port: int, served_model_name: str, tokenizer: str | None, params: Mapping[str, int],
                  result_dir: str, seed: int, max_model_len: int | None = None) -> list[dict[str, Any]]:
    """The short benchmark after a passed verify, in the order the cases run (see `baseline_params`):

    - ``decode``: one stream, ``decode_prompts`` random prompts of ``input_tokens`` tokens one after the other,
      ``output_tokens`` generated each (``--ignore-eos``): the decode tokens/s at concurrency 1;
    - ``concurrency-<c>``: ``prompts`` prompts of the same size with at most ``concurrency`` in flight: TTFT p50
      and the output throughput at that concurrency.

    Both use ``case_argv`` (the same flags as playbooks/benchmark.yml); case i uses ``seed + i``.
    """
    checked = baseline_params(**{key: params.get(key) for key in BASELINE_PARAMS})  # type: ignore[arg-type]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BenchError(f"seed must be an integer >= 0, got {seed!r}")
    if not isinstance(result_dir, str) or not result_dir.startswith("/") or result_dir.rstrip("/") == "":
        raise BenchError(f"result_dir must be an absolute directory other than /, got {result_dir!r}")
    if not isinstance(served_model_name, str) or not served_model_name:
        raise BenchError("served_model_name must be a non-empty string")
    port = _positive_int("port", port)
    if max_model_len is not None and checked["input_tokens"] + checked["output_tokens"] > max_model_len:
        raise BenchError(f"a {checked['input_tokens']}-token prompt plus {checked['output_tokens']} generated tokens "
                         f"exceed the served max_model_len {max_model_len}; lower the input or output tokens")
    level = checked["concurrency"]
    specs = [("decode", checked["decode_prompts"], 1), (f"concurrency-{level}", checked["prompts"], level)]
    cases = []
    for index, (name, num_prompts, concurrency) in enumerate(specs):
        cases.append({
            "name": name, "kind": name.split("-")[0], "concurrency": concurrency,
            "input_tokens": checked["input_tokens"], "output_tokens": checked["output_tokens"],
            "num_prompts": num_prompts, "seed": seed + index,
            "argv": case_argv(name, port=port, served_model_name=served_model_name, tokenizer=tokenizer,
                              input_tokens=checked["input_tokens"], output_tokens=checked["output_tokens"],
                              num_prompts=num_prompts, concurrency=concurrency, seed=seed + index,
                              result_dir=result_dir),
        })
    return cases


def baseline_from(summary: Mapping[str, Any], params: Mapping[str, int], *, measured_at: str,
                  elapsed_s: float | None = None, vllm_version: str | None = None) -> dict[str, Any]:
    """The baseline a release is recorded with, from the short benchmark's summary (`summarize`):
    ``decode_tok_s`` (the decode case), ``ttft_ms_p50`` and ``output_throughput`` (the concurrency case), the
    parameters, when, how long the whole run took (``elapsed_s``: vLLM's import included) and the vLLM that measured.
    BenchError when a figure is missing or not positive (it could not be compared)."""
    rows = {row["case"]: row for row in summary.get("rows") or []}
    level = params.get("concurrency")
    decode, loaded = rows.get("decode"), rows.get(f"concurrency-{level}")
    if decode is None or loaded is None:
        raise BenchError(f"the short benchmark needs the cases decode and concurrency-{level}; it has "
                         f"{sorted(rows) or 'none'}")
    figures = {"decode_tok_s": decode.get("decode_tok_s"), "ttft_ms_p50": loaded.get("ttft_ms_p50"),
               "output_throughput": loaded.get("output_throughput")}
    bad = [f"{key} {value!r}" for key, value in figures.items()
           if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0]
    if bad:
        raise BenchError("the short benchmark measured no usable " + ", ".join(bad) + ": a baseline needs positive "
                         "figures (are the output tokens at least 2, and did every request generate them?)")
    bench_s = round(sum(float(row.get("duration_s") or 0) for row in rows.values()), 3)
    return {**figures, "concurrency": level, "params": dict(params), "measured_at": measured_at,
            "duration_s": round(float(elapsed_s), 3) if elapsed_s is not None else bench_s, "bench_s": bench_s,
            "vllm_version": vllm_version}


def baseline_line(baseline: Mapping[str, Any]) -> str:
    """A baseline in one line."""
    return (f"decode {baseline.get('decode_tok_s')} tok/s at concurrency 1; at concurrency "
            f"{baseline.get('concurrency')}: TTFT p50 {baseline.get('ttft_ms_p50')} ms, "
            f"{baseline.get('output_throughput')} output tok/s")


def driver_plan(cases: Sequence[Mapping[str, Any]], *, port: int, served_model_name: str, result_dir: str,
                case_timeout: int, resolve_tokenizer: bool) -> dict[str, Any]:
    """The document the driver reads (its one argument, as JSON)."""
    return {"result_dir": result_dir, "case_timeout": _positive_int("timeout", case_timeout),
            "base_url": f"http://127.0.0.1:{port}", "model": served_model_name,
            "resolve_tokenizer": bool(resolve_tokenizer),
            "cases": [{"name": c["name"], "argv": list(c["argv"])} for c in cases]}


def exec_argv(plan: Mapping[str, Any]) -> list[str]:
    """The argv run in the serve container: a shell that moves the key into ``OPENAI_API_KEY``, then the driver
    (``python3 -``, its source on stdin) with the plan as its one argument."""
    return ["sh", "-c", DRIVER_SHELL, "dgxspark-bench", json.dumps(plan, separators=(",", ":"))]


def exec_timeout(plan: Mapping[str, Any]) -> int:
    """Seconds the whole run may take: every case's budget and the driver's start."""
    return int(plan["case_timeout"]) * len(plan["cases"]) + DRIVER_ALLOWANCE_S


# --- the driver's output -----------------------------------------------------------------------------------
def _tail(text: str, lines: int = 15) -> str:
    kept = [line for line in (text or "").splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else "(nothing)"


def run_output(run: Mapping[str, Any]) -> tuple[str, str, int | None]:
    """The driver's stdout, stderr and exit code from the registered result of its run in the serve container;
    BenchError when it did not run (skipped) or could not start (a message, no output)."""
    if run.get("skipped"):
        raise BenchError("the benchmark did not run in the serve container (its task was skipped)")
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    if not stdout and run.get("msg"):
        raise BenchError(f"the benchmark could not start in the serve container: {run['msg']}")
    return stdout, stderr, run.get("rc")


def parse_driver_output(stdout: str, stderr: str = "", rc: int | None = None) -> dict[str, Any]:
    """The driver's results document: the JSON after the last ``RESULT_MARKER`` line of its stdout."""
    doc = None
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(RESULT_MARKER + " "):
            try:
                doc = json.loads(line[len(RESULT_MARKER) + 1:])
            except ValueError as exc:
                raise BenchError(f"the benchmark driver's result line is not JSON: {exc}") from exc
            break
    if doc is None:
        raise BenchError(
            f"the benchmark driver printed no results (exit status {rc}); the last lines of its output:\n"
            f"{_tail(stdout)}\n--- stderr:\n{_tail(stderr)}")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise BenchError("the benchmark driver's result document has no 'results' mapping")
    errors = doc.get("errors") or {}
    if errors:
        listed = "; ".join(f"{case}: {message}" for case, message in errors.items())
        raise BenchError(f"vllm bench serve failed: {listed}\n--- last lines of its output:\n{_tail(stdout)}")
    return doc


def check_complete(cases: Sequence[Mapping[str, Any]], results: Mapping[str, Any]) -> None:
    """Every planned case has a result, and nothing else does."""
    planned = [c["name"] for c in cases]
    missing = [name for name in planned if name not in results]
    extra = sorted(set(results) - set(planned))
    if missing or extra:
        raise BenchError(f"the results do not match the plan: missing {missing or 'none'}, "
                         f"unplanned {extra or 'none'}")


# --- summarising -------------------------------------------------------------------------------------------
def _number(case: str, result: Mapping[str, Any], key: str) -> float:
    value = result[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BenchError(f"case {case}: {key} is not a finite number: {value!r}")
    return float(value)


def _first_errors(result: Mapping[str, Any], limit: int = 3) -> str:
    errors = [str(e).strip() for e in result.get("errors") or [] if e]
    if not errors:
        return " (run with --save-detailed for the reasons, or read vLLM's output above)"
    shown = "; ".join(e.splitlines()[-1][:300] for e in errors[:limit])
    return f": {shown}"


def summarize_case(case: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """One row (`CSV_FIELDS`) from one result file of ``vllm bench serve``."""
    match = CASE_NAME_RE.match(case)
    if not match:
        raise BenchError(f"unknown case {case!r}: expected decode, ttft or concurrency-<n>")
    if not isinstance(result, Mapping):
        raise BenchError(f"case {case}: the result is not a JSON object")
    missing = [key for key in REQUIRED_RESULT_KEYS if key not in result]
    if missing:
        raise BenchError(
            f"case {case}: vLLM's result lacks {', '.join(missing)} (is it a result of `vllm bench serve "
            f"--percentile-metrics {','.join(PERCENTILE_METRICS)} "
            f"--metric-percentiles {','.join(map(str, PERCENTILES))}`?)")
    completed, failed = int(_number(case, result, "completed")), int(_number(case, result, "failed"))
    if failed:
        raise BenchError(f"case {case}: {failed} of {completed + failed} requests failed{_first_errors(result)}")
    if completed < 1:
        raise BenchError(f"case {case}: no request completed")
    level = int(match.group(2)) if match.group(2) else 1
    if result.get("max_concurrency") not in (None, level):
        raise BenchError(f"case {case}: the result was run with max_concurrency {result.get('max_concurrency')}")
    mean_tpot = _number(case, result, "mean_tpot_ms")
    row: dict[str, Any] = {
        "case": case, "concurrency": level, "num_prompts": result.get("num_prompts", completed),
        "completed": completed, "failed": failed,
        "input_tokens": round(_number(case, result, "total_input_tokens") / completed, 1),
        "output_tokens": round(_number(case, result, "total_output_tokens") / completed, 1),
        "duration_s": round(_number(case, result, "duration"), 3),
        "request_throughput": round(_number(case, result, "request_throughput"), 4),
        "output_throughput": round(_number(case, result, "output_throughput"), 2),
        # Per-stream decode rate: TPOT is vLLM's (latency - TTFT) / (output tokens - 1) per request, i.e. the
        # time per generated token after the first; 1000 / mean TPOT (ms) is tokens per second while decoding.
        # With every request generating the same count (--ignore-eos), this equals the decode tokens over the
        # decode time of all requests: the single-stream "decode tok/s" of the recipe's table for the decode case.
        "decode_tok_s": round(1000.0 / mean_tpot, 2) if mean_tpot > 0 else None,
    }
    for metric in PERCENTILE_METRICS:
        for p in PERCENTILES:
            row[f"{metric}_ms_p{p}"] = round(_number(case, result, f"p{p}_{metric}_ms"), 2)
    length = result.get("spec_decode_acceptance_length")
    row["spec_decode_acceptance_length"] = (round(float(length), 3) if isinstance(length, (int, float))
                                            and not isinstance(length, bool) and math.isfinite(length) else None)
    return row


def _order(case: str) -> tuple[int, int]:
    match = CASE_NAME_RE.match(case)
    if not match:
        return (3, 0)
    if match.group(2):
        return (2, int(match.group(2)))
    return (0, 0) if case == "decode" else (1, 0)


def summarize(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rows for every case (decode, ttft, then the sweep by level) and the headline figures:

    - ``decode_tok_s``: single-stream decode tokens/s of the ``decode`` case (see `summarize_case`);
    - ``ttft_ms``: p50/p90/p99 time to first token of the ``ttft`` case, and ``ttft_prompt_tokens`` its prompt.
    Raises BenchError when a case failed requests or its result lacks a key.
    """
    if not isinstance(results, Mapping) or not results:
        raise BenchError("there are no results to summarise")
    rows = [summarize_case(case, results[case]) for case in sorted(results, key=_order)]
    by_case = {row["case"]: row for row in rows}
    decode, ttft = by_case.get("decode"), by_case.get("ttft")
    return {
        "rows": rows,
        "decode_tok_s": decode["decode_tok_s"] if decode else None,
        "ttft_ms": {f"p{p}": ttft[f"ttft_ms_p{p}"] for p in PERCENTILES} if ttft else None,
        "ttft_prompt_tokens": ttft["input_tokens"] if ttft else None,
    }


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})
    return out.getvalue()


def _triple(row: Mapping[str, Any], metric: str) -> str:
    return "/".join(f"{row[f'{metric}_ms_p{p}']:.1f}" for p in PERCENTILES)


def summary_lines(summary: Mapping[str, Any], reference: Mapping[str, Any] | None = None) -> list[str]:
    """One line per case for a person: throughput, per-stream decode rate, TTFT and ITL p50/p90/p99."""
    lines = []
    for row in summary["rows"]:
        decode = "n/a" if row["decode_tok_s"] is None else f"{row['decode_tok_s']:.1f}"
        plural = "s" if row["completed"] > 1 else ""
        head = (f"{row['case']} ({row['concurrency']} stream{'s' if row['concurrency'] > 1 else ''}, "
                f"{row['input_tokens']:g}-token prompt{plural}, {row['output_tokens']:g} tokens out): ")
        if row["case"] == "decode":
            ref = f" (recipe {reference['label']}: {reference['decode_tok_s']} tok/s)" if reference else ""
            head += f"decode {decode} tok/s single stream{ref}; "
        else:
            head += f"{row['output_throughput']:.1f} output tok/s, {decode} tok/s per stream; "
        ref = ""
        if row["case"] == "ttft" and reference:
            ref = f" (recipe {reference['label']}: {reference['ttft_s'][0]:g}-{reference['ttft_s'][1]:g} s)"
        lines.append(f"{head}TTFT p50/p90/p99 {_triple(row, 'ttft')} ms{ref}; ITL p50/p90/p99 "
                     f"{_triple(row, 'itl')} ms")
    return lines


def chart_title(model: str, profile: str, stamp: str, vllm_version: str | None) -> str:
    """The chart's title: model, profile, date and the vLLM that measured."""
    when = stamp
    match = re.match(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$", stamp)
    if match:
        when = "{}-{}-{} {}:{} UTC".format(*match.groups()[:5])
    profile_text = f" (profile {profile})" if profile else ""
    measured = f"vLLM {vllm_version} bench serve" if vllm_version else "vllm bench serve"
    return f"{model}{profile_text} - {measured} - {when}"
