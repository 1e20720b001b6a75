# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_upgrade: what a run is against the serving release, what follows a failure, and the way back (every refusal)."""
from __future__ import annotations

import json

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _release as rel
from ansible_collections.dgxspark.vllm.plugins.module_utils import _upgrade as up
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import SETTING_KEYS

TAG = "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0"
BROKEN = "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0-broken"
DIGEST = "sha256:" + "a" * 64
IMAGE_ID = "sha256:" + "b" * 64
COMMIT = "5d3f" + "0" * 36
REPO = "dgxspark-lab/tiny-glm53"
MODEL_PATH = "/var/tmp/models/tiny-glm53"
SETTINGS = {"image": TAG, "max_model_len": 4096, "port": 8000, "model_path": MODEL_PATH, "cx7_iface": "eth1"}
RECORD = {"format": 1, "image": TAG, "reference": "ghcr.io/dgxspark-lab/vllm-openai-cpu@" + DIGEST, "digest": DIGEST,
          "source": "head", "image_id": IMAGE_ID}
STAMP = {"format": 1, "repo": REPO, "commit": COMMIT}
ARGS = ["--kv-cache-memory-bytes", "1288490188"]
VERIFY = {"ok": True, "finished": "2026-12-05T05:00:00Z"}


def release(**over):
    args = dict(image=TAG, image_record=RECORD, model_repo=REPO, stamp=STAMP, profile="lab_cpu", settings=SETTINGS,
                serve_args=ARGS, verify=VERIFY, model_revision="main")
    args.update(over)
    return rel.build_release(**args)


def history(*entries, serving=None, good=True):
    out = rel.new_history()
    for entry in entries:
        out, _changed = rel.record(out, entry, now="2026-12-05T05:00:00Z", known_good=good)
    if serving is not None:
        out["serving"] = serving
    return out


def config(**over):
    base = {"image": TAG, "model_repo": REPO, "model_revision": "main", "profile_name": "lab_cpu",
            "settings": dict(SETTINGS), "kv_cache_memory_bytes": None, "model_path": MODEL_PATH,
            "upgrade_rollback": True}
    settings = over.pop("settings", None)
    base.update(over)
    if settings is not None:
        base["settings"] = settings
    return base


# ------------------------------------------------------------------------------------------------- plan_run


def test_no_history_is_a_first_start():
    plan = up.plan_run(rel.new_history(), config())
    assert plan["kind"] == up.FIRST_START and plan["from"] is None and not plan["rollback"]
    assert plan["message"].startswith("first start")


def test_the_serving_release_asked_for_again_is_no_change():
    good = release()
    plan = up.plan_run(history(good), config(), RECORD, running=True)
    assert (plan["kind"], plan["from"], plan["changes"]) == (up.NO_CHANGE, good["id"], [])
    assert plan["message"] == f"no change: the configuration asks for the serving release {good['id']}"


def test_a_release_recorded_before_configured_was_kept_is_matched_through_the_heads_record():
    good = release()
    del good["image"]["configured"]
    assert up.plan_run(history(good), config(), RECORD)["kind"] == up.NO_CHANGE
    # without the record, the tag cannot be matched to the digest: an upgrade (the staging says what it resolves)
    assert up.plan_run(history(good), config(), None)["kind"] == up.UPGRADE


@pytest.mark.parametrize("over, part, stage", [
    ({"image": BROKEN}, "image " + BROKEN, True),
    ({"image": "ghcr.io/dgxspark-lab/vllm-openai-cpu@sha256:" + "c" * 64}, "image ghcr.io/", True),
    ({"model_revision": "6" * 40}, "model commit 666666666666 (serving 5d3f00000000)", True),
    ({"model_revision": "v2"}, "model revision v2 (serving main@5d3f00000000)", True),
    ({"model_repo": "org/other"}, "model org/other@main", True),
    ({"settings": dict(SETTINGS, max_model_len=8192)}, "settings ", False),
    ({"profile_name": "mine"}, "profile mine ", False),
    ({"kv_cache_memory_bytes": 1000}, "KV 1000 bytes (serving 1288490188)", False),
])
def test_each_difference_is_an_upgrade_from_the_serving_release_named_and_rolled_back_to_the_known_good(
        over, part, stage):
    good = release()
    plan = up.plan_run(history(good), config(**over), RECORD, running=True)
    assert plan["kind"] == up.UPGRADE and plan["from"] == good["id"] and plan["stage"] is stage
    assert any(change.startswith(part) for change in plan["changes"]), plan["changes"]
    assert plan["rollback"] and plan["known_good"]["id"] == good["id"]
    assert f"rolls back to the last known-good {good['id']}" in plan["message"]


