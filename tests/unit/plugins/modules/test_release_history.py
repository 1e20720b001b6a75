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


def test_the_configured_revision_and_image_are_kept_beside_the_commit_and_digest(head):
    args, _path = head
    release = run_module(release_history.main, dict(args, model_revision="main"))["release"]
    assert release["model"] == {"repo": "dgxspark-lab/tiny-glm", "commit": COMMIT, "revision": "main"}
    assert release["image"]["configured"] == IMAGE
