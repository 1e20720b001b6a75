# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_checkpoint_store: which tree moves where so the wanted commit is served, and the retention choice."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _checkpoint_store as cs

A, B, C = "a" * 40, "b" * 40, "c" * 40
REPO = "org/model"


def stamp(commit, repo=REPO):
    return {"repo": repo, "commit": commit}


@pytest.mark.parametrize("current, exists, wanted, parked, expected", [
    # the wanted commit is the selected tree: nothing moves
    (stamp(A), True, A, {}, {"park": None, "unpark": None, "set_aside": False, "selected": True}),
    # a new commit: the selected one is parked, the new one is not staged yet (downloaded at the model path)
    (stamp(A), True, B, {}, {"park": A, "unpark": None, "set_aside": False, "selected": False}),
    # back to a parked commit: a swap
    (stamp(B), True, A, {A: stamp(A)}, {"park": B, "unpark": A, "set_aside": False, "selected": False}),
    # the model path gone (a move interrupted): the wanted commit comes back
    (None, False, A, {A: stamp(A), B: stamp(B)}, {"park": None, "unpark": A, "set_aside": False, "selected": False}),
    # an unstamped tree (an interrupted download) is completed in place...
    (None, True, B, {A: stamp(A)}, {"park": None, "unpark": None, "set_aside": False, "selected": False}),
    # ...unless the wanted commit is parked: it is set aside
    (None, True, A, {A: stamp(A)}, {"park": None, "unpark": A, "set_aside": True, "selected": False}),
    # another model's tree is parked too; a parked commit of another repo is not the wanted one
    (stamp(A, "org/other"), True, B, {B: stamp(B, "org/other")},
     {"park": A, "unpark": None, "set_aside": False, "selected": False}),
])
def test_plan_select(current, exists, wanted, parked, expected):
    plan = cs.plan_select(current, exists, REPO, wanted, parked)
    assert {key: plan[key] for key in expected} == expected
    assert plan["message"]


def test_plan_select_refuses_a_commit_both_selected_and_parked():
    with pytest.raises(cs.StoreError, match=f"{A} is both the selected tree and parked"):
        cs.plan_select(stamp(A), True, REPO, B, {A: stamp(A)})


def test_plan_select_needs_a_commit():
    with pytest.raises(cs.StoreError, match="not a 40-hex commit"):
        cs.plan_select(None, False, REPO, "main", {})


@pytest.mark.parametrize("path, store", [("/var/tmp/models/m", "/var/tmp/models/m.commits"),
                                         ("/var/tmp/models/m/", "/var/tmp/models/m.commits")])
def test_store_dir(path, store):
    assert cs.store_dir(path) == store


@pytest.mark.parametrize("path", ["/", "models/m", ""])
def test_store_dir_refuses(path):
    with pytest.raises(cs.StoreError, match="absolute folder"):
        cs.store_dir(path)


def release(rid, commit, digest, good=True):
    return {"id": rid, "known_good": good, "model": {"repo": REPO, "commit": commit},
            "image": {"digest": digest, "image_id": "sha256:id-" + digest[-1]}}


def image(digest, size=100):
    return {"Id": "sha256:id-" + digest[-1], "RepoDigests": [f"reg/img@{digest}"], "Size": size}


D1, D2, D3 = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
HISTORY = {"serving": "r3", "releases": [release("r1", A, D1), release("r2", B, D2), release("r3", C, D3)]}


def test_plan_prune_keeps_the_last_n_and_lists_what_it_frees():
    plan = cs.plan_prune(HISTORY, 2, {A: 1000, B: 2000}, [image(D1, 300), image(D2), image(D3)])
    assert plan["checkpoints"] == [{"commit": A, "bytes": 1000}]
    assert plan["images"] == [{"id": "sha256:id-1", "digests": [D1], "bytes": 300}]
    assert plan["bytes"] == 1300 and plan["kept"] == ["r2", "r3"]
    assert "1300 bytes freed" in plan["message"]


def test_plan_prune_with_one_kept_still_keeps_the_serving_known_good():
    plan = cs.plan_prune(HISTORY, 1, {A: 1, B: 2}, [image(D1), image(D2), image(D3)])
    assert [item["commit"] for item in plan["checkpoints"]] == [A, B]
    assert [item["id"] for item in plan["images"]] == ["sha256:id-1", "sha256:id-2"]
    assert plan["kept"] == ["r3"]


def test_plan_prune_keeps_the_last_known_good_beyond_n():
    history = {"serving": "r3", "releases": [release("r1", A, D1), release("r2", B, D2, good=False),
                                             release("r3", C, D3)]}
    history["releases"][2]["known_good"] = True
    plan = cs.plan_prune(history, 1, {A: 1, B: 2}, [])
    assert plan["kept"] == ["r3"] and [item["commit"] for item in plan["checkpoints"]] == [A, B]


def test_plan_prune_nothing_unless_the_serving_release_is_the_known_good():
    history = {"serving": "r3", "releases": [release("r1", A, D1), release("r2", B, D2),
                                             release("r3", C, D3, good=False)]}
    plan = cs.plan_prune(history, 1, {A: 1, B: 2}, [image(D1)])
    assert plan["checkpoints"] == [] and plan["images"] == [] and "not the last known-good" in plan["message"]


def test_plan_prune_never_an_image_no_release_recorded():
    other = {"Id": "sha256:unrelated", "RepoDigests": ["reg/other@sha256:" + "9" * 64], "Size": 5}
    plan = cs.plan_prune(HISTORY, 1, {}, [other, image(D1)])
    assert [item["id"] for item in plan["images"]] == ["sha256:id-1"]


def test_plan_prune_an_image_shared_with_a_kept_release_stays():
    history = {"serving": "r3", "releases": [release("r1", A, D3), release("r2", B, D2), release("r3", C, D3)]}
    plan = cs.plan_prune(history, 1, {A: 1}, [image(D3), image(D2)])
    assert [item["id"] for item in plan["images"]] == ["sha256:id-2"]
    assert plan["checkpoints"] == [{"commit": A, "bytes": 1}]


@pytest.mark.parametrize("keep", [0, -1, True, "2"])
def test_plan_prune_refuses_a_bad_keep(keep):
    with pytest.raises(cs.StoreError, match="keep at least the serving release"):
        cs.plan_prune(HISTORY, keep, {}, [])
