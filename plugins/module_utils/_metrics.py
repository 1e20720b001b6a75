# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text exposition -> samples -> a summary of vLLM's own metrics.

Private module: may change at any time. Pure functions over text and numbers, no I/O and no Ansible imports,
so plain pytest can drive it with a ``/metrics`` body.

What vLLM's ``/metrics`` holds (the v1 engine, ``vllm/v1/metrics/loggers.py``); every vLLM series carries the
labels ``model_name`` (the first served model name) and ``engine`` (the engine core's index)::

    # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
    # TYPE vllm:kv_cache_usage_perc gauge
    vllm:kv_cache_usage_perc{engine="0",model_name="glm-5.3-flash"} 0.125
    vllm:prompt_tokens_total{engine="0",model_name="glm-5.3-flash"} 81234.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="glm-5.3-flash"} 31.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="glm-5.3-flash"} 40.0
    vllm:time_to_first_token_seconds_count{engine="0",model_name="glm-5.3-flash"} 40.0

Names across versions (both spellings are accepted, the newer one first):

* KV usage: ``vllm:kv_cache_usage_perc`` (v1, since 0.9), ``vllm:gpu_cache_usage_perc`` (older, a fraction too);
* inter-token latency: ``vllm:inter_token_latency_seconds`` (since 0.11), ``vllm:time_per_output_token_seconds``
  (older; hidden from 0.12 on);
* unchanged: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:time_to_first_token_seconds``.

Several engines (data parallel) each report their own series. They are combined as a PromQL user would:
counters, request gauges and histogram buckets are summed (``sum by (le)``); KV usage is the fullest engine's.

Percentiles follow Prometheus' ``histogram_quantile`` (promql ``bucketQuantile``), see `histogram_quantile`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KV_USAGE_METRICS: tuple[str, ...] = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
PROMPT_TOKENS_METRIC = "vllm:prompt_tokens_total"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens_total"
TTFT_METRICS: tuple[str, ...] = ("vllm:time_to_first_token_seconds",)
ITL_METRICS: tuple[str, ...] = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
MODEL_LABEL = "model_name"
VLLM_PREFIX = "vllm:"

CACHE_INFO_METRIC = "vllm:cache_config_info"

SUMMARY_KEYS: tuple[str, ...] = (
    "kv_cache_usage", "requests_running", "requests_waiting", "prompt_tokens_per_s", "generation_tokens_per_s",
    "ttft_seconds", "itl_seconds", "model_names", "kv_cache_blocks", "kv_block_size", "kv_cache_tokens",
)
"""The keys of `summarise`'s dict (what ``vllm_metrics_info`` returns, besides its own)."""


class MetricsError(Exception):
    """Base class for errors raised by this module."""


class MetricsParseError(MetricsError, ValueError):
    """The text is not Prometheus text exposition format; the message names the line."""


class QuantileError(MetricsError, ValueError):
    """A quantile outside [0, 1] was asked for."""


