# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_release: the release a serving group is, its stable id, the history (last N, known-good), the head's file."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _release as rel

IMAGE = "registry.lab:5000/vllm-cpu:lab"
DIGEST = "sha256:" + "a" * 64
COMMIT = "5d3f" + "0" * 36
RECORD = {"format": 1, "image": IMAGE, "reference": "registry.lab:5000/vllm-cpu@" + DIGEST, "digest": DIGEST,
          "source": "head", "image_id": "sha256:" + "b" * 64}
STAMP = {"format": 1, "repo": "dgxspark-lab/tiny-glm", "commit": COMMIT}
SETTINGS = {"image": IMAGE, "max_model_len": 4096, "port": 8000, "kv_cache_memory_bytes": None}
ARGS = ["serve", "/models/tiny", "--port", "8000", "--kv-cache-memory-bytes", "45175492096"]
VERIFY = {"ok": True, "finished": "2026-12-05T05:00:00Z", "report": "/home/u/dgxspark-vllm/verify/verify-x.json"}


def build(**over):
    args = dict(image=IMAGE, image_record=RECORD, model_repo=STAMP["repo"], stamp=STAMP, profile="lab_cpu",
                settings=SETTINGS, serve_args=ARGS, kv_configured=None, verify=VERIFY, cluster="")
    args.update(over)
    return rel.build_release(**args)


def test_a_release_carries_every_part_and_the_same_identity_gives_the_same_id():
    first = build()
    assert first["image"] == {"reference": RECORD["reference"], "digest": DIGEST, "image_id": RECORD["image_id"],
                              "configured": IMAGE}
    assert first["model"] == {"repo": "dgxspark-lab/tiny-glm", "commit": COMMIT}
    assert (first["profile"], first["kv_cache_memory_bytes"]) == ("lab_cpu", 45175492096)
    assert first["settings"] == {"image": IMAGE, "max_model_len": 4096, "port": 8000}
    assert first["verify"] == VERIFY and len(first["id"]) == rel.ID_LENGTH
    # another run (its own verify time, settings in another order) is the same release
    again = build(verify={"ok": True, "finished": "2026-12-06T00:00:00Z"},
                  settings=dict(reversed(list(SETTINGS.items()))))
    assert again["id"] == first["id"]
    # the id is a pure function of the identity: fixed here so that a change of the hashing shows
    assert first["id"] == rel.release_id(DIGEST, STAMP["repo"], COMMIT, first["settings_hash"], 45175492096)


@pytest.mark.parametrize("over", [
    {"image_record": dict(RECORD, digest="sha256:" + "c" * 64, reference="x")},
    {"stamp": dict(STAMP, commit="6" * 40)},
    {"settings": dict(SETTINGS, max_model_len=8192)},
    {"profile": "other"},
    {"serve_args": ARGS[:-2] + ["--kv-cache-memory-bytes=1000"]},
])
def test_each_identity_part_changes_the_id(over):
    assert build(**over)["id"] != build()["id"]


def test_the_configured_image_and_revision_are_kept_beside_the_identity_and_do_not_change_it():
    # a rollback's record names the digest reference it runs and keeps the image the release was staged as
    pinned = "registry.lab:5000/vllm-cpu@" + DIGEST
    rolled = build(image=pinned, image_record=dict(RECORD, image=pinned, configured=IMAGE), model_revision="main")
    assert rolled["image"]["configured"] == IMAGE and rolled["model"]["revision"] == "main"
    assert rolled["id"] == build()["id"]


def test_the_image_reference_and_the_configured_kv_are_not_the_identity_when_the_container_says_otherwise():
    # the image is identified by its digest: the tag or digest spelling of the setting does not matter
    assert build(settings=dict(SETTINGS, image="registry.lab:5000/vllm-cpu@" + DIGEST))["id"] == build()["id"]
    assert build(kv_configured=1)["id"] == build()["id"]


@pytest.mark.parametrize("args, configured, expected", [
    (["--kv-cache-memory-bytes", "42"], None, (42, "the serve container's --kv-cache-memory-bytes")),
    (["bash", "-c", "vllm serve m --kv-cache-memory-bytes=43 --port 1"], None, 43),
    ([], 44, (44, "dgxspark_vllm_kv_cache_memory_bytes")),
    (None, "45", 45),
    ([], None, None),
])
def test_the_kv_value_the_launch_used(args, configured, expected):
    got = rel.launch_kv(args, configured)
    assert (got if isinstance(expected, tuple) else got[0]) == expected


@pytest.mark.parametrize("args", [["--kv-cache-memory-bytes"], ["--kv-cache-memory-bytes", "lots"],
                                  ["--kv-cache-memory-bytes=0"]])
def test_a_kv_flag_that_is_not_a_byte_count_is_refused(args):
    with pytest.raises(rel.ReleaseError, match="the KV value"):
        build(serve_args=args)