def test_a_digest_pin_of_the_serving_digest_and_the_commit_itself_are_no_change():
    good = release()
    pinned = config(image="ghcr.io/dgxspark-lab/vllm-openai-cpu@" + DIGEST, model_revision=COMMIT)
    assert up.plan_run(history(good), pinned, RECORD)["kind"] == up.NO_CHANGE


def test_an_unset_kv_value_is_no_change_and_the_serving_image_id_counts_without_a_digest():
    good = release(image_record=dict(RECORD, digest="", reference=TAG))
    assert up.plan_run(history(good), config(kv_cache_memory_bytes=None), None)["kind"] == up.NO_CHANGE


def test_rollback_off_or_nothing_known_good_says_what_a_failure_does():
    good = release()
    off = up.plan_run(history(good), config(image=BROKEN, upgrade_rollback=False), RECORD)
    assert not off["rollback"] and "leaves it stopped" in off["message"] and good["id"] in off["message"]
    unverified = history(good, good=False)
    plan = up.plan_run(unverified, config(image=BROKEN), RECORD)
    assert plan["kind"] == up.UPGRADE and not plan["rollback"] and "no release is known-good yet" in plan["message"]


def test_an_upgrade_is_from_the_serving_release_and_rolls_back_to_the_newest_known_good():
    old, new = release(), release(settings=dict(SETTINGS, max_model_len=8192))
    hist = history(old, new)
    hist = history(old, new, serving=old["id"])   # a rollback left the older one serving
    plan = up.plan_run(hist, config(image=BROKEN), RECORD, running=False)
    assert plan["from"] == old["id"] and plan["known_good"]["id"] == new["id"]
    assert "(its group does not run now)" in plan["message"]


# ---------------------------------------------------------------------------------------------- after_failure


def test_after_a_failure_an_upgrade_rolls_back_stops_or_fails_and_any_other_run_fails_as_it_is():
    good = release()
    upgrade = up.plan_run(history(good), config(image=BROKEN), RECORD)
    decision = up.after_failure(upgrade, "launch", "rank 1 exited: RuntimeError")
    assert decision["action"] == "rollback" and decision["target"]["id"] == good["id"]
    assert decision["message"] == (f"the upgrade from {good['id']} failed; the launch failed: rank 1 exited: "
                                   f"RuntimeError Rolling back to the last known-good {good['id']}")
    stop = up.after_failure(dict(upgrade, rollback=False), "verify", "chat failed")
    assert stop["action"] == "stop" and f"rollback.yml -e release={good['id']}" in stop["message"]
    assert up.after_failure(dict(upgrade, known_good=None), "launch", "x")["action"] == "fail"
    first = up.after_failure(up.plan_run(rel.new_history(), config()), "launch", "boom")
    assert first == {"action": "fail", "target": None, "message": "the launch failed: boom"}
    assert up.after_failure(None, "verify", "boom")["action"] == "fail"


# ---------------------------------------------------------------------------------------- target, check_staged


def test_a_release_is_found_by_its_id_or_a_unique_start():
    good = release()
    hist = history(good)
    assert up.target(hist, good["id"])["id"] == good["id"]
    assert up.target(hist, good["id"][:6])["id"] == good["id"]


@pytest.mark.parametrize("name, words", [
    ("", "no release given"),
    ("000000000000", "is not in the cluster's history (recorded: "),
])
def test_an_unknown_or_missing_id_is_refused_before_anything_stops(name, words):
    with pytest.raises(up.UpgradeError) as err:
        up.target(history(release()), name)
    assert words in str(err.value)
    if name:
        assert "nothing was stopped" in str(err.value)