# ---------------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Sample:
    """One sample line: metric name, labels, value and the optional timestamp as written (text format:
    milliseconds since the epoch; OpenMetrics: seconds)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    value: float = 0.0
    timestamp: float | None = None


@dataclass(frozen=True)
class Scrape:
    """One parsed ``/metrics`` body: the samples in text order, and the ``# TYPE`` and ``# HELP`` per family."""

    samples: tuple[Sample, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    helps: Mapping[str, str] = field(default_factory=dict)

    def named(self, name: str, model_name: str | None = None) -> list[Sample]:
        """Samples called ``name``; with ``model_name``, only those whose ``model_name`` label equals it."""
        return [
            s for s in self.samples
            if s.name == name and (model_name is None or s.labels.get(MODEL_LABEL) == model_name)
        ]


@dataclass(frozen=True)
class Histogram:
    """A histogram summed over its series: cumulative bucket counts by upper bound (ascending), count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float | None = None


# ---------------------------------------------------------------------------------------------------------
# Parsing

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUE_RE = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf(?:inity)?|NaN|nan)$"
)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
METRIC_TYPES: frozenset[str] = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown",
                                          "info", "stateset", "gaugehistogram"})


def parse_value(text: str) -> float:
    """A sample value as Prometheus writes it: a float, ``NaN``, ``+Inf``, ``-Inf`` (``Inf`` alone too)."""
    if not _VALUE_RE.match(text):
        raise MetricsParseError(f"not a sample value: {text!r}")
    return float(text)


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _parse_label_value(line: str, pos: int) -> tuple[str, int]:
    """The quoted value starting at ``line[pos] == '"'``; returns (unescaped value, position after the quote).

    ``\\\\``, ``\\"`` and ``\\n`` are the format's escapes; any other backslash is kept as written.
    """
    out: list[str] = []
    pos += 1
    while pos < len(line):
        char = line[pos]
        if char == "\\" and pos + 1 < len(line):
            nxt = line[pos + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            pos += 2
            continue
        if char == '"':
            return "".join(out), pos + 1
        out.append(char)
        pos += 1
    raise MetricsParseError("label value without its closing quote")


def parse_labels(line: str, pos: int = 0) -> tuple[dict[str, str], int]:
    """The label set starting at ``line[pos] == '{'``; returns (labels, position after ``}``).

    A trailing comma is allowed; a label named twice is an error, as in Prometheus.
    """
    if line[pos:pos + 1] != "{":
        raise MetricsParseError(f"expected '{{' at column {pos + 1}")
    labels: dict[str, str] = {}
    pos = _skip_blanks(line, pos + 1)
    while True:
        if line[pos:pos + 1] == "}":
            return labels, pos + 1
        match = _LABEL_NAME_RE.match(line, pos)
        if not match:
            raise MetricsParseError(f"expected a label name at column {pos + 1}")
        name = match.group(0)
        pos = _skip_blanks(line, match.end())
        if line[pos:pos + 1] != "=":
            raise MetricsParseError(f"expected '=' after label {name!r}")
        pos = _skip_blanks(line, pos + 1)
        if line[pos:pos + 1] != '"':
            raise MetricsParseError(f"expected a quoted value for label {name!r}")
        value, pos = _parse_label_value(line, pos)
        if name in labels:
            raise MetricsParseError(f"label {name!r} given twice")
        labels[name] = value
        pos = _skip_blanks(line, pos)
        if line[pos:pos + 1] == ",":
            pos = _skip_blanks(line, pos + 1)
        elif line[pos:pos + 1] != "}":
            raise MetricsParseError(f"expected ',' or '}}' after label {name!r}")


def parse_sample(line: str) -> Sample:
    """One sample line: ``name[{labels}] value [timestamp]``; an OpenMetrics exemplar (`` # {...} v``) is ignored."""
    match = _NAME_RE.match(line)
    if not match:
        raise MetricsParseError("expected a metric name")
    name = match.group(0)
    pos = _skip_blanks(line, match.end())
    labels: dict[str, str] = {}
    if pos >= len(line):
        raise MetricsParseError(f"no value for {name!r}")
    if line[pos:pos + 1] == "{":
        labels, pos = parse_labels(line, pos)
    elif pos == match.end():
        raise MetricsParseError(f"expected a blank or '{{' after {name!r}")
    rest = line[pos:].split(" # ", 1)[0].split()
    if not rest:
        raise MetricsParseError(f"no value for {name!r}")
    if len(rest) > 2:
        raise MetricsParseError(f"unexpected text after the value of {name!r}: {' '.join(rest[2:])!r}")
    value = parse_value(rest[0])
    timestamp: float | None = None
    if len(rest) == 2:
        timestamp = parse_value(rest[1])
        if not math.isfinite(timestamp):
            raise MetricsParseError(f"not a timestamp: {rest[1]!r}")
    return Sample(name=name, labels=labels, value=value, timestamp=timestamp)


def parse_text(text: str) -> Scrape:
    """Parse a whole ``/metrics`` body (text format 0.0.4; OpenMetrics' ``# EOF`` and exemplars are accepted).

    ``# HELP`` and ``# TYPE`` lines are kept per family; other ``#`` lines and blank lines are comments.
    Raises `MetricsParseError` naming the first bad line.
    """
    samples: list[Sample] = []
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                parts = line[1:].strip().split(None, 2)
                if len(parts) >= 2 and parts[0] == "TYPE":
                    kind = parts[2].strip().lower() if len(parts) == 3 else ""
                    if kind not in METRIC_TYPES:
                        raise MetricsParseError(f"unknown metric type {kind!r} for {parts[1]!r}")
                    types[parts[1]] = kind
                elif len(parts) >= 2 and parts[0] == "HELP":
                    helps[parts[1]] = _unescape_help(parts[2]) if len(parts) == 3 else ""
                continue
            samples.append(parse_sample(line))
        except MetricsParseError as exc:
            raise MetricsParseError(f"line {number}: {exc}: {_shorten(line)}") from None
    return Scrape(samples=tuple(samples), types=types, helps=helps)


def _unescape_help(text: str) -> str:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "\\" and pos + 1 < len(text) and text[pos + 1] in "\\n":
            out.append("\n" if text[pos + 1] == "n" else "\\")
            pos += 2
            continue
        out.append(text[pos])
        pos += 1
    return "".join(out)


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------------
# Reading values


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def first_present(scrape: Scrape, names: Sequence[str], model_name: str | None = None) -> str | None:
    """The first of ``names`` with at least one sample (after the model filter), or None."""
    for name in names:
        if scrape.named(name, model_name):
            return name
    return None


def gauge_sum(scrape: Scrape, name: str, model_name: str | None = None) -> float | None:
    """Sum of a gauge's (or counter's) series, NaN samples left out; None when it has no sample."""
    values = _finite(s.value for s in scrape.named(name, model_name))
    return math.fsum(values) if values else None


def gauge_max(scrape: Scrape, names: Sequence[str], model_name: str | None = None) -> float | None:
    """Largest value of the first present of ``names`` (the fullest engine), NaN left out; None when absent."""
    name = first_present(scrape, names, model_name)
    if name is None:
        return None
    values = _finite(s.value for s in scrape.named(name, model_name))
    return max(values) if values else None


def histogram(scrape: Scrape, name: str, model_name: str | None = None) -> Histogram | None:
    """The histogram ``name`` (without ``_bucket``) summed over its series by ``le``; None without buckets.

    The count is ``<name>_count`` when present, else the ``+Inf`` bucket's.
    """
    by_le: dict[float, float] = {}
    for sample in scrape.named(name + "_bucket", model_name):
        bound = sample.labels.get("le")
        if bound is None:
            continue
        try:
            upper = parse_value(bound.strip())
        except MetricsParseError:
            continue
        if not math.isnan(sample.value) and not math.isnan(upper):
            by_le[upper] = by_le.get(upper, 0.0) + sample.value
    if not by_le:
        return None
    buckets = tuple(sorted(by_le.items()))
    count = gauge_sum(scrape, name + "_count", model_name)
    if count is None:
        count = by_le.get(math.inf, buckets[-1][1])
    return Histogram(buckets=buckets, count=count, total=gauge_sum(scrape, name + "_sum", model_name))


def first_histogram(scrape: Scrape, names: Sequence[str], model_name: str | None = None) -> Histogram | None:
    """The histogram of the first of ``names`` that has buckets (after the model filter), or None."""
    for name in names:
        hist = histogram(scrape, name, model_name)
        if hist is not None:
            return hist
    return None


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative ``(upper bound, count)`` buckets, as Prometheus' ``histogram_quantile``.

    Method (promql ``bucketQuantile``): sort the buckets by upper bound and make the counts non-decreasing;
    the rank is ``q * total`` where the total is the ``+Inf`` bucket's count; find the first bucket whose
    cumulative count reaches the rank, and interpolate linearly between that bucket's lower bound (the
    previous bucket's upper bound, 0 for the first bucket) and its upper bound, by the share of the bucket's
    own observations below the rank. A rank in the ``+Inf`` bucket returns the highest finite upper bound;
    a first bucket with an upper bound <= 0 returns that bound.

    None (Prometheus: NaN) when there is no ``+Inf`` bucket, fewer than two buckets, or no observation.
    Raises `QuantileError` for q outside [0, 1].
    """
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        raise QuantileError(f"quantile must be within [0, 1], got {q}")
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return None
    counts: list[float] = []
    for _upper, count in ordered:
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    if index == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    start, end = 0.0, ordered[index][0]
    in_bucket = counts[index]
    if index > 0:
        start = ordered[index - 1][0]
        in_bucket -= counts[index - 1]
        rank -= counts[index - 1]
    if in_bucket <= 0:
        return start
    return start + (end - start) * (rank / in_bucket)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def percentiles(hist: Histogram | None) -> dict[str, Any] | None:
    """``{p50, p90, p99, count}`` of a histogram, in microseconds' precision (percentiles None while count is
    0); None without one."""
    if hist is None:
        return None
    out: dict[str, Any] = {key: _rounded(histogram_quantile(q, hist.buckets), 6) for key, q in QUANTILES}
    out["count"] = int(hist.count) if math.isfinite(hist.count) else None
    return out


def rate(before: Scrape, after: Scrape, t_before: float, t_after: float, name: str,
         model_name: str | None = None) -> float | None:
    """Per-second increase of counter ``name`` between two scrapes taken at ``t_before`` and ``t_after`` (s).

    None when either scrape lacks the counter or the time does not move forward. A counter that went down
    was reset (the engine restarted): its whole value after the reset counts as the increase, as in PromQL.
    """
    elapsed = t_after - t_before
    if not elapsed > 0:
        return None
    first = gauge_sum(before, name, model_name)
    second = gauge_sum(after, name, model_name)
    if first is None or second is None:
        return None
    delta = second - first if second >= first else second
    return delta / elapsed


def model_names(scrape: Scrape) -> list[str]:
    """Every ``model_name`` label value on vLLM's own series, sorted."""
    return sorted({
        s.labels[MODEL_LABEL] for s in scrape.samples if s.name.startswith(VLLM_PREFIX) and MODEL_LABEL in s.labels
    })


