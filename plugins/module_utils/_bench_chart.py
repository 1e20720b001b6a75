# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark chart, drawn with matplotlib (object API, Agg canvas: no display, no pyplot state).

Private module: may change at any time. `build_figure` turns `_bench.summarize`'s summary into a Figure, which
tests inspect (title, axis labels, legends); `write_png` renders it. matplotlib is optional for the rest of the
collection: ``HAS_MATPLOTLIB`` says whether it imported, and the module that draws fails with
``missing_required_lib`` when it did not.
"""
from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from typing import Any

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
except ImportError:
    HAS_MATPLOTLIB = False
    MATPLOTLIB_IMPORT_ERROR: str | None = traceback.format_exc()
else:
    HAS_MATPLOTLIB = True
    MATPLOTLIB_IMPORT_ERROR = None

PERCENTILE_STYLES = (("p50", "-"), ("p90", "--"), ("p99", ":"))
"""Line style per percentile; TTFT lines are blue with circles, ITL lines red with squares."""


class ChartError(RuntimeError):
    """matplotlib is missing, or the figure cannot be drawn."""


def _positive(values: list[Any]) -> list[float]:
    """Values for a log axis: a missing or non-positive value is left out (NaN) instead of clipped."""
    return [float(v) if isinstance(v, (int, float)) and v > 0 else math.nan for v in values]


def _legend(ax: Any, **kwargs: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small", **kwargs)


def build_figure(summary: Mapping[str, Any], title: str, reference: Mapping[str, Any] | None = None) -> Any:
    """Three panels: throughput over the sweep, TTFT/ITL percentiles over the sweep, the large prompt's TTFT.

    The recipe's figures (``reference``: `_bench.reference_for`) are drawn as labelled marks: its single-stream
    decode tok/s as a horizontal line on the first panel, its big-prompt TTFT range as a band on the third.
    """
    if not HAS_MATPLOTLIB:
        raise ChartError("matplotlib is not installed")
    rows = list(summary.get("rows") or [])
    sweep = sorted((r for r in rows if str(r["case"]).startswith("concurrency-")), key=lambda r: r["concurrency"])
    decode = next((r for r in rows if r["case"] == "decode"), None)
    ttft = next((r for r in rows if r["case"] == "ttft"), None)

    fig = Figure(figsize=(16, 5.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize="large")
    ax_tp, ax_lat, ax_ttft = fig.subplots(1, 3)

    # 1. throughput (tokens/s) against concurrency
    levels = [r["concurrency"] for r in sweep]
    if sweep:
        ax_tp.plot(levels, [r["output_throughput"] for r in sweep], marker="o", linestyle="-",
                   label="all streams: output tokens/s")
        ax_tp.plot(levels, [r["decode_tok_s"] for r in sweep], marker="s", linestyle="--",
                   label="per stream: decode tokens/s (1000 / mean TPOT)")
    if decode and decode["decode_tok_s"] is not None:
        ax_tp.plot([1], [decode["decode_tok_s"]], marker="*", markersize=14, linestyle="none",
                   label=f"single-stream decode, {decode['input_tokens']:g}-token prompt")
    if reference:
        ax_tp.axhline(reference["decode_tok_s"], color="black", linestyle="-.", linewidth=1.2,
                      label=f"recipe {reference['label']}: {reference['decode_tok_s']:g} tok/s single-stream decode")
    ax_tp.set_title("Throughput")
    ax_tp.set_xlabel("concurrent requests")
    ax_tp.set_ylabel("output tokens/s")
    ax_tp.set_xticks(sorted(set(levels) | {1}))
    ax_tp.set_ylim(bottom=0)
    ax_tp.grid(True, alpha=0.3)
    _legend(ax_tp)

    # 2. latency percentiles (ms, log scale) against concurrency
    for metric, marker, colour, name in (("ttft", "o", "tab:blue", "TTFT"), ("itl", "s", "tab:red", "ITL")):
        for pct, style in PERCENTILE_STYLES:
            ax_lat.plot(levels, _positive([r[f"{metric}_ms_{pct}"] for r in sweep]), marker=marker,
                        linestyle=style, color=colour, label=f"{name} {pct}")
    prompt = f", {sweep[0]['input_tokens']:g}-token prompts" if sweep else ""
    ax_lat.set_title(f"Latency percentiles over the sweep{prompt}")
    ax_lat.set_xlabel("concurrent requests")
    ax_lat.set_ylabel("latency (ms, log scale)")
    ax_lat.set_yscale("log")
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    ax_lat.yaxis.set_major_formatter(plain)
    ax_lat.yaxis.set_minor_formatter(plain)
    ax_lat.set_xticks(sorted(set(levels) | {1}))
    ax_lat.grid(True, which="both", alpha=0.3)
    _legend(ax_lat, ncols=2)

    # 3. the large prompt's time to first token (s), percentiles
    names = [pct for pct, _style in PERCENTILE_STYLES]
    if ttft:
        values = [ttft[f"ttft_ms_{pct}"] / 1000.0 for pct in names]
        ax_ttft.bar(names, values, color="tab:blue", hatch="//", edgecolor="black",
                    label=f"measured, {ttft['input_tokens']:g}-token prompt, 1 stream")
        for index, value in enumerate(values):
            ax_ttft.annotate(f"{value:.2f} s", (index, value), ha="center", va="bottom", fontsize="small")
        ax_ttft.set_title(f"Time to first token, {ttft['input_tokens']:g}-token prompt")
    else:
        ax_ttft.set_title("Time to first token (no ttft case)")
    if reference:
        low, high = reference["ttft_s"]
        ax_ttft.axhspan(low, high, color="tab:orange", alpha=0.25, hatch="..",
                        label=f"recipe {reference['label']}: big-prompt TTFT {low:g}-{high:g} s")
    ax_ttft.set_xlabel("percentile")
    ax_ttft.set_ylabel("time to first token (s)")
    ax_ttft.set_ylim(bottom=0)
    ax_ttft.grid(True, axis="y", alpha=0.3)
    _legend(ax_ttft)
    return fig


def write_png(figure: Any, path: str) -> None:
    """Render the figure to a PNG file (Agg)."""
    if not HAS_MATPLOTLIB:
        raise ChartError("matplotlib is not installed")
    figure.savefig(path, format="png")