def test_an_ambiguous_start_is_refused():
    one, two = release(), release(settings=dict(SETTINGS, port=8001))
    with pytest.raises(up.UpgradeError, match="several recorded releases"):
        up.target({"releases": [dict(one, id="ab1"), dict(two, id="ab2")]}, "ab")


HELD = [{"Id": IMAGE_ID, "RepoDigests": ["ghcr.io/dgxspark-lab/vllm-openai-cpu@" + DIGEST]}]


def test_a_release_staged_on_every_node_passes():
    up.check_staged(release(), {"head": {"images": HELD, "stamp": STAMP}, "worker": {"images": HELD, "stamp": STAMP}},
                    MODEL_PATH)
    # held by digest only (another image ID, e.g. pulled again) still counts
    up.check_staged(release(), {"head": {"images": [dict(HELD[0], Id="sha256:" + "9" * 64)], "stamp": STAMP}},
                    MODEL_PATH)


@pytest.mark.parametrize("nodes, words", [
    ({"head": {"images": [], "stamp": STAMP}, "worker": {"images": HELD, "stamp": STAMP}},
     ["head does not hold the image " + TAG]),
    ({"head": {"images": HELD, "stamp": None}, "worker": {"images": HELD, "stamp": STAMP}},
     ["head has no checkpoint stamp in " + MODEL_PATH]),
    ({"head": {"images": HELD, "stamp": STAMP}, "worker": {"images": HELD, "stamp": dict(STAMP, commit="6" * 40)}},
     ["worker's checkpoint in /var/tmp/models/tiny-glm53 is dgxspark-lab/tiny-glm53@666666666666, not the "
      "release's dgxspark-lab/tiny-glm53@5d3f00000000"]),
    ({"head": {"images": [], "stamp": None}}, ["does not hold the image", "has no checkpoint stamp"]),
    ({}, ["no node was read"]),
])
def test_a_release_not_staged_any_more_is_refused_naming_every_missing_part(nodes, words):
    with pytest.raises(up.UpgradeError) as err:
        up.check_staged(release(), nodes, MODEL_PATH)
    for word in words:
        assert word in str(err.value)
    if nodes:
        assert "nothing was stopped or pulled" in str(err.value)


def test_a_release_whose_commit_is_parked_is_staged_and_names_the_nodes_to_swap():
    other = dict(STAMP, commit="6" * 40)
    swap = up.check_staged(release(), {"head": {"images": HELD, "stamp": other, "parked": STAMP},
                                       "worker": {"images": HELD, "stamp": STAMP, "parked": None}}, MODEL_PATH)
    assert swap == ["head"]
    assert up.check_staged(release(), {"head": {"images": HELD, "stamp": STAMP}}, MODEL_PATH) == []


def test_a_parked_tree_of_another_commit_does_not_count():
    other = dict(STAMP, commit="6" * 40)
    with pytest.raises(up.UpgradeError, match="which is not parked in /var/tmp/models/tiny-glm53.commits either"):
        up.check_staged(release(), {"head": {"images": HELD, "stamp": other, "parked": dict(STAMP, commit="7" * 40)}},
                        MODEL_PATH)


def test_a_rollback_while_a_staging_runs_is_refused_before_anything_stops():
    nodes = {"head": {"images": HELD, "stamp": STAMP, "lock": ""},
             "worker": {"images": HELD, "stamp": STAMP, "lock": '{"by": "dgxspark.vllm.checkpoint"}\n'}}
    with pytest.raises(up.UpgradeError) as err:
        up.check_staged(release(), nodes, MODEL_PATH)
    assert "a staging runs (its lock is held on worker ({\"by\": \"dgxspark.vllm.checkpoint\"}))" in str(err.value)
    assert "nothing was stopped" in str(err.value)


