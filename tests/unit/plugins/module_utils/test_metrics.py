# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _metrics: the text format parser, histogram_quantile's interpolation, throughput, the summary.

The fixtures in tests/fixtures/metrics are assembled from vLLM's metric definitions (see their header), not
captured; their values were chosen so the expected percentiles below can be computed by hand.
"""
from __future__ import annotations

import math
import os
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _metrics
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import (
    SUMMARY_KEYS,
    Histogram,
    MetricsParseError,
    QuantileError,
    format_summary,
    histogram,
    histogram_quantile,
    kv_cache_size,
    model_names,
    parse_labels,
    parse_sample,
    parse_text,
    parse_value,
    percentiles,
    rate,
    summarise,
)

FIXTURE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "metrics")
INF = math.inf


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURE_DIR, name), encoding="utf-8") as handle:
        return handle.read()


def approx(value: float) -> Any:
    """Percentiles in a summary are rounded to microseconds."""
    return pytest.approx(value, abs=1e-6)


SCRAPE_1 = "vllm-0.12-v1-assembled.1.txt"
SCRAPE_2 = "vllm-0.12-v1-assembled.2.txt"

# ---------------------------------------------------------------------------------------------------------
# Parsing


@pytest.mark.parametrize("text, expected", [
    ("0", 0.0),
    ("1.5", 1.5),
    ("-2", -2.0),
    ("1e-3", 0.001),
    ("1.7645103e+09", 1764510300.0),
    (".5", 0.5),
    ("+Inf", INF),
    ("-Inf", -INF),
    ("Inf", INF),
])
def test_parse_value(text: str, expected: float) -> None:
    assert parse_value(text) == expected


def test_parse_value_nan() -> None:
    assert math.isnan(parse_value("NaN"))


@pytest.mark.parametrize("text", ["", "1_000", "0x10", "one", "1.0.0", "+-1"])
def test_parse_value_rejects(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_value(text)


@pytest.mark.parametrize("line, name, labels, value, timestamp", [
    ("up 1", "up", {}, 1.0, None),
    ("process_resident_memory_bytes 1.89364224e+09", "process_resident_memory_bytes", {}, 1893642240.0, None),
    ('vllm:num_requests_running{engine="0",model_name="glm-5.3-flash"} 2.0',
     "vllm:num_requests_running", {"engine": "0", "model_name": "glm-5.3-flash"}, 2.0, None),
    # an escaped quote, an escaped backslash and an escaped newline in label values
    (r'msg_total{text="say \"hi\"",path="C:\\dir",multi="a\nb"} 3',
     "msg_total", {"text": 'say "hi"', "path": "C:\\dir", "multi": "a\nb"}, 3.0, None),
    # braces, commas and '#' inside a quoted value are part of the value
    ('odd{v="a,b}c # d"} 4', "odd", {"v": "a,b}c # d"}, 4.0, None),
    # bucket bound +Inf, trailing comma, blanks around the label set, a timestamp in ms
    ('h_bucket{le="+Inf",} 40.0 1764510300000', "h_bucket", {"le": "+Inf"}, 40.0, 1764510300000.0),
    ('h_bucket { le = "0.25" , x="y" } 22', "h_bucket", {"le": "0.25", "x": "y"}, 22.0, None),
    ('empty{} 0', "empty", {}, 0.0, None),
    ('empty_value{l=""} 0', "empty_value", {"l": ""}, 0.0, None),
    # OpenMetrics exemplar after the value is ignored
    ('h_bucket{le="0.5"} 7 # {trace_id="abc"} 0.42 1764510300.1', "h_bucket", {"le": "0.5"}, 7.0, None),
])
def test_parse_sample(line: str, name: str, labels: dict[str, str], value: float, timestamp: float | None) -> None:
    sample = parse_sample(line)
    assert (sample.name, dict(sample.labels), sample.value, sample.timestamp) == (name, labels, value, timestamp)


def test_parse_sample_nan_value() -> None:
    assert math.isnan(parse_sample('vllm:kv_cache_usage_perc{engine="0"} NaN').value)


@pytest.mark.parametrize("line, message", [
    ("", "expected a metric name"),
    ("1abc 1", "expected a metric name"),
    ("novalue", "no value"),
    ("novalue{a=\"b\"}", "no value"),
    ('x{a="b} 1', "closing quote"),
    ("x{a=b} 1", "quoted value"),
    ('x{a="1" b="2"} 1', "expected ',' or '}'"),
    ('x{a="1",a="2"} 1', "given twice"),
    ('x{="1"} 1', "label name"),
    ("x one", "not a sample value"),
    ("x 1 2 3", "unexpected text"),
    ("x 1 soon", "not a sample value"),
])
def test_parse_sample_rejects(line: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message):
        parse_sample(line)


def test_parse_labels_returns_position() -> None:
    labels, end = parse_labels('m{a="1",b="x\\"y"} 5', 1)
    assert labels == {"a": "1", "b": 'x"y'}
    assert end == len('m{a="1",b="x\\"y"}')


def test_parse_text_comments_help_type() -> None:
    text = (
        "# a free comment\n"
        "\n"
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0\n'
        "# HELP odd_metric A help text with a \\\\ backslash and a \\n newline.\n"
        "# TYPE odd_metric untyped\n"
        "odd_metric 1\r\n"
        "# EOF\n"
    )
    scrape = parse_text(text)
    assert [s.name for s in scrape.samples] == ["vllm:prompt_tokens_total", "odd_metric"]
    assert scrape.types == {"vllm:prompt_tokens_total": "counter", "odd_metric": "untyped"}
    assert scrape.helps["vllm:prompt_tokens_total"] == "Number of prefill tokens processed."
    assert scrape.helps["odd_metric"] == "A help text with a \\ backslash and a \n newline."


def test_parse_text_names_the_bad_line() -> None:
    with pytest.raises(MetricsParseError, match=r"^line 3: label value without its closing quote: x\{a=\"1} 2$"):
        parse_text('# TYPE x gauge\nx 1\nx{a="1} 2\n')


def test_parse_text_rejects_unknown_type() -> None:
    with pytest.raises(MetricsParseError, match="line 1: unknown metric type 'bogus'"):
        parse_text("# TYPE x bogus\n")


def test_parse_text_rejects_html() -> None:
    with pytest.raises(MetricsParseError, match="line 1"):
        parse_text("<html><body>Not Found</body></html>\n")


def test_parse_fixture() -> None:
    scrape = parse_text(fixture(SCRAPE_1))
    assert scrape.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert scrape.types["vllm:prompt_tokens_total"] == "counter"
    assert scrape.types["vllm:kv_cache_usage_perc"] == "gauge"
    buckets = scrape.named("vllm:time_to_first_token_seconds_bucket")
    assert len(buckets) == 23  # vLLM's 22 bounds and +Inf
    assert buckets[-1].labels == {"engine": "0", "le": "+Inf", "model_name": "glm-5.3-flash"}
    assert len(scrape.named("vllm:inter_token_latency_seconds_bucket")) == 20  # 19 bounds and +Inf
    assert [s.labels["finished_reason"] for s in scrape.named("vllm:request_success_total")] == [
        "stop", "length", "abort", "error"]
    assert scrape.named("python_gc_objects_collected_total")[0].labels == {"generation": "0"}


# ---------------------------------------------------------------------------------------------------------
# Percentiles (histogram_quantile)

# cumulative (le, count); 10 observations: 2 in (0, 0.1], 5 in (0.1, 0.5], 2 in (0.5, 1], 1 above 1
TEN = [(0.1, 2.0), (0.5, 7.0), (1.0, 9.0), (INF, 10.0)]


@pytest.mark.parametrize("q, buckets, expected", [
    # rank 5 lies in (0.1, 0.5]: 3 of its 5 observations -> 0.1 + 0.4 * 3/5
    (0.5, TEN, 0.34),
    # rank 9 is the top of (0.5, 1] -> 1.0
    (0.9, TEN, 1.0),
    # rank 9.9 lies in the +Inf bucket -> the highest finite bound
    (0.99, TEN, 1.0),
    # rank 1 lies in the first bucket, whose lower bound is 0 -> 0.1 * 1/2
    (0.1, TEN, 0.05),
    # q = 1 -> rank 10 -> +Inf bucket -> highest finite bound
    (1.0, TEN, 1.0),
    # q = 0 -> rank 0 -> first bucket, interpolated at its start
    (0.0, TEN, 0.0),
    # buckets in any order, and a bucket listed twice (two engines) is summed
    (0.5, [(INF, 5.0), (0.5, 3.5), (0.1, 1.0), (0.5, 3.5), (0.1, 1.0), (INF, 5.0)], 0.34),
    # non-monotonic counts (a scrape racing an update) are made monotonic: (0.75, 6) is read as 7
    (0.9, [(0.1, 2.0), (0.5, 7.0), (0.75, 6.0), (1.0, 9.0), (INF, 10.0)], 1.0),
    # an upper bound <= 0 in the first bucket is returned as it is
    (0.1, [(-1.0, 5.0), (0.0, 8.0), (INF, 10.0)], -1.0),
    # a rank at a bucket's top count is that bucket's upper bound, not the next (empty) bucket's
    (0.5, [(1.0, 5.0), (2.0, 5.0), (INF, 10.0)], 1.0),
    # rank 0 on an empty first bucket: its lower bound (Prometheus divides 0 by 0 here)
    (0.0, [(1.0, 0.0), (2.0, 5.0), (INF, 5.0)], 0.0),
])
def test_histogram_quantile(q: float, buckets: list[tuple[float, float]], expected: float) -> None:
    assert histogram_quantile(q, buckets) == approx(expected)


@pytest.mark.parametrize("buckets", [
    [],
    [(INF, 10.0)],  # fewer than two buckets
    [(0.1, 2.0), (0.5, 7.0)],  # no +Inf bucket
    [(0.1, 0.0), (0.5, 0.0), (INF, 0.0)],  # no observation yet
])
def test_histogram_quantile_none(buckets: list[tuple[float, float]]) -> None:
    assert histogram_quantile(0.5, buckets) is None


@pytest.mark.parametrize("q", [-0.1, 1.01, math.nan])
def test_histogram_quantile_rejects(q: float) -> None:
    with pytest.raises(QuantileError):
        histogram_quantile(q, TEN)


def test_fixture_percentiles_by_hand() -> None:
    scrape = parse_text(fixture(SCRAPE_1))
    ttft = percentiles(histogram(scrape, "vllm:time_to_first_token_seconds"))
    # 40 requests: cumulative 6 at 0.1, 22 at 0.25, 34 at 0.75, 37 at 1.0, 39 at 2.5, 40 at 5.0
    # p50: rank 20 in (0.1, 0.25] holding 16 -> 0.1 + 0.15 * 14/16
    # p90: rank 36 in (0.75, 1.0] holding 3  -> 0.75 + 0.25 * 2/3
    # p99: rank 39.6 in (2.5, 5.0] holding 1 -> 2.5 + 2.5 * 0.6
    assert ttft == {"p50": approx(0.23125), "p90": approx(0.75 + 0.25 * 2 / 3),
                    "p99": approx(4.0), "count": 40}
    itl = percentiles(histogram(scrape, "vllm:inter_token_latency_seconds"))
    # 2345 intervals: cumulative 120 at 0.025, 1800 at 0.05, 2200 at 0.075, 2300 at 0.1, 2330 at 0.15
    # p50: rank 1172.5 in (0.025, 0.05] holding 1680 -> 0.025 + 0.025 * 1052.5/1680
    # p90: rank 2110.5 in (0.05, 0.075] holding 400  -> 0.05 + 0.025 * 310.5/400
    # p99: rank 2321.55 in (0.1, 0.15] holding 30    -> 0.1 + 0.05 * 21.55/30
    assert itl == {"p50": approx(0.025 + 0.025 * 1052.5 / 1680),
                   "p90": approx(0.05 + 0.025 * 310.5 / 400),
                   "p99": approx(0.1 + 0.05 * 21.55 / 30), "count": 2345}


def test_histogram_sums_engines_and_reads_count_and_sum() -> None:
    text = (
        'lat_bucket{engine="0",le="1.0"} 1\nlat_bucket{engine="0",le="+Inf"} 2\n'
        'lat_bucket{engine="1",le="1.0"} 3\nlat_bucket{engine="1",le="+Inf"} 4\n'
        'lat_count{engine="0"} 2\nlat_count{engine="1"} 4\nlat_sum{engine="0"} 2.5\nlat_sum{engine="1"} 3.5\n'
        'lat_bucket{engine="2"} 9\n'  # a bucket without le is not a bucket
    )
    assert histogram(parse_text(text), "lat") == Histogram(buckets=((1.0, 4.0), (INF, 6.0)), count=6.0, total=6.0)


def test_histogram_count_falls_back_to_inf_bucket() -> None:
    hist = histogram(parse_text('lat_bucket{le="1"} 1\nlat_bucket{le="+Inf"} 3\n'), "lat")
    assert hist is not None and (hist.count, hist.total) == (3.0, None)


def test_percentiles_without_observations() -> None:
    hist = histogram(parse_text('lat_bucket{le="1"} 0\nlat_bucket{le="+Inf"} 0\nlat_count 0\n'), "lat")
    assert percentiles(hist) == {"p50": None, "p90": None, "p99": None, "count": 0}
    assert percentiles(None) is None
    assert histogram(parse_text("other 1\n"), "lat") is None


# ---------------------------------------------------------------------------------------------------------
# Throughput


def test_rate_from_two_fixture_scrapes() -> None:
    before, after = parse_text(fixture(SCRAPE_1)), parse_text(fixture(SCRAPE_2))
    # 81234 -> 81540 prompt tokens and 23456 -> 23576 generated tokens in 2.0 s
    assert rate(before, after, 100.0, 102.0, "vllm:prompt_tokens_total") == approx(153.0)
    assert rate(before, after, 100.0, 102.0, "vllm:generation_tokens_total") == approx(60.0)


@pytest.mark.parametrize("before, after, t0, t1, expected", [
    ("c_total 10\n", "c_total 30\n", 0.0, 4.0, 5.0),
    ("c_total 10\n", "c_total 10\n", 0.0, 4.0, 0.0),
    # a counter that went down was reset (engine restarted): its value after the reset is the increase
    ("c_total 1000\n", "c_total 8\n", 0.0, 2.0, 4.0),
    # the time must move forward
    ("c_total 10\n", "c_total 30\n", 4.0, 4.0, None),
    ("c_total 10\n", "c_total 30\n", 4.0, 3.0, None),
    # missing in either scrape
    ("other 1\n", "c_total 30\n", 0.0, 1.0, None),
    ("c_total 10\n", "other 1\n", 0.0, 1.0, None),
    # series of two engines are summed
    ('c_total{engine="0"} 1\nc_total{engine="1"} 2\n', 'c_total{engine="0"} 5\nc_total{engine="1"} 6\n', 0, 2, 4.0),
])
def test_rate(before: str, after: str, t0: float, t1: float, expected: float | None) -> None:
    assert rate(parse_text(before), parse_text(after), t0, t1, "c_total") == expected


# ---------------------------------------------------------------------------------------------------------
# Summary


def test_summarise_fixture_pair() -> None:
    before, after = parse_text(fixture(SCRAPE_1)), parse_text(fixture(SCRAPE_2))
    summary = summarise(after, before, 10.0, 12.0)
    assert tuple(summary) == SUMMARY_KEYS
    assert summary["kv_cache_usage"] == approx(0.1337)
    assert (summary["requests_running"], summary["requests_waiting"]) == (2, 0)
    assert (summary["prompt_tokens_per_s"], summary["generation_tokens_per_s"]) == (
        approx(153.0), approx(60.0))
    assert summary["ttft_seconds"]["count"] == 40
    # the second scrape's ITL: 2405 intervals, cumulative 130 at 0.025 and 1870 at 0.05
    assert summary["itl_seconds"]["count"] == 2405
    assert summary["itl_seconds"]["p50"] == approx(0.025 + 0.025 * (1202.5 - 130) / 1740)
    assert summary["model_names"] == ["glm-5.3-flash"]
    # vllm:cache_config_info: num_gpu_blocks="19689", block_size="16"
    assert (summary["kv_cache_blocks"], summary["kv_block_size"], summary["kv_cache_tokens"]) == (19689, 16, 315024)
    assert format_summary(summary) == (
        "KV cache 13.4% used, 2 running, 0 waiting, prompt 153.0 tok/s, generation 60.0 tok/s, "
        "TTFT p50/p90/p99 0.231/0.917/4 s (n=40), ITL p50/p90/p99 0.0404/0.0689/0.135 s (n=2405)"
    )


def test_summarise_single_scrape_has_no_throughput() -> None:
    summary = summarise(parse_text(fixture(SCRAPE_1)))
    assert (summary["prompt_tokens_per_s"], summary["generation_tokens_per_s"]) == (None, None)
    assert summary["kv_cache_usage"] == 0.125
    assert summary["requests_waiting"] == 1


def test_summarise_missing_metrics_are_none() -> None:
    text = (
        "# a server without vLLM's metrics (or a proxy's own /metrics)\n"
        "process_resident_memory_bytes 1e+09\n"
        'http_requests_total{handler="/health",method="GET",status="2xx"} 57\n'
    )
    summary = summarise(parse_text(text), parse_text(text), 0.0, 2.0)
    assert summary == {key: None for key in SUMMARY_KEYS} | {"model_names": []}
    assert format_summary(summary) == (
        "KV cache n/a used, n/a running, n/a waiting, prompt n/a tok/s, generation n/a tok/s, TTFT n/a, ITL n/a")


def test_kv_cache_size_takes_the_smallest_pool_and_skips_unset_labels() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="900"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="2",num_gpu_blocks="None"} 1.0\n'
    )
    assert kv_cache_size(parse_text(text)) == (900, 16)
    assert kv_cache_size(parse_text('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n')) == (
        None, None)
    assert kv_cache_size(parse_text('vllm:cache_config_info{num_gpu_blocks="0",block_size="16"} 1.0\n')) == (
        None, None)


OLD_NAMES = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="old"} 4.0
vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="old"} 8.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="old"} 8.0
vllm:time_per_output_token_seconds_count{model_name="old"} 8.0
vllm:time_per_output_token_seconds_sum{model_name="old"} 0.5
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="old"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="old"} 0.0
vllm:time_to_first_token_seconds_count{model_name="old"} 0.0
"""


