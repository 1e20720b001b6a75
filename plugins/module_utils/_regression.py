# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Regression: the serving release's short benchmark against the last known-good release's baseline.

Private module: may change at any time. Pure functions over numbers, no I/O and no Ansible imports.

A baseline (``_bench.baseline_from``) holds three figures: ``decode_tok_s`` (one stream), ``ttft_ms_p50`` and
``output_throughput`` (at the configured concurrency), and the parameters it was measured with. The serving release
is compared with the history's last known-good release when that is another release and its baseline was measured
with the same parameters; each figure may move against it by at most its threshold (percent of the baseline):

- ``decode_drop_percent``: decode tokens/s may fall by this much (default 10);
- ``ttft_rise_percent``: TTFT p50 may rise by this much (default 25);
- ``throughput_drop_percent``: output tokens/s at the concurrency may fall by this much (default 10).

A figure beyond its threshold is a regression: verify fails naming each figure (baseline, now, the change, the
threshold) and the release is not recorded as known-good.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

DEFAULT_THRESHOLDS: Mapping[str, float] = {
    "decode_drop_percent": 10.0,
    "ttft_rise_percent": 25.0,
    "throughput_drop_percent": 10.0,
}
# figure -> (its threshold, whether higher is better, how a person reads it)
FIGURES: tuple[tuple[str, str, bool, str], ...] = (
    ("decode_tok_s", "decode_drop_percent", True, "decode tok/s at concurrency 1"),
    ("ttft_ms_p50", "ttft_rise_percent", False, "TTFT p50 (ms) at concurrency {c}"),
    ("output_throughput", "throughput_drop_percent", True, "output tok/s at concurrency {c}"),
)
VARIABLES: Mapping[str, str] = {key: f"dgxspark_vllm_regression_{key}" for key in DEFAULT_THRESHOLDS}


class RegressionError(ValueError):
    """Thresholds or figures that cannot be used; the message says which and what to set."""


def check_threshold(key: str, value: Any, where: str | None = None) -> float:
    """One threshold, checked: a number above 0; a drop below 100 (a drop of 100 % or more lets anything pass)."""
    name = where or VARIABLES.get(key, key)
    if key not in DEFAULT_THRESHOLDS:
        raise RegressionError(f"{name}: unknown threshold {key!r} (known: {', '.join(DEFAULT_THRESHOLDS)})")
    if isinstance(value, bool):
        raise RegressionError(f"{name} must be a percentage, got {value!r} (e.g. {name}: "
                              f"{DEFAULT_THRESHOLDS[key]:g})")
    try:
        number = float(str(value).strip().rstrip("%"))
    except ValueError:
        raise RegressionError(f"{name} must be a percentage, got {value!r} (e.g. {name}: "
                              f"{DEFAULT_THRESHOLDS[key]:g})") from None
    if not math.isfinite(number) or number <= 0:
        raise RegressionError(f"{name} is {value!r}: a threshold must be a percentage above 0 (0 would fail every "
                              f"run on noise; e.g. {name}: {DEFAULT_THRESHOLDS[key]:g})")
    if key.endswith("_drop_percent") and number >= 100:
        raise RegressionError(f"{name} is {value!r}: a drop of 100 % or more lets anything pass, even nothing "
                              f"served; use a percentage below 100 (e.g. {name}: {DEFAULT_THRESHOLDS[key]:g})")
    return number


def check_thresholds(thresholds: Mapping[str, Any] | None) -> dict[str, float]:
    """Every threshold, the defaults filled in; RegressionError naming each bad one."""
    given = dict(thresholds or {})
    problems: list[str] = []
    out: dict[str, float] = {}
    for key in sorted(set(given) - set(DEFAULT_THRESHOLDS)):
        problems.append(f"unknown threshold {key!r} (known: {', '.join(DEFAULT_THRESHOLDS)})")
    for key, default in DEFAULT_THRESHOLDS.items():
        value = given.get(key)
        try:
            out[key] = default if value is None else check_threshold(key, value)
        except RegressionError as exc:
            problems.append(str(exc))
    if problems:
        raise RegressionError("; ".join(problems))
    return out


def _figure(baseline: Mapping[str, Any], key: str) -> float | None:
    value = baseline.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _no_comparison(reason: str, against: str | None = None) -> dict[str, Any]:
    return {"compared": False, "regressed": False, "against": against, "reason": reason, "figures": [],
            "message": f"no regression check: {reason}"}


