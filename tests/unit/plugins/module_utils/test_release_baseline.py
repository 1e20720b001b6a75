# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_release with baselines: stored in the entry, a regression recorded as serving but not known-good, shown."""
from __future__ import annotations

from ansible_collections.dgxspark.vllm.plugins.module_utils import _regression as reg
from ansible_collections.dgxspark.vllm.plugins.module_utils import _release as rel

PARAMS = {"input_tokens": 32, "output_tokens": 16, "decode_prompts": 2, "concurrency": 4, "prompts": 4}
GOOD = {"decode_tok_s": 18.4, "ttft_ms_p50": 210.0, "output_throughput": 41.2, "concurrency": 4, "params": PARAMS,
        "measured_at": "t1", "duration_s": 38.0}
SLOW = dict(GOOD, ttft_ms_p50=1630.0, output_throughput=17.9, measured_at="t2")


def release(n: int) -> dict:
    return {"id": f"{n:012x}", "cluster": "", "image": {"digest": "sha256:" + "a" * 64}, "model": {"commit": "c" * 40},
            "settings_hash": f"{n:016x}", "kv_cache_memory_bytes": 1000, "verify": {"ok": True, "finished": f"t{n}"}}


def judged(history: dict, n: int, baseline: dict, now: str) -> tuple[dict, bool]:
    comparison = reg.compare(release(n)["id"], baseline, rel.last_known_good(history))
    return rel.record(history, release(n), now=now, known_good=not comparison["regressed"], baseline=baseline,
                      regression=comparison)


def test_the_baseline_is_stored_and_a_new_measurement_of_the_same_release_replaces_it_without_a_change():
    history, changed = judged(rel.new_history(), 1, GOOD, "t1")
    assert changed and history["releases"][0]["baseline"] == GOOD
    again, changed = judged(history, 1, dict(GOOD, decode_tok_s=18.0), "t2")
    assert not changed and again["releases"][0]["baseline"]["decode_tok_s"] == 18.0
    # recorded without a baseline (verify_benchmark false): the entry keeps the one it had
    kept = rel.record(again, release(1), now="t3", known_good=True)[0]
    assert kept["releases"][0]["baseline"]["decode_tok_s"] == 18.0


def test_a_regressed_release_is_serving_not_known_good_and_the_last_known_good_stays():
    history = judged(rel.new_history(), 1, GOOD, "t1")[0]
    history, changed = judged(history, 2, SLOW, "t2")
    assert changed
    entry = rel.serving(history)
    assert entry["id"] == release(2)["id"] and entry["known_good"] is False and entry["known_good_at"] is None
    assert entry["regression"]["regressed"] and entry["regression"]["found_at"] == "t2"
    assert entry["regression"]["against"] == release(1)["id"] and entry["baseline"] == SLOW
    assert rel.last_known_good(history)["id"] == release(1)["id"]


def test_a_regression_is_the_one_thing_that_takes_a_known_good_mark_back():
    history = judged(rel.new_history(), 1, SLOW, "t1")[0]          # known-good, slow
    history = judged(history, 2, GOOD, "t2")[0]                    # faster: no regression, known-good
    history, changed = judged(history, 1, SLOW, "t3")              # back to 1: slower than the last known-good
    first = rel.find(history, release(1)["id"])
    assert changed and first["known_good"] is False and first["regression"]["regressed"]
    assert rel.last_known_good(history)["id"] == release(2)["id"]
    # measured again within the thresholds of the last known-good, it is known-good again and the comparison goes
    history, changed = judged(history, 1, GOOD, "t4")
    first = rel.find(history, release(1)["id"])
    assert changed and first["known_good"] is True and "regression" not in first


def test_the_listing_and_the_status_show_the_baseline_and_the_regression():
    history = judged(rel.new_history(), 1, GOOD, "t1")[0]
    history = judged(history, 2, SLOW, "t2")[0]
    table = rel.lines(history)
    assert table[1].endswith("yes (last known-good); baseline: decode 18.4 tok/s, TTFT p50 210.0 ms and 41.2 tok/s "
                             "out at concurrency 4")
    assert "no (serving, regressed); baseline: decode 18.4 tok/s, TTFT p50 1630.0 ms" in table[2]
    text = rel.summary(history)
    assert "not known-good, regressed, baseline decode 18.4 tok/s, TTFT p50 1630.0 ms" in text
    assert rel.row(rel.find(history, release(1)["id"]), history)["marks"] == ["last known-good"]


def test_a_record_without_a_baseline_is_listed_as_before():
    history = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    assert rel.lines(history)[1].endswith("yes (serving, last known-good)")
    assert rel.row(history["releases"][0], history)["baseline"] == ""
    assert rel.summary(history).endswith("known-good); last known-good: the serving release")