@pytest.mark.parametrize("over, words", [
    ({"image_record": None}, ["image digest", "no image record", "--tags image"]),
    ({"image_record": dict(RECORD, image="other:tag")}, ["is for 'other:tag'"]),
    ({"image_record": dict(RECORD, digest="", image_id="")}, ["neither a digest nor an image ID"]),
    ({"stamp": None}, ["model commit", "no checkpoint stamp", "--tags checkpoint"]),
    ({"stamp": dict(STAMP, repo="org/other")}, ["is for 'org/other'"]),
    ({"stamp": dict(STAMP, commit="main")}, ["not a 40-hex commit"]),
    ({"profile": ""}, ["the profile"]),
])
def test_a_part_that_cannot_be_known_is_refused_by_name(over, words):
    with pytest.raises(rel.ReleaseError) as caught:
        build(**over)
    for word in words:
        assert word in str(caught.value)


def test_every_missing_part_is_named_at_once():
    with pytest.raises(rel.ReleaseError) as caught:
        build(image_record=None, stamp=None)
    assert "image digest" in str(caught.value) and "model commit" in str(caught.value)


def test_an_image_without_repo_digest_is_identified_by_its_image_id():
    local = build(image_record=dict(RECORD, digest=""))
    assert local["image"]["digest"] == "" and local["id"] != build()["id"]
    assert rel.row(local, {"releases": [local]})["image_digest"] == "b" * rel.SHORT


# ------------------------------------------------------------------------------------------------- history


def release(n: int, ok: bool = True) -> dict:
    return build(stamp=dict(STAMP, commit=f"{n:040x}"), verify=dict(VERIFY, ok=ok))


def test_record_known_good_appends_newest_last_and_marks_it():
    history, changed = rel.record(rel.new_history(), release(1), now="t1", known_good=True)
    assert changed and history["serving"] == release(1)["id"]
    entry = history["releases"][-1]
    assert (entry["known_good"], entry["known_good_at"], entry["recorded_at"]) == (True, "t1", "t1")
    history, changed = rel.record(history, release(2), now="t2", known_good=True)
    assert [e["id"] for e in history["releases"]] == [release(1)["id"], release(2)["id"]]
    assert rel.serving(history)["id"] == rel.last_known_good(history)["id"] == release(2)["id"]


def test_the_same_id_again_updates_its_entry_instead_of_a_duplicate():
    history = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    history, changed = rel.record(history, dict(release(1), verify=dict(VERIFY, finished="later")), now="t2",
                                  known_good=True)
    assert len(history["releases"]) == 1 and not changed
    entry = history["releases"][0]
    assert (entry["verify"]["finished"], entry["updated_at"], entry["recorded_at"], entry["known_good_at"]) == \
        ("later", "t2", "t1", "t1")


def test_an_older_release_recorded_again_becomes_the_newest_and_serving():
    history = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    history = rel.record(history, release(2), now="t2", known_good=True)[0]
    history, changed = rel.record(history, release(1), now="t3", known_good=True)
    assert changed and [e["id"] for e in history["releases"]] == [release(2)["id"], release(1)["id"]]
    assert history["serving"] == release(1)["id"]


def test_keeps_the_last_n_but_never_the_serving_or_the_last_known_good():
    history = rel.new_history()
    for n in range(12):
        history = rel.record(history, release(n), now=f"t{n}", known_good=True)[0]
    assert [e["id"] for e in history["releases"]] == [release(n)["id"] for n in range(2, 12)]
    # a release recorded but not known-good (what an upgrade will do) keeps the last known-good beyond N
    history = rel.record(history, release(99, ok=False), now="t99", known_good=False, keep=2)[0]
    assert [e["id"] for e in history["releases"]] == [release(11)["id"], release(99)["id"]]
    history = rel.record(history, release(98, ok=False), now="t98", known_good=False, keep=1)[0]
    assert [e["id"] for e in history["releases"]] == [release(11)["id"], release(98)["id"]]
    assert rel.last_known_good(history)["id"] == release(11)["id"] and rel.serving(history)["id"] == release(98)["id"]


def test_a_failed_verify_is_never_recorded_known_good_and_a_mark_is_never_taken_back():
    with pytest.raises(rel.ReleaseError, match="did not pass verify"):
        rel.record(rel.new_history(), release(1, ok=False), now="t", known_good=True)
    history = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    history = rel.record(history, release(1), now="t2", known_good=False)[0]
    assert history["releases"][0]["known_good"] is True
    with pytest.raises(rel.ReleaseError, match="keep"):
        rel.record(history, release(1), now="t", keep=0)


@pytest.mark.parametrize("text, words", [
    ("{not json", "is not JSON"),
    (json.dumps({"format": 2, "releases": []}), "format 1"),
    (json.dumps({"format": 1, "releases": [{"no": "id"}]}), "not a list of releases"),
])
def test_a_history_that_is_not_one_is_refused_never_replaced(text, words):
    with pytest.raises(rel.ReleaseError, match=words):
        rel.parse_history(text, "/x/releases.json")


def test_parse_round_trip_and_an_empty_file_is_an_empty_history():
    assert rel.parse_history("") == rel.parse_history(None) == rel.new_history()
    history = rel.record(rel.new_history("pair_a"), release(1), now="t1", known_good=True)[0]
    assert rel.parse_history(rel.dumps(history)) == history


