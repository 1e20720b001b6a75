# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _bench_chart: the Figure built from a summary (title, units, legends, marks) and its PNG.

matplotlib is a controller requirement (requirements/controller.txt, pinned in dev.txt), so it is imported here
without a skip: a development venv without it is a broken one.
"""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench as b
from ansible_collections.dgxspark.vllm.plugins.module_utils import _bench_chart as chart

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "bench",
                       "vllm-0.32.0-assembled-results.json")
TITLE = "glm-5.3-flash (profile glm53_flash_nvfp4) - vLLM 0.32.0 bench serve - 2026-12-01 08:30 UTC"


@pytest.fixture()
def summary() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        return b.summarize(json.load(handle))


def legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None
    return [text.get_text() for text in legend.get_texts()]


def test_matplotlib_is_there():
    assert chart.HAS_MATPLOTLIB and chart.MATPLOTLIB_IMPORT_ERROR is None


def test_figure_title_axes_units_and_legends(summary):
    fig = chart.build_figure(summary, TITLE, b.reference_for("glm53_flash_nvfp4"))
    assert fig.get_suptitle() == TITLE
    tp, lat, ttft = fig.axes
    assert (tp.get_xlabel(), tp.get_ylabel()) == ("concurrent requests", "output tokens/s")
    assert (lat.get_xlabel(), lat.get_ylabel()) == ("concurrent requests", "latency (ms, log scale)")
    assert lat.get_yscale() == "log"
    assert (ttft.get_xlabel(), ttft.get_ylabel()) == ("percentile", "time to first token (s)")
    assert legend_texts(tp) == ["all streams: output tokens/s", "per stream: decode tokens/s (1000 / mean TPOT)",
                                "single-stream decode, 128-token prompt",
                                "recipe NVFP4: 23.3 tok/s single-stream decode"]
    assert legend_texts(lat) == ["TTFT p50", "TTFT p90", "TTFT p99", "ITL p50", "ITL p90", "ITL p99"]
    assert sorted(legend_texts(ttft)) == ["measured, 1024-token prompt, 1 stream",
                                          "recipe NVFP4: big-prompt TTFT 3-12 s"]
    assert ttft.get_title() == "Time to first token, 1024-token prompt"


def test_lines_differ_by_marker_or_style_not_only_colour(summary):
    fig = chart.build_figure(summary, TITLE, b.reference_for("glm53_flash_nvfp4"))
    for ax in fig.axes[:2]:
        looks = [(line.get_marker(), line.get_linestyle()) for line in ax.get_lines()]
        assert len(looks) == len(set(looks)), looks


def test_plotted_values_are_the_summary(summary):
    fig = chart.build_figure(summary, TITLE, b.reference_for("glm53_flash_exl3"))
    tp, lat, ttft = fig.axes
    sweep = summary["rows"][2:]
    aggregate = tp.get_lines()[0]
    assert list(aggregate.get_xdata()) == [1, 2, 4]
    assert list(aggregate.get_ydata()) == [r["output_throughput"] for r in sweep]
    assert list(tp.get_lines()[2].get_ydata()) == [summary["decode_tok_s"]]
    assert list(tp.get_lines()[3].get_ydata()) == [42.3, 42.3]  # the recipe's EXL3 decode, a horizontal line
    assert list(lat.get_lines()[5].get_ydata()) == [r["itl_ms_p99"] for r in sweep]
    bars = ttft.containers[0]
    assert [patch.get_height() for patch in bars] == pytest.approx(
        [summary["ttft_ms"][p] / 1000.0 for p in ("p50", "p90", "p99")])
    band = next(patch for patch in ttft.patches if patch.get_label().startswith("recipe"))
    assert band.get_label() == "recipe EXL3 4bpw: big-prompt TTFT 325-432 s"


def test_no_reference_no_marks(summary):
    fig = chart.build_figure(summary, TITLE, None)
    assert not any("recipe" in text for ax in fig.axes for text in legend_texts(ax))


def test_partial_summary_still_draws(summary):
    only_sweep = {"rows": summary["rows"][2:], "decode_tok_s": None, "ttft_ms": None}
    fig = chart.build_figure(only_sweep, TITLE, None)
    assert fig.axes[2].get_title() == "Time to first token (no ttft case)"
    assert fig.axes[2].get_legend() is None  # nothing to list


def test_write_png(summary, tmp_path):
    path = tmp_path / "chart.png"
    chart.write_png(chart.build_figure(summary, TITLE, b.reference_for("glm53_flash_nvfp4")), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1600, 520)


def test_without_matplotlib(monkeypatch, summary):
    monkeypatch.setattr(chart, "HAS_MATPLOTLIB", False)
    with pytest.raises(chart.ChartError, match="matplotlib is not installed"):
        chart.build_figure(summary, TITLE, None)