def test_the_rollback_task_names_the_nodes_to_swap():
    good = release()
    other = json.dumps(dict(STAMP, commit="6" * 40))
    out = up.run({"mode": "rollback", "release": good["id"], "history": history(good), "config": config(),
                  "nodes": {"head": {"images": HELD, "stamp": other, "parked": json.dumps(STAMP), "lock": ""}}})
    assert out["swap"] == ["head"] and "brought back from /var/tmp/models/tiny-glm53.commits on head" in out["msg"]


# ----------------------------------------------------------------------------------------------- pin


def test_the_pin_serves_the_release_by_digest_with_its_commit_settings_and_kv():
    good = release()
    pin = up.pin(good)
    reference = "ghcr.io/dgxspark-lab/vllm-openai-cpu@" + DIGEST
    assert (pin["image"], pin["model_revision"], pin["kv_cache_memory_bytes"]) == (reference, COMMIT, 1288490188)
    assert pin["image_record"] == {"format": 1, "image": reference, "reference": reference, "digest": DIGEST,
                                   "source": f"release {good['id']}", "image_id": IMAGE_ID, "configured": TAG}
    values = up.pinned_values(pin, SETTING_KEYS)
    assert values["image"] == reference and values["model_revision"] == COMMIT and values["max_model_len"] == 4096
    assert values["kv_cache_memory_bytes"] == 1288490188
    # a setting the release did not have is unset; what preflight finds on each node is not the release's
    assert values["extra_args"] is None and "cx7_iface" not in values
    # the release served again, recorded by verify from that record, is the same release
    again = release(image=reference, image_record=pin["image_record"], settings=dict(SETTINGS, image=reference),
                    model_revision=COMMIT)
    assert again["id"] == good["id"] and again["image"]["configured"] == TAG


def test_an_image_without_a_digest_is_pinned_by_its_tag():
    good = release(image_record=dict(RECORD, digest="", reference=TAG))
    assert up.pin(good)["image"] == TAG and up.pin(good)["image_record"]["image_id"] == IMAGE_ID


@pytest.mark.parametrize("broken, words", [
    ({"image": {}}, "names no image digest nor ID"),
    ({"model": {"repo": REPO, "commit": "main"}}, "names no model commit"),
    ({"settings": None}, "names no profile and settings"),
])
def test_a_release_that_cannot_be_pinned_is_refused(broken, words):
    with pytest.raises(up.UpgradeError, match=words):
        up.pin(dict(release(), **broken))


def test_a_pin_missing_a_part_is_refused_by_the_configuration():
    with pytest.raises(up.UpgradeError, match="has no model_revision"):
        up.pinned_values(dict(up.pin(release()), model_revision=""), SETTING_KEYS)


# --------------------------------------------------------------------------------------------- outcome, run


def test_the_outcome_names_the_failure_the_known_good_and_the_time_against_the_group_start():
    good = release()
    decision = up.after_failure(up.plan_run(history(good), config(image=BROKEN), RECORD), "launch", "rank 1 exited.")
    out = up.outcome(decision, good["id"], found_at=100.0, launch_started_at=110.0, served_at=200.0)
    assert out["message"] == (f"the upgrade from {good['id']} failed; the launch failed: rank 1 exited. Rolled back: "
                              f"the cluster serves the known-good {good['id']} again (verified); serving again 100 s "
                              "after the failure was found (the known-good's group start: 90 s; ratio 1.11).")
    assert (out["seconds"], out["start_seconds"], out["ratio"]) == (100.0, 90.0, 1.111)
    other = up.outcome(decision, "ffffffffffff", 100.0, 110.0, 200.0)
    assert "the release now serving is ffffffffffff, not the known-good" in other["message"]


def test_run_dispatches_each_mode():
    good = release()
    hist = history(good)
    planned = up.run({"mode": "plan", "history": hist, "config": config(image=BROKEN), "record": json.dumps(RECORD),
                      "running": True})
    assert planned["plan"]["kind"] == up.UPGRADE
    found = up.run({"mode": "rollback", "history": hist, "release": good["id"], "config": config(), "nodes": None})
    assert found["pin"]["id"] == good["id"]
    checked = up.run({"mode": "rollback", "history": hist, "release": good["id"], "config": config(),
                      "nodes": {"head": {"images": HELD, "stamp": json.dumps(STAMP)}}})
    assert checked["msg"].startswith(f"release {good['id']} is staged on every node (head)")
    with pytest.raises(up.UpgradeError, match="not JSON"):
        up.run({"mode": "rollback", "history": hist, "release": good["id"], "config": config(),
                "nodes": {"head": {"images": HELD, "stamp": "{"}}})


