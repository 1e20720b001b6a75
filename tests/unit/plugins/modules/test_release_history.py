# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.release_history: records the verified release on the head, reads it back, refuses what it must."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import release_history
from helpers.module_runner import ModuleFail, run_module

IMAGE = "registry.lab:5000/vllm-cpu:lab"
DIGEST = "sha256:" + "a" * 64
COMMIT = "5d3f" + "0" * 36


@pytest.fixture()
def head(tmp_path):
    record = tmp_path / "image.json"
    record.write_text(json.dumps({"format": 1, "image": IMAGE, "reference": "r@" + DIGEST, "digest": DIGEST,
                                  "source": "head", "image_id": "sha256:" + "b" * 64}))
    stamp = tmp_path / "model" / ".dgxspark-stamp.json"
    stamp.parent.mkdir()
    stamp.write_text(json.dumps({"format": 1, "repo": "dgxspark-lab/tiny-glm", "commit": COMMIT}))
    path = tmp_path / "state" / "releases.json"
    args = {"state": "known_good", "path": str(path), "image": IMAGE, "image_record_path": str(record),
            "model_repo": "dgxspark-lab/tiny-glm", "stamp_path": str(stamp), "profile": "lab_cpu",
            "settings": {"max_model_len": 4096}, "serve_args": ["--kv-cache-memory-bytes", "1000"],
            "verify": {"ok": True, "finished": "2026-12-05T05:00:00Z", "report": "/r.json"}}
    return args, path


def test_records_known_good_root_only_then_the_same_release_changes_nothing(head):
    args, path = head
    first = run_module(release_history.main, args)
    release = first["release"]
    assert first["changed"] and release["known_good"] and release["model"]["commit"] == COMMIT
    assert release["image"]["digest"] == DIGEST and release["kv_cache_memory_bytes"] == 1000
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["serving"] == release["id"]
    again = run_module(release_history.main, dict(args, verify=dict(args["verify"], finished="later")))
    assert not again["changed"] and len(again["history"]["releases"]) == 1
    assert again["history"]["releases"][0]["verify"]["finished"] == "later"
    read = run_module(release_history.main, {"path": str(path)})
    assert not read["changed"] and read["serving"]["id"] == read["last_known_good"]["id"] == release["id"]
    assert "the serving release" in read["summary"] and release["id"] in read["lines"][1]


def test_check_mode_writes_nothing_and_says_what_it_would(head):
    args, path = head
    result = run_module(release_history.main, args, check_mode=True)
    assert result["changed"] and result["msg"].startswith("would record release") and not path.exists()
    missing = run_module(release_history.main, dict(args, stamp_path=str(path.parent / "none.json")), check_mode=True)
    assert not missing["changed"] and missing["release"] is None and "no checkpoint stamp" in missing["msg"]


@pytest.mark.parametrize("change, words", [
    ({"verify": {"ok": False}}, "verify did not pass"),
    ({"image_record_path": "/nonexistent/image.json"}, "no image record at /nonexistent/image.json"),
    ({"stamp_path": "/nonexistent/stamp.json"}, "no checkpoint stamp"),
    ({"keep": 0}, "keep is 0"),
])
def test_refusals_name_what_is_missing_and_write_nothing(head, change, words):
    args, path = head
    with pytest.raises(ModuleFail) as caught:
        run_module(release_history.main, dict(args, **change))
    assert words in caught.value.result["msg"] and not path.exists()


def test_another_clusters_history_and_a_symlink_are_refused(head):
    args, path = head
    run_module(release_history.main, dict(args, cluster="pair_a"))
    with pytest.raises(ModuleFail, match="cluster pair_a, this run's cluster is pair_b"):
        run_module(release_history.main, {"path": str(path), "cluster": "pair_b"})
    link = path.parent / "link.json"
    link.symlink_to(path)
    with pytest.raises(ModuleFail, match="is a symlink: refused"):
        run_module(release_history.main, {"path": str(link), "cluster": "pair_a"})


PARAMS = {"input_tokens": 64, "output_tokens": 32, "decode_prompts": 2, "concurrency": 4, "prompts": 8}
# figures recorded by the lab's short benchmark (CPU engines, concurrency 4)
GOOD = {"decode_tok_s": 18.4, "ttft_ms_p50": 210.0, "output_throughput": 41.2, "concurrency": 4, "params": PARAMS,
        "measured_at": "2026-12-05T05:00:00Z", "duration_s": 38.0}
# the same release served one sequence at a time (max_num_seqs 1): the four requests queue
ONE_AT_A_TIME = dict(GOOD, decode_tok_s=18.1, ttft_ms_p50=1630.0, output_throughput=17.9,
                     measured_at="2026-12-05T06:00:00Z")


