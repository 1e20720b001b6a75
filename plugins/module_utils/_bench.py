# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark arithmetic for a vLLM OpenAI server: streamed events and their times in, figures out.

Private to the collection; may change at any time. Pure: the module does the HTTP and the clock; this file
parses the server-sent events, computes time to first token and decode rates, and lays out CSV and JSON.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

CODE_PROMPT = "Write a Python function is_prime(n) that returns True when n is a prime number."
_FILLER = (
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n"
)
CSV_FIELDS = ("test", "concurrency", "requests", "prompt_tokens", "completion_tokens", "ttft_s", "decode_tok_s",
              "aggregate_tok_s", "wall_s", "errors")


class BenchError(ValueError):
    """A stream or an option the benchmark cannot use."""


def parse_sse(lines: Iterable[bytes | str]) -> Iterable[dict[str, Any]]:
    """Server-sent event lines → the JSON objects of `data:` lines, up to `data: [DONE]`."""
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError as exc:
            raise BenchError(f"a streamed event is not JSON: {payload[:80]!r}") from exc
        if isinstance(event, dict) and "error" in event:
            raise BenchError(f"the server reported an error mid-stream: {event['error']}")
        yield event


def event_has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls"):
            return True
    return False


@dataclass
class StreamResult:
    ttft_s: float
    decode_tok_s: float | None
    completion_tokens: int
    prompt_tokens: int | None
    total_s: float


def summarise_stream(start: float, timed_events: Sequence[tuple[float, dict[str, Any]]]) -> StreamResult:
    """Times and events of one streamed completion → TTFT, decode tokens/s (tokens after the first, over the
    time from the first to the last text event), token counts (from the usage event, else text events)."""
    text_times = [t for t, e in timed_events if event_has_text(e)]
    if not text_times:
        raise BenchError("the stream carried no text")
    usage = next((e["usage"] for _stamp, e in reversed(timed_events) if e.get("usage")), None) or {}
    tokens = int(usage.get("completion_tokens") or len(text_times))
    first, last = text_times[0], text_times[-1]
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else None
    end = timed_events[-1][0]
    return StreamResult(ttft_s=round(first - start, 4), decode_tok_s=None if decode is None else round(decode, 2),
                        completion_tokens=tokens, prompt_tokens=usage.get("prompt_tokens"),
                        total_s=round(end - start, 4))


def stream_body(model: str, prompt: str, max_tokens: int, temperature: float = 0.0) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}


def large_prompt(chars: int) -> str:
    """A code-review prompt of about `chars` characters."""
    if chars < 100:
        raise BenchError("a large prompt needs at least 100 characters")
    head = "Review the following code and list every bug you find.\n\n"
    body = (_FILLER * (chars // len(_FILLER) + 1))[: max(0, chars - len(head))]
    return head + body


def scale_chars(chars: int, counted_tokens: int, target_tokens: int) -> int:
    """Characters that should give `target_tokens`, from a measurement of `chars` → `counted_tokens`."""
    if counted_tokens <= 0 or target_tokens <= 0:
        raise BenchError("token counts must be > 0")
    return max(100, int(chars * target_tokens / counted_tokens))


def sweep_row(concurrency: int, results: Sequence[StreamResult], wall_s: float, errors: int) -> dict[str, Any]:
    """One concurrency level: aggregate tokens/s over the wall time, mean per-stream decode rate and TTFT."""
    tokens = sum(r.completion_tokens for r in results)
    decodes = [r.decode_tok_s for r in results if r.decode_tok_s is not None]
    return {"test": "concurrency", "concurrency": concurrency, "requests": len(results) + errors,
            "prompt_tokens": results[0].prompt_tokens if results else None, "completion_tokens": tokens,
            "ttft_s": round(sum(r.ttft_s for r in results) / len(results), 4) if results else None,
            "decode_tok_s": round(sum(decodes) / len(decodes), 2) if decodes else None,
            "aggregate_tok_s": round(tokens / wall_s, 2) if wall_s > 0 and results else None,
            "wall_s": round(wall_s, 3), "errors": errors}


def single_row(test: str, result: StreamResult) -> dict[str, Any]:
    return {"test": test, "concurrency": 1, "requests": 1, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens, "ttft_s": result.ttft_s,
            "decode_tok_s": result.decode_tok_s, "aggregate_tok_s": None, "wall_s": result.total_s, "errors": 0}


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})
    return out.getvalue()


def chart_groups(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[float]]]:
    """Bars for the chart: per concurrency level, [aggregate tok/s, mean per-stream decode tok/s]."""
    groups = []
    for row in rows:
        if row.get("test") == "concurrency":
            groups.append((f"{row['concurrency']}x", [float(row.get("aggregate_tok_s") or 0.0),
                                                      float(row.get("decode_tok_s") or 0.0)]))
    return groups


def result_dict(result: StreamResult) -> dict[str, Any]:
    return asdict(result)