def test_the_prune_mode_names_the_images_then_plans_each_node():
    old_record = dict(RECORD, digest="sha256:" + "c" * 64, image_id="sha256:" + "d" * 64)
    old = release(stamp=dict(STAMP, commit="6" * 40), image_record=old_record)
    good = release()
    hist = history(old, good)
    listed = up.run({"mode": "prune", "history": hist, "config": config()})
    assert listed["images"] == ["ghcr.io/dgxspark-lab/vllm-openai-cpu@sha256:" + "c" * 64,
                                "ghcr.io/dgxspark-lab/vllm-openai-cpu@" + DIGEST]
    old_image = {"Id": "sha256:" + "d" * 64, "RepoDigests": ["ghcr.io/dgxspark-lab/vllm-openai-cpu@sha256:" + "c" * 64],
                 "Size": 7}
    nodes = {"head": {"parked": {"6" * 40: {"bytes": 5}}, "images": [old_image] + HELD}}
    kept = up.run({"mode": "prune", "history": hist, "config": config(), "nodes": nodes})
    assert kept["bytes"] == 0 and "nothing to prune" in kept["msg"]
    one = up.run({"mode": "prune", "history": hist, "config": config(upgrade_keep_staged=1), "nodes": nodes})
    assert one["bytes"] == 12 and one["prune"]["head"]["checkpoints"] == [{"commit": "6" * 40, "bytes": 5}]
    assert [item["id"] for item in one["prune"]["head"]["images"]] == ["sha256:" + "d" * 64]
    assert one["msg"].startswith("head: prune checkpoint 666666666666, image dddddddddddd: 12 bytes freed")
    with pytest.raises(up.UpgradeError, match="keep at least the serving release"):
        up.run({"mode": "prune", "history": hist, "config": config(upgrade_keep_staged=0), "nodes": nodes})


DF = "Filesystem Avail Mounted on\n/dev/vda {avail} /\n"
MANIFEST = json.dumps({"Descriptor": {"platform": {"architecture": "arm64", "os": "linux"}},
                       "SchemaV2Manifest": {"config": {"size": 0}, "layers": [{"size": 1000}]}})


def test_the_disk_mode_names_the_hub_query_then_checks_every_node():
    asked = up.run({"mode": "disk", "config": config(model_revision="a/b"), "endpoint": "http://10.77.0.6/"})
    assert asked["url"] == f"http://10.77.0.6/api/models/{REPO}/revision/a%2Fb?blobs=true"
    info = {"sha": "6" * 40, "siblings": [{"rfilename": "m.safetensors", "size": 500}]}
    node = {"image_present": False, "manifest": MANIFEST, "architecture": "aarch64", "selected": STAMP, "parked": {},
            "model_df": DF.format(avail=10 ** 6), "docker_df": DF.format(avail=10 ** 6)}
    out = up.run({"mode": "disk", "config": config(), "model_info": info, "nodes": {"head": node}})
    assert "head: image " + TAG + " 0.0 GB" in out["msg"]
    with pytest.raises(up.UpgradeError) as err:
        up.run({"mode": "disk", "config": config(), "model_info": info,
                "nodes": {"head": dict(node, model_df=DF.format(avail=1400), docker_df=DF.format(avail=1400))}})
    assert "head needs 1500 bytes (0.0 GB) on / for the checkpoint and the image" in str(err.value)
    # the new commit parked already, the image held: nothing needed
    held = dict(node, image_present=True, parked={"6" * 40: {}}, model_df=DF.format(avail=0), docker_df=DF.format(avail=0))
    assert "nothing to stage" in up.run({"mode": "disk", "config": config(), "model_info": info,
                                         "nodes": {"head": held}})["msg"]