def test_a_baseline_is_recorded_and_a_regressed_release_is_serving_but_not_known_good(head):
    args, path = head
    first = run_module(release_history.main, dict(args, baseline=GOOD))
    assert first["release"]["baseline"]["decode_tok_s"] == 18.4 and first["release"]["known_good"]
    assert not first["regression"]["compared"] and "no release is recorded as known-good" in first["regression"]["reason"]
    changed = dict(args, settings={"max_model_len": 4096, "max_num_seqs": 1})
    second = run_module(release_history.main, dict(changed, baseline=ONE_AT_A_TIME,
                                                   regression={"ttft_rise_percent": 25}))
    regression = second["regression"]
    assert second["changed"] and regression["compared"] and regression["regressed"]
    assert regression["against"] == first["release"]["id"]
    assert not second["release"]["known_good"] and second["release"]["regression"]["regressed"]
    assert second["serving"]["id"] == second["release"]["id"] != first["release"]["id"]
    assert second["last_known_good"]["id"] == first["release"]["id"]
    assert "NOT known-good" in second["msg"]
    assert "TTFT p50 (ms) at concurrency 4: baseline 210, now 1630 (+676.2 %, allowed +25 %)" in regression["message"]
    assert "output tok/s at concurrency 4: baseline 41.2, now 17.9 (-56.6 %, allowed -10 %)" in regression["message"]
    assert "decode tok/s" not in regression["message"]   # -1.6 %: within its threshold
    on_disk = json.loads(path.read_text())
    assert [entry["known_good"] for entry in on_disk["releases"]] == [True, False]


def test_old_records_without_a_baseline_stay_valid_and_are_not_compared(head):
    args, path = head
    run_module(release_history.main, args)   # recorded without a baseline
    changed = dict(args, settings={"max_model_len": 2048})
    out = run_module(release_history.main, dict(changed, baseline=ONE_AT_A_TIME))
    assert out["release"]["known_good"] and not out["regression"]["compared"]
    assert "has no baseline" in out["regression"]["reason"]


def test_nonsense_thresholds_are_refused_before_anything_is_written(head):
    args, path = head
    with pytest.raises(ModuleFail) as failure:
        run_module(release_history.main, dict(args, baseline=GOOD, regression={"decode_drop_percent": 100}))
    assert "dgxspark_vllm_regression_decode_drop_percent is 100.0: a drop of 100 % or more lets anything pass" \
        in failure.value.result["msg"]
    assert not path.exists()


def test_the_configured_revision_and_image_are_kept_beside_the_commit_and_digest(head):
    args, _path = head
    release = run_module(release_history.main, dict(args, model_revision="main"))["release"]
    assert release["model"] == {"repo": "dgxspark-lab/tiny-glm", "commit": COMMIT, "revision": "main"}
    assert release["image"]["configured"] == IMAGE


def _keep(args, reports, name, **extra):
    return run_module(release_history.main, dict({"state": "report", "path": args["path"], "reports_path": str(reports),
                                                  "report": {"ok": True, "name": name}, "report_name": name}, **extra))


def test_a_report_is_kept_root_only_on_the_head_and_the_release_names_it(head):
    args, path = head
    reports = path.parent / "verify-reports"
    kept = _keep(args, reports, "verify-20261205T050000Z.json")
    report = reports / "verify-20261205T050000Z.json"
    assert kept["changed"] and kept["report_path"] == str(report) and kept["pruned"] == []
    assert json.loads(report.read_text()) == {"ok": True, "name": "verify-20261205T050000Z.json"}
    assert stat.S_IMODE(os.stat(report).st_mode) == 0o600
    recorded = run_module(release_history.main, dict(args, verify=dict(args["verify"], head_report=str(report))))
    assert recorded["release"]["verify"]["head_report"] == str(report)
    assert json.loads(path.read_text())["releases"][0]["verify"]["head_report"] == str(report)


def test_reports_no_release_names_are_pruned_beyond_the_newest_few_and_the_named_one_stays(head):
    args, path = head
    reports = path.parent / "verify-reports"
    names = [f"verify-20261205T05000{n}Z.json" for n in range(5)]
    _keep(args, reports, names[0])
    run_module(release_history.main, dict(args, verify=dict(args["verify"], head_report=str(reports / names[0]))))
    for number, name in enumerate(names[1:4], start=1):
        _keep(args, reports, name, reports_keep=5)
        os.utime(reports / name, (1000 + number, 1000 + number))
    (reports / "notes.txt").write_text("not a report")
    last = _keep(args, reports, names[4], reports_keep=1)
    # names[0] is the release's, names[4] the one just written, names[3] the newest loose one: 1 and 2 go
    assert last["pruned"] == [str(reports / names[1]), str(reports / names[2])]
    assert sorted(os.listdir(reports)) == sorted([names[0], names[3], names[4], "notes.txt"])


def test_check_mode_keeps_no_report_and_prunes_nothing(head):
    args, path = head
    reports = path.parent / "verify-reports"
    _keep(args, reports, "verify-a.json")
    result = run_module(release_history.main, {"state": "report", "path": str(path), "reports_path": str(reports),
                                               "report": {}, "report_name": "verify-b.json", "reports_keep": 0},
                        check_mode=True)
    assert result["pruned"] == [str(reports / "verify-a.json")] and result["msg"].startswith("would keep")
    assert os.listdir(reports) == ["verify-a.json"]


@pytest.mark.parametrize("name", ["../verify-x.json", "verify-x.txt", "x.json", "verify-/a.json", ""])
def test_a_report_name_that_is_not_a_verify_reports_is_refused(head, name):
    args, path = head
    reports = path.parent / "verify-reports"
    with pytest.raises(ModuleFail, match="is not a verify report's file name"):
        _keep(args, reports, name)
    assert not reports.exists()


def test_a_reports_folder_open_to_others_is_refused(head):
    args, path = head
    reports = path.parent / "verify-reports"
    reports.mkdir(parents=True)
    reports.chmod(0o777)
    with pytest.raises(ModuleFail, match="verify reports folder"):
        _keep(args, reports, "verify-a.json")
    assert os.listdir(reports) == []
