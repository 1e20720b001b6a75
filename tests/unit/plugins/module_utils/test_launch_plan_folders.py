# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch refuses a start, before anything is stopped, while a node's model or cache folder is not root's alone
(vllm_node_state's trusted_folders read: _safe_paths.folder_problems); a group found serving is left as it is."""
from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _safe_paths as sp
from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import (
    cache_key,
    empty_cache,
    key_parts,
    record,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import Calibration, Plan, plan
from helpers.launch import COMMIT, HEAD, LOG_LINES, WORKER, config, node_state, nodes, renderer

ONE_GIB = 1 << 30


def run(cfg: dict[str, Any], states: dict[str, dict[str, Any]], cache: dict[str, Any]) -> Plan:
    """The launch's first plan call (as test_launch_plan makes it)."""
    return plan(cfg, states, renderer(cfg, states), cache, Calibration(record_path="/srv/kv.json"), None, None, None,
                LOG_LINES, "2026-12-02T10:00:00Z")


def recorded(cfg: dict[str, Any], states: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, Any]:
    """A KV record for the lab's render, so that the plan starts rather than calibrates."""
    specs = renderer(cfg, states)(dict(cfg["settings"]))
    parts = key_parts(specs[HEAD]["container"]["command"], "/var/tmp/models/tiny-glm53", COMMIT,
                      [states[HEAD]["identity"], states[WORKER]["identity"]])
    return record(empty_cache(), cache_key(parts), parts, values, "2026-12-01T08:00:00Z")


PLANTED = ("refusing the cache folder (HF_HOME of the root serve container) /var/tmp/cache (dgxspark_vllm_cache_path): "
           "/var/tmp/cache belongs to 4321 (uid 4321), not root: its owner can replace what root downloads and serves "
           "below it. Fix: remove it (sudo rm -rf -- /var/tmp/cache: anyone may have made it there; staging makes the "
           "missing levels again, root's, mode 0755), or set dgxspark_vllm_cache_path to a folder whose every level "
           "is root's and not writable by others; then run again")
DIR = stat.S_IFDIR
TREE = {"/": (DIR | 0o755, 0), "/var": (DIR | 0o755, 0), "/var/tmp": (DIR | 0o1777, 0),
        "/var/tmp/models": (DIR | 0o755, 0), "/var/tmp/models/tiny-glm53": (DIR | 0o755, 0)}


def lstat_of(tree):
    def lstat(path: str) -> os.stat_result:
        if path not in tree:
            raise FileNotFoundError(path)
        mode, uid = tree[path]
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))
    return lstat


FOLDERS = {"dgxspark_vllm_model_path": "/var/tmp/models/tiny-glm53", "dgxspark_vllm_cache_path": "/var/tmp/cache"}


def test_folder_problems_names_each_unsafe_folder_and_accepts_missing_levels() -> None:
    assert sp.folder_problems(FOLDERS, {0}, lstat_of(TREE)) == []          # the cache folder is missing: Docker makes it
    planted = {**TREE, "/var/tmp/cache": (DIR | 0o755, 4321)}
    assert sp.folder_problems(FOLDERS, {0}, lstat_of(planted)) == [PLANTED]
    assert sp.folder_problems({"dgxspark_vllm_cache_path": ""}, {0}, lstat_of(planted)) == []


@pytest.mark.parametrize("unsafe", [[WORKER], [HEAD, WORKER]])
def test_a_start_with_an_unsafe_folder_is_refused_before_anything_is_stopped(unsafe: list[str]) -> None:
    cfg = config()
    cache = recorded(cfg, nodes(), {"kv_cache_memory_bytes": ONE_GIB})
    states = {name: node_state(name, "out-of-date") for name in (HEAD, WORKER)}
    for name in unsafe:
        states[name]["folders"] = [PLANTED]
    result = run(cfg, states, cache)
    assert (result.step, result.stop_first, result.any_exists) == ("fail", False, True)
    assert result.message == ("The launch cannot start: a folder the serve container (root) mounts is not root's alone - "
                              + " | ".join(f"{name}: {PLANTED}" for name in unsafe)
                              + ". Nothing was started or stopped.")
    for name in unsafe:
        states[name]["folders"] = []
    assert run(cfg, states, cache).step == "start"


def test_a_group_found_serving_with_an_unsafe_folder_is_left_serving() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    specs = run(cfg, states, cache).specs
    serving = {name: node_state(name, specs[name]["config_hash"]) for name in (HEAD, WORKER)}
    serving[WORKER]["folders"] = [PLANTED]
    assert run(cfg, serving, cache).step == "nothing"
