# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch runs the digest staging resolved (repo@sha256:...) on every rank, found in each node's record and local
image, also when it runs alone; nodes with different builds are refused (plugins/module_utils/_launch_plan.py)."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import Calibration, PlanError, plan
from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import image_record
from helpers.launch import HEAD, ORDER, WORKER, config, node_state, renderer

IMAGE = "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0"
REPO = "ghcr.io/dgxspark-lab/vllm-openai-cpu"
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def _node(name: str, digests: list[str], record: str | None = None, image_id: str | None = None) -> dict[str, Any]:
    state = node_state(name, image_id=image_id) if image_id else node_state(name)
    state["image_repo_digests"] = digests
    state["image_record"] = (image_record(IMAGE, {"reference": f"{REPO}@{record}", "digest": record, "source": "head"})
                             if record else None)
    return state


def _plan(states: dict[str, dict[str, Any]]):
    cfg = config()
    cfg["image"] = IMAGE
    return plan(cfg, states, renderer(cfg, states), {}, Calibration(enabled=False))


def test_every_rank_runs_the_recorded_digest() -> None:
    states = {name: _node(name, [f"{REPO}@{D1}"], record=D1) for name in ORDER}
    result = _plan(states)
    assert result.step == "start"
    for name in ORDER:
        assert result.specs[name]["container"]["image"] == f"{REPO}@{D1}"
        assert f" {REPO}@{D1} " in result.specs[name]["command_line"]
    assert result.as_result()["image"]["digest"] == D1


def test_a_moved_tag_changes_the_render_so_the_group_is_restarted_on_the_new_build() -> None:
    first = _plan({name: _node(name, [f"{REPO}@{D1}"]) for name in ORDER})
    second = _plan({name: _node(name, [f"{REPO}@{D2}"]) for name in ORDER})
    assert first.specs[HEAD]["config_hash"] != second.specs[HEAD]["config_hash"]


def test_nodes_on_different_builds_are_refused_with_the_fix() -> None:
    states = {HEAD: _node(HEAD, [f"{REPO}@{D1}"]), WORKER: _node(WORKER, [f"{REPO}@{D2}"], image_id="sha256:other")}
    with pytest.raises(PlanError, match=r"different builds .*--tags image"):
        _plan(states)


def test_without_repo_digests_the_tag_runs_as_before() -> None:
    result = _plan({name: _node(name, []) for name in ORDER})
    assert result.specs[HEAD]["container"]["image"] == IMAGE