def test_summarise_older_names() -> None:
    summary = summarise(parse_text(OLD_NAMES))
    assert summary["kv_cache_usage"] == 0.5
    # rank 4 of 8 is the top of (0, 0.05]; rank 7.2 lies in (0.05, 0.1] holding 4 -> 0.05 + 0.05 * 3.2/4;
    # rank 7.92 -> 0.05 + 0.05 * 3.92/4
    assert summary["itl_seconds"] == {"p50": approx(0.05), "p90": approx(0.09),
                                      "p99": approx(0.099), "count": 8}
    assert summary["ttft_seconds"] == {"p50": None, "p90": None, "p99": None, "count": 0}
    assert "TTFT no requests yet" in format_summary(summary)


def test_newer_names_win_over_older_ones() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        'vllm:time_per_output_token_seconds_bucket{le="1",model_name="m"} 1\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 1\n'
        'vllm:inter_token_latency_seconds_bucket{le="2",model_name="m"} 3\n'
        'vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 3\n'
    )
    summary = summarise(parse_text(text))
    assert summary["kv_cache_usage"] == 0.25
    assert summary["itl_seconds"]["count"] == 3


TWO_MODELS = """\
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.75
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.1
vllm:num_requests_running{engine="0",model_name="a"} 1
vllm:num_requests_running{engine="1",model_name="a"} 2
vllm:num_requests_running{engine="0",model_name="b"} 7
vllm:num_requests_waiting{engine="0",model_name="b"} NaN
vllm:prompt_tokens_total{engine="0",model_name="a"} {a}
vllm:prompt_tokens_total{engine="0",model_name="b"} {b}
"""