def test_another_clusters_history_is_refused():
    history = rel.record(rel.new_history("pair_a"), dict(release(1), cluster="pair_a"), now="t1", known_good=True)[0]
    rel.check_cluster(history, "pair_a")
    with pytest.raises(rel.ReleaseError, match="cluster pair_a, this run's cluster is pair_b"):
        rel.check_cluster(history, "pair_b")
    # a single cluster's history (unnamed) stays the head's when the inventory names its cluster
    unnamed = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    rel.check_cluster(unnamed, "pair_a")
    assert rel.record(unnamed, dict(release(2), cluster="pair_a"), now="t2", known_good=True)[0]["cluster"] == "pair_a"


def test_rows_lines_and_summary_show_the_history():
    history = rel.record(rel.new_history(), release(1), now="t1", known_good=True)[0]
    history = rel.record(history, release(2, ok=False), now="t2", known_good=False)[0]
    first, second = (rel.row(e, history) for e in history["releases"])
    assert (first["image_digest"], first["model_commit"], first["known_good"]) == ("a" * 12, f"{1:040x}"[:12], True)
    assert first["marks"] == ["last known-good"] and second["marks"] == ["serving"]
    assert second["verify"].startswith("failed") and first["kv_cache_memory_bytes"] == 45175492096
    table = rel.lines(history)
    assert len(table) == 3 and release(2)["id"] in table[2] and "(serving)" in table[2]
    text = rel.summary(history)
    assert text.startswith(f"serving release: {release(2)['id']}") and f"last known-good: {release(1)['id']}" in text
    assert "no release recorded yet" in rel.lines(rel.new_history())[1]
    assert rel.summary(rel.new_history()) == "serving release: none recorded; last known-good: none recorded"


# ------------------------------------------------------------------------------------------------ the file


def test_write_then_read_0600_and_unchanged_content_is_no_change(tmp_path):
    path = str(tmp_path / "state" / "releases.json")
    assert rel.read_file(path) is None
    assert rel.write_file(path, "{}\n", check_mode=True) is True and not os.path.exists(path)
    assert rel.write_file(path, "{}\n") is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and rel.read_file(path) == "{}\n"
    assert rel.write_file(path, "{}\n") is False


def test_a_symlinked_or_open_file_is_refused(tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text("{}")
    link = tmp_path / "releases.json"
    link.symlink_to(real)
    for call in (lambda: rel.read_file(str(link)), lambda: rel.write_file(str(link), "{}")):
        with pytest.raises(rel.ReleaseError, match="is a symlink: refused"):
            call()
    open_file = tmp_path / "open.json"
    open_file.write_text("{}")
    open_file.chmod(0o644)
    with pytest.raises(rel.ReleaseError, match="mode 0644"):
        rel.read_file(str(open_file))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_foreign_owned_file_or_folder_is_refused(tmp_path):
    path = tmp_path / "releases.json"
    path.write_text("{}")
    path.chmod(0o600)
    os.chown(path, 12345, -1)
    for call in (lambda: rel.read_file(str(path)), lambda: rel.write_file(str(path), "{}")):
        with pytest.raises(rel.ReleaseError, match="belongs to .*not root"):
            call()
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(rel.ReleaseError, match="refusing the release history folder"):
        rel.write_file(str(folder / "releases.json"), "{}")


@pytest.mark.parametrize("reports, referenced, keep, current, expected", [
    ({}, set(), 3, "", []),
    ({"verify-a.json": 1, "verify-b.json": 2, "verify-c.json": 3}, set(), 1, "", ["verify-a.json", "verify-b.json"]),
    ({"verify-a.json": 1, "verify-b.json": 2, "verify-c.json": 3}, {"verify-a.json"}, 1, "", ["verify-b.json"]),
    ({"verify-a.json": 1, "verify-b.json": 2, "verify-c.json": 3}, set(), 0, "verify-c.json",
     ["verify-a.json", "verify-b.json"]),
    ({"verify-a.json": 1, "other.json": 0, "verify-b.txt": 0}, set(), 0, "", ["verify-a.json"]),
])
def test_reports_to_prune_keeps_the_named_the_current_and_the_newest_loose_ones(
        reports, referenced, keep, current, expected):
    assert rel.reports_to_prune(reports, referenced, keep, current) == expected


def test_referenced_reports_are_the_head_reports_in_that_folder():
    history = {"releases": [{"id": "a", "verify": {"head_report": "/r/verify-a.json"}},
                            {"id": "b", "verify": {"head_report": "/elsewhere/verify-b.json"}},
                            {"id": "c", "verify": {}}]}
    assert rel.referenced_reports(history, "/r/") == {"verify-a.json"}
    with pytest.raises(rel.ReleaseError):
        rel.reports_to_prune({}, set(), -1)


def test_the_head_report_is_kept_in_the_release_verify_part():
    assert rel._verify_part({"ok": True, "head_report": "/r/verify-a.json"})["head_report"] == "/r/verify-a.json"
    assert "head_report" not in rel._verify_part({"ok": True})
