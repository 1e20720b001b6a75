# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.checkpoint_store on real folders: serve a parked commit, list, prune, and every refusal."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import checkpoint_store
from helpers.module_runner import ModuleFail, run_module

A, B = "a" * 40, "b" * 40
REPO = "org/model"


def tree(path, commit, repo=REPO, size=10):
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x" * size)
    (path / ".dgxspark-stamp.json").write_text(json.dumps({"repo": repo, "commit": commit}))


def commit_of(path):
    return json.loads((path / ".dgxspark-stamp.json").read_text())["commit"]


@pytest.fixture(name="models")
def fixture_models(tmp_path):
    path = tmp_path / "models" / "m"
    tree(path, B)
    tree(tmp_path / "models" / "m.commits" / A, A, size=100)
    return path


def test_info_lists_the_selected_and_the_parked(models):
    out = run_module(checkpoint_store.main, {"path": str(models)})
    assert not out["changed"] and out["selected"] == {"repo": REPO, "commit": B}
    assert out["parked"] == {A: {"repo": REPO, "bytes": 100 + len(json.dumps({"repo": REPO, "commit": A})),
                                 "path": str(models) + ".commits/" + A}}


def test_select_a_parked_commit_swaps_the_trees(models):
    checked = run_module(checkpoint_store.main, {"path": str(models), "operation": "select", "repo": REPO,
                                                 "commit": A}, check_mode=True)
    assert checked["changed"] and commit_of(models) == B
    out = run_module(checkpoint_store.main, {"path": str(models), "operation": "select", "repo": REPO, "commit": A})
    assert out["changed"] and out["moved"]["park"] == B and out["moved"]["unpark"] == A
    assert commit_of(models) == A and list(out["parked"]) == [B]
    again = run_module(checkpoint_store.main, {"path": str(models), "operation": "select", "repo": REPO, "commit": A})
    assert not again["changed"]


def test_select_a_commit_not_staged_is_refused_and_nothing_moves(models):
    with pytest.raises(ModuleFail, match="is neither the tree at .* nor parked in .*m.commits: stage it"):
        run_module(checkpoint_store.main, {"path": str(models), "operation": "select", "repo": REPO, "commit": "c" * 40})
    assert commit_of(models) == B and os.listdir(str(models) + ".commits") == [A]


def test_prune_removes_parked_trees_only_and_lists_what_it_frees(models):
    checked = run_module(checkpoint_store.main, {"path": str(models), "operation": "prune", "commits": [A, B]},
                         check_mode=True)
    assert checked["changed"] and [item["commit"] for item in checked["removed"]] == [A]
    assert os.path.isdir(str(models) + ".commits/" + A)
    out = run_module(checkpoint_store.main, {"path": str(models), "operation": "prune", "commits": [A, B]})
    assert [item["commit"] for item in out["removed"]] == [A] and out["freed_bytes"] > 100
    assert out["parked"] == {} and commit_of(models) == B   # the selected tree is never removed
    assert not run_module(checkpoint_store.main, {"path": str(models), "operation": "prune", "commits": [A]})["changed"]


def test_a_parent_open_to_others_is_refused_before_anything_moves(models):
    os.chmod(models.parent, 0o777)
    with pytest.raises(ModuleFail, match="refusing the model folder's parent"):
        run_module(checkpoint_store.main, {"path": str(models), "operation": "select", "repo": REPO, "commit": A})
    assert commit_of(models) == B