@pytest.mark.parametrize("model, kv, running, waiting, prompt_rate", [
    # both models: KV of the fullest engine, requests summed, NaN left out
    (None, 0.75, 10, None, 5.0 + 50.0),
    ("a", 0.75, 3, None, 5.0),
    ("b", 0.1, 7, None, 50.0),
    ("c", None, None, None, None),
])
def test_model_name_filter(model: str | None, kv: float | None, running: int | None, waiting: int | None,
                           prompt_rate: float | None) -> None:
    before = parse_text(TWO_MODELS.replace("{a}", "100").replace("{b}", "1000"))
    after = parse_text(TWO_MODELS.replace("{a}", "110").replace("{b}", "1100"))
    summary = summarise(after, before, 0.0, 2.0, model_name=model)
    assert (summary["kv_cache_usage"], summary["requests_running"], summary["requests_waiting"],
            summary["prompt_tokens_per_s"]) == (kv, running, waiting, prompt_rate)
    assert summary["model_names"] == ["a", "b"]


def test_model_names_only_from_vllm_series() -> None:
    scrape = parse_text('vllm:x{model_name="m2"} 1\nvllm:y{model_name="m1"} 1\nother{model_name="zz"} 1\nvllm:z 1\n')
    assert model_names(scrape) == ["m1", "m2"]


