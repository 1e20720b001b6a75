# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_regression: the serving release's short benchmark against the last known-good release's baseline."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _regression as reg

PARAMS = {"input_tokens": 32, "output_tokens": 16, "decode_prompts": 2, "concurrency": 4, "prompts": 4}
# recorded in the lab (two CPU engines, concurrency 4, max_num_seqs 4)
GOOD = {"decode_tok_s": 18.4, "ttft_ms_p50": 210.0, "output_throughput": 41.2, "concurrency": 4, "params": PARAMS,
        "measured_at": "2026-12-05T05:00:00Z"}
KNOWN_GOOD = {"id": "aaaaaaaaaaaa", "known_good": True, "baseline": GOOD}


def now(**figures):
    return dict(GOOD, measured_at="2026-12-05T06:00:00Z", **figures)


def test_the_defaults_are_the_documented_ones():
    assert reg.check_thresholds(None) == {"decode_drop_percent": 10.0, "ttft_rise_percent": 25.0,
                                          "throughput_drop_percent": 10.0}
    assert reg.check_thresholds({"ttft_rise_percent": "40", "decode_drop_percent": 5}) == {
        "decode_drop_percent": 5.0, "ttft_rise_percent": 40.0, "throughput_drop_percent": 10.0}


@pytest.mark.parametrize("key, value, expected", [
    ("decode_drop_percent", 0, "dgxspark_vllm_regression_decode_drop_percent is 0: a threshold must be a percentage "
                               "above 0"),
    ("ttft_rise_percent", -5, "dgxspark_vllm_regression_ttft_rise_percent is -5: a threshold must be a percentage"),
    ("decode_drop_percent", 100, "a drop of 100 % or more lets anything pass"),
    ("throughput_drop_percent", 250, "dgxspark_vllm_regression_throughput_drop_percent is 250: a drop of 100 %"),
    ("ttft_rise_percent", "fast", "dgxspark_vllm_regression_ttft_rise_percent must be a percentage, got 'fast' "
                                  "(e.g. dgxspark_vllm_regression_ttft_rise_percent: 25)"),
    ("decode_drop_percent", True, "must be a percentage, got True"),
    ("ttft_rise_percent", float("nan"), "a threshold must be a percentage above 0"),
    ("latency_percent", 10, "unknown threshold 'latency_percent'"),
])
def test_nonsense_thresholds_are_refused_naming_the_variable(key, value, expected):
    with pytest.raises(reg.RegressionError) as failure:
        reg.check_thresholds({key: value})
    assert expected in str(failure.value)


def test_a_rise_of_more_than_100_percent_is_a_threshold_like_any_other():
    assert reg.check_threshold("ttft_rise_percent", 300) == 300.0


@pytest.mark.parametrize("baseline, last_good, reason", [
    (None, KNOWN_GOOD, "no benchmark was run (verify_benchmark is false)"),
    (now(), None, "no release is recorded as known-good yet"),
    (now(), dict(KNOWN_GOOD, id="bbbbbbbbbbbb"), "the serving release bbbbbbbbbbbb is the last known-good"),
    (now(), {"id": "aaaaaaaaaaaa", "known_good": True}, "the last known-good release aaaaaaaaaaaa has no baseline"),
    (now(params=dict(PARAMS, concurrency=1), concurrency=1), KNOWN_GOOD,
     "the last known-good release aaaaaaaaaaaa's baseline was measured with other parameters"),
])
def test_nothing_is_compared_without_a_comparable_known_good_baseline(baseline, last_good, reason):
    out = reg.compare("bbbbbbbbbbbb", baseline, last_good)
    assert not out["compared"] and not out["regressed"] and out["figures"] == []
    assert reason in out["reason"] and out["message"].startswith("no regression check: ")


def test_figures_within_their_thresholds_pass_and_are_all_listed():
    # decode -10 % exactly, TTFT +25 % exactly, throughput better: each at or inside its threshold
    out = reg.compare("bbbbbbbbbbbb", now(decode_tok_s=16.56, ttft_ms_p50=262.5, output_throughput=45.0), KNOWN_GOOD)
    assert out["compared"] and not out["regressed"] and out["against"] == "aaaaaaaaaaaa"
    assert [(f["name"], f["change_percent"], f["regressed"]) for f in out["figures"]] == [
        ("decode_tok_s", -10.0, False), ("ttft_ms_p50", 25.0, False), ("output_throughput", 9.2, False)]
    assert out["message"].startswith("no regression against the last known-good release aaaaaaaaaaaa")


@pytest.mark.parametrize("figures, named, not_named", [
    ({"decode_tok_s": 16.0}, ["decode tok/s at concurrency 1: baseline 18.4, now 16 (-13.0 %, allowed -10 %)"],
     ["TTFT", "output tok/s"]),
    ({"ttft_ms_p50": 1630.0, "output_throughput": 17.9},
     ["TTFT p50 (ms) at concurrency 4: baseline 210, now 1630 (+676.2 %, allowed +25 %)",
      "output tok/s at concurrency 4: baseline 41.2, now 17.9 (-56.6 %, allowed -10 %)"], ["decode tok/s"]),
])
def test_a_regression_names_each_figure_with_both_values_and_its_threshold(figures, named, not_named):
    out = reg.compare("bbbbbbbbbbbb", now(**figures), KNOWN_GOOD)
    assert out["compared"] and out["regressed"] and out["against"] == "aaaaaaaaaaaa"
    assert out["message"].startswith("release bbbbbbbbbbbb regressed against the last known-good release "
                                     "aaaaaaaaaaaa (baseline of 2026-12-05T05:00:00Z): ")
    for text in named:
        assert text in out["message"]
    for text in not_named:
        assert text not in out["message"]
    assert "It is not recorded as known-good" in out["message"]
    assert "dgxspark_vllm_regression_ttft_rise_percent 25" in out["message"]


def test_the_thresholds_in_the_configuration_decide():
    assert reg.compare("bbbbbbbbbbbb", now(decode_tok_s=16.0), KNOWN_GOOD, {"decode_drop_percent": 15})["regressed"] \
        is False
    assert reg.compare("bbbbbbbbbbbb", now(ttft_ms_p50=240.0), KNOWN_GOOD, {"ttft_rise_percent": 10})["regressed"]


def test_a_serving_baseline_without_its_figures_cannot_be_compared():
    with pytest.raises(reg.RegressionError, match="has no positive decode_tok_s"):
        reg.compare("bbbbbbbbbbbb", now(decode_tok_s=0), KNOWN_GOOD)


@pytest.mark.parametrize("serving, what", [
    ({"profile": "glm53_flash_exl3", "model": {"repo": "org/glm"}}, "another profile (lab_cpu; now glm53_flash_exl3)"),
    ({"profile": "lab_cpu", "model": {"repo": "org/other"}}, "another model (org/glm; now org/other)"),
])
def test_another_profile_or_model_is_not_compared(serving, what):
    # far slower, yet another engine: not a regression of the known-good one
    good = dict(KNOWN_GOOD, profile="lab_cpu", model={"repo": "org/glm", "commit": "c" * 40})
    result = reg.compare("bbbbbbbbbbbb", now(decode_tok_s=1.0, ttft_ms_p50=9000.0, output_throughput=1.0), good,
                         serving=serving)
    assert not result["compared"] and not result["regressed"]
    assert what in result["reason"]
    same = reg.compare("bbbbbbbbbbbb", now(decode_tok_s=1.0), good,
                       serving={"profile": "lab_cpu", "model": {"repo": "org/glm", "commit": "d" * 40}})
    assert same["compared"] and same["regressed"]    # a new revision of the same model is compared
