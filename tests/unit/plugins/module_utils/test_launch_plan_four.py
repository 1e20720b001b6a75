# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch planner for four Sparks (TP=4: one head, three workers), from recorded node states."""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import flag_values
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import Calibration, plan
from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import describe, identity
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import profile_from_data, render_cluster
from helpers.launch import config

NAMES = ("spark-a", "spark-b", "spark-c", "spark-d")
IPS = dict(zip(NAMES, ("10.77.1.11", "10.77.1.12", "10.77.1.13", "10.77.1.14")))
MB = 128 * 1024


def _state(name: str, config_hash: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"container": {"exists": config_hash is not None, "running": config_hash is not None,
                                           "config_hash": config_hash},
                             "image_id": "sha256:abc", "gpu": None, "mem_total_mb": MB, "staging_lock": False,
                             "firewall": {"present": True, "why": ""},
                             "stamp": {"commit": "0123"} if name == NAMES[0] else None}
    inventory = {"cx7_iface": f"enp1s0f{NAMES.index(name)}np1", "ib_hca": "rocep1s0f1", "gid_index": 3}
    state["node"] = describe(name, IPS[name], name == NAMES[0], inventory["cx7_iface"], inventory, {}, None)
    state["identity"] = identity(name, state)
    return state


def _setup() -> tuple[dict[str, Any], Any]:
    cfg = dict(config(tensor_parallel_size=4), head=NAMES[0], workers=list(NAMES[1:]), head_cx7_ip=IPS[NAMES[0]])
    profile = profile_from_data(cfg["profile"])

    def render_for(states: dict[str, Any]) -> Any:
        nodes = [dict(states[name]["node"]) for name in NAMES]
        return lambda settings: {n: s.as_result() for n, s in render_cluster(profile, nodes, settings).items()}
    return cfg, render_for


def test_four_ranks_start_in_inventory_order_with_the_head_at_rank_zero():
    cfg, render_for = _setup()
    states = {name: _state(name) for name in NAMES}
    result = plan(cfg, states, render_for(states), {"format": 1, "entries": {}}, Calibration(record_path="kv.json"))
    assert result.step == "calibrate"
    assert [result.specs[name]["rank"] for name in NAMES] == [0, 1, 2, 3]
    assert [result.specs[name]["role"] for name in NAMES] == ["head", "worker", "worker", "worker"]
    for name in NAMES:
        flags = flag_values(result.specs[name]["container"]["command"])
        assert (flags["--tensor-parallel-size"], flags["--nnodes"], flags["--node-rank"]) == (
            "4", "4", str(NAMES.index(name)))
        assert flags["--master-addr"] == IPS[NAMES[0]]
        assert ("--headless" in result.specs[name]["container"]["command"]) is (name != NAMES[0])
        assert result.specs[name]["container"]["env"]["NCCL_SOCKET_IFNAME"] == f"enp1s0f{NAMES.index(name)}np1"
    # every node is part of the calibration key, in rank order
    assert [n["name"] for n in result.state["kv"]["parts"]["nodes"]] == list(NAMES)


def test_one_of_four_ranks_out_of_date_restarts_the_whole_group():
    cfg, render_for = _setup()
    fresh = {name: _state(name) for name in NAMES}
    cache = {"format": 1, "entries": {}}
    first = plan(cfg, fresh, render_for(fresh), cache, Calibration(enabled=False))
    hashes = {name: first.specs[name]["config_hash"] for name in NAMES}
    serving = {name: _state(name, hashes[name]) for name in NAMES}
    assert plan(cfg, serving, render_for(serving), cache, Calibration(enabled=False)).step == "nothing"
    serving["spark-c"] = _state("spark-c", "stale")
    again = plan(cfg, serving, render_for(serving), cache, Calibration(enabled=False))
    assert (again.step, again.any_exists) == ("start", True)