def kv_cache_size(scrape: Scrape) -> tuple[int | None, int | None]:
    """(KV blocks, tokens per block) from ``vllm:cache_config_info`` (the engine's CacheConfig as labels, set
    once the KV cache is allocated), or Nones. With several engines, the smallest pool (the one that limits)."""
    best: tuple[int, int] | None = None
    for sample in scrape.named(CACHE_INFO_METRIC):
        try:
            blocks = int(sample.labels.get("num_gpu_blocks", ""))
            size = int(sample.labels.get("block_size", ""))
        except ValueError:
            continue
        if blocks > 0 and size > 0 and (best is None or blocks * size < best[0] * best[1]):
            best = (blocks, size)
    return best if best is not None else (None, None)


def _as_count(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------------------
# Top level


def summarise(after: Scrape, before: Scrape | None = None, t_before: float | None = None,
              t_after: float | None = None, model_name: str | None = None) -> dict[str, Any]:
    """vLLM's figures from the latest scrape (``after``), throughput from the pair.

    Keys (`SUMMARY_KEYS`): ``kv_cache_usage`` (fraction 0-1, the fullest engine), ``requests_running`` and
    ``requests_waiting`` (ints), ``prompt_tokens_per_s`` and ``generation_tokens_per_s`` (counter increase per
    second between ``before`` and ``after``, 3 decimals; None with a single scrape), ``ttft_seconds`` and
    ``itl_seconds`` (``{p50, p90, p99, count}`` since the engine started: the histograms are cumulative),
    ``model_names``, and the KV cache's size from the engine's cache config: ``kv_cache_blocks``,
    ``kv_block_size`` and ``kv_cache_tokens`` (their product), which stay readable after the log lines that
    reported them were rotated away.
    A metric the server does not expose (or not for ``model_name``) is None.
    """
    prompt_rate: float | None = None
    generation_rate: float | None = None
    if before is not None and t_before is not None and t_after is not None:
        prompt_rate = _rounded(rate(before, after, t_before, t_after, PROMPT_TOKENS_METRIC, model_name), 3)
        generation_rate = _rounded(rate(before, after, t_before, t_after, GENERATION_TOKENS_METRIC, model_name), 3)
    blocks, block_size = kv_cache_size(after)
    return {
        "kv_cache_usage": gauge_max(after, KV_USAGE_METRICS, model_name),
        "requests_running": _as_count(gauge_sum(after, RUNNING_METRIC, model_name)),
        "requests_waiting": _as_count(gauge_sum(after, WAITING_METRIC, model_name)),
        "prompt_tokens_per_s": prompt_rate,
        "generation_tokens_per_s": generation_rate,
        "ttft_seconds": percentiles(first_histogram(after, TTFT_METRICS, model_name)),
        "itl_seconds": percentiles(first_histogram(after, ITL_METRICS, model_name)),
        "model_names": model_names(after),
        "kv_cache_blocks": blocks,
        "kv_block_size": block_size,
        "kv_cache_tokens": blocks * block_size if blocks is not None and block_size is not None else None,
    }


def _number(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _latency(label: str, stats: Mapping[str, Any] | None) -> str:
    if stats is None:
        return f"{label} n/a"
    if not stats.get("count"):
        return f"{label} no requests yet"
    values = "/".join(_number(stats.get(key), ".3g") for key, _q in QUANTILES)
    return f"{label} p50/p90/p99 {values} s (n={stats['count']})"


def format_summary(summary: Mapping[str, Any]) -> str:
    """One line for a person: KV usage, requests, throughput, TTFT and ITL percentiles; ``n/a`` where absent."""
    usage = summary.get("kv_cache_usage")
    kv = "n/a" if usage is None else f"{usage * 100:.1f}%"
    return (
        f"KV cache {kv} used, {_number(summary.get('requests_running'), 'd')} running, "
        f"{_number(summary.get('requests_waiting'), 'd')} waiting, "
        f"prompt {_number(summary.get('prompt_tokens_per_s'), '.1f')} tok/s, "
        f"generation {_number(summary.get('generation_tokens_per_s'), '.1f')} tok/s, "
        f"{_latency('TTFT', summary.get('ttft_seconds'))}, {_latency('ITL', summary.get('itl_seconds'))}"
    )