def compare(serving_id: str, baseline: Mapping[str, Any] | None, last_good: Mapping[str, Any] | None,
            thresholds: Mapping[str, Any] | None = None,
            serving: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The serving release's baseline against the last known-good release's.

    ``serving`` is the serving release's record (its ``profile`` and ``model.repo``): another profile or another
    model than the last known-good's is a different engine, whose figures are not a regression of it (no comparison).

    Returns ``compared`` (whether the figures were compared), ``regressed``, ``against`` (the known-good id),
    ``reason`` (why there was no comparison, or its outcome), ``figures`` (one entry per figure: name, label,
    baseline, now, change_percent, threshold_percent, regressed) and ``message`` (a sentence naming each figure
    that regressed, with both figures and the threshold). RegressionError for bad thresholds or a serving baseline
    without its figures.
    """
    limits = check_thresholds(thresholds)
    if baseline is None:
        return _no_comparison("no benchmark was run (verify_benchmark is false)")
    now = {figure[0]: _figure(baseline, figure[0]) for figure in FIGURES}
    missing = [key for key, value in now.items() if value is None]
    if missing:
        raise RegressionError(f"the serving release's benchmark has no positive {', '.join(missing)}: it cannot be "
                              "compared")
    if last_good is None:
        return _no_comparison("no release is recorded as known-good yet")
    good_id = str(last_good.get("id"))
    if good_id == serving_id:
        return _no_comparison(f"the serving release {serving_id} is the last known-good", good_id)
    if serving is not None:
        for what, mine, theirs in (
                ("profile", serving.get("profile"), last_good.get("profile")),
                ("model", (serving.get("model") or {}).get("repo"), (last_good.get("model") or {}).get("repo"))):
            if mine != theirs:
                return _no_comparison(f"the last known-good release {good_id} serves another {what} ({theirs}; now "
                                      f"{mine}): its figures are another engine's, not a baseline of this one",
                                      good_id)
    old = last_good.get("baseline")
    if not isinstance(old, Mapping):
        return _no_comparison(f"the last known-good release {good_id} has no baseline (recorded without a "
                              "benchmark)", good_id)
    if dict(old.get("params") or {}) != dict(baseline.get("params") or {}):
        return _no_comparison(f"the last known-good release {good_id}'s baseline was measured with other "
                              f"parameters ({old.get('params')}; now {baseline.get('params')})", good_id)
    before = {figure[0]: _figure(old, figure[0]) for figure in FIGURES}
    if any(value is None for value in before.values()):
        return _no_comparison(f"the last known-good release {good_id}'s baseline lacks a positive figure", good_id)
    level = baseline.get("concurrency") or (baseline.get("params") or {}).get("concurrency")
    figures = []
    for key, limit_key, higher_better, label in FIGURES:
        was, is_now = before[key], now[key]
        change = (is_now - was) / was * 100.0  # type: ignore[operator]
        limit = limits[limit_key]
        worse = -change if higher_better else change
        figures.append({"name": key, "label": label.format(c=level), "baseline": was, "now": is_now,
                        "change_percent": round(change, 1), "threshold_percent": limit,
                        "threshold": f"{'-' if higher_better else '+'}{limit:g} %", "regressed": worse > limit})
    bad = [item for item in figures if item["regressed"]]
    measured = old.get("measured_at") or "an earlier run"
    if not bad:
        return {"compared": True, "regressed": False, "against": good_id,
                "reason": f"within the thresholds of the last known-good release {good_id}", "figures": figures,
                "message": f"no regression against the last known-good release {good_id} (baseline of {measured}): "
                           + "; ".join(_describe(item) for item in figures)}
    return {"compared": True, "regressed": True, "against": good_id,
            "reason": f"regressed against the last known-good release {good_id}", "figures": figures,
            "message": f"release {serving_id} regressed against the last known-good release {good_id} (baseline of "
                       f"{measured}): " + "; ".join(_describe(item) for item in bad)
                       + ". It is not recorded as known-good; the thresholds are "
                       + ", ".join(f"{VARIABLES[k]} {limits[k]:g}" for k in DEFAULT_THRESHOLDS)}


def _describe(item: Mapping[str, Any]) -> str:
    return (f"{item['label']}: baseline {item['baseline']:g}, now {item['now']:g} ({item['change_percent']:+.1f} %, "
            f"allowed {item['threshold']})")