@pytest.mark.parametrize("summary, line", [
    ({"kv_cache_usage": 1.0, "requests_running": 0, "requests_waiting": 12, "prompt_tokens_per_s": 0.0,
      "generation_tokens_per_s": 1234.56, "ttft_seconds": {"p50": 12.5, "p90": None, "p99": None, "count": 1},
      "itl_seconds": None},
     "KV cache 100.0% used, 0 running, 12 waiting, prompt 0.0 tok/s, generation 1234.6 tok/s, "
     "TTFT p50/p90/p99 12.5/n/a/n/a s (n=1), ITL n/a"),
    ({}, "KV cache n/a used, n/a running, n/a waiting, prompt n/a tok/s, generation n/a tok/s, TTFT n/a, ITL n/a"),
])
def test_format_summary(summary: dict[str, Any], line: str) -> None:
    assert format_summary(summary) == line


def test_the_lab_engines_own_metrics_are_the_ones_summarised() -> None:
    """Two scrapes captured from the lab's vLLM 0.32.0 (CPU) head, before and after one 16-token completion
    (its first request, which compiles kernels: TTFT between 20 and 40 s)."""
    def read(index: int) -> _metrics.Scrape:
        with open(os.path.join(FIXTURE_DIR, f"vllm-0.32.0-cpu-lab-captured.{index}.txt"), encoding="utf-8") as handle:
            return _metrics.parse_text(handle.read())

    summary = _metrics.summarise(read(2), read(1), 0.0, 10.0, model_name="glm-5.3-flash")
    assert summary["model_names"] == ["glm-5.3-flash"]
    assert (summary["kv_cache_usage"], summary["requests_running"], summary["requests_waiting"]) == (0.0, 0, 0)
    assert (summary["prompt_tokens_per_s"], summary["generation_tokens_per_s"]) == (0.3, 0.5)
    assert summary["ttft_seconds"]["count"] == 1 and 20.0 <= summary["ttft_seconds"]["p50"] <= 40.0
    assert summary["itl_seconds"]["count"] == 4
