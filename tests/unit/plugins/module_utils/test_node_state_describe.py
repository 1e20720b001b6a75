# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node as the render and the KV key take it (_node_state.describe, identity, wants_rdma, chosen_iface): each
RDMA fact from the inventory, else from a preflight in this run, else from the sysfs read."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import (
    chosen_iface,
    describe,
    identity,
    read_state,
    wants_rdma,
)

IP = "192.168.100.11"
# dgxspark_vllm_config.nodes[host] with nothing set (the config step writes "" for names, None for the GID index)
UNSET: dict[str, Any] = {"cx7_ip": IP, "head": True, "rank": 0, "cx7_iface": "", "ib_hca": "", "gid_index": None}
NOTHING_DETECTED: dict[str, Any] = {"cx7_iface": None, "ib_hca": None, "gid_index": None}
READ = {"ok": True, "hca": "rocep1s0f1", "ib_hca": "rocep1s0f1,roceP2p1s0f1", "gid_index": 3, "problems": []}


def inventory(**given: Any) -> dict[str, Any]:
    return dict(UNSET, **given)


def detected(**given: Any) -> dict[str, Any]:
    return dict(NOTHING_DETECTED, **given)


# ------------------------------------------------------------------------------------------ wants_rdma

@pytest.mark.parametrize("inv, det, wanted", [
    (inventory(), detected(), True),
    (inventory(), {}, True),                                              # no preflight in this run
    (inventory(ib_hca="rocep1s0f1"), detected(), True),                   # the GID index is still unknown
    (inventory(gid_index=3), detected(), True),                           # the HCAs are still unknown
    (inventory(ib_hca="rocep1s0f1", gid_index=3), detected(), False),
    (inventory(ib_hca="rocep1s0f1", gid_index=0), detected(), False),     # GID index 0 is a value
    (inventory(ib_hca="", gid_index=3), detected(), True),                # "" is unset
    (inventory(), detected(ib_hca="rocep1s0f1", gid_index=3), False),     # preflight found them
    (inventory(), detected(gid_index=0), False),
    (inventory(), detected(ib_hca="rocep1s0f1", gid_index=""), True),     # "" is unset
    (inventory(), detected(ib_hca="rocep1s0f1"), True),
])
def test_sysfs_is_read_unless_preflight_or_the_inventory_gave_the_rdma_facts(
        inv: dict[str, Any], det: dict[str, Any], wanted: bool) -> None:
    assert wants_rdma(inv, det) is wanted


# ----------------------------------------------------------------------------------------- chosen_iface

@pytest.mark.parametrize("inv, det, chosen", [
    (inventory(cx7_iface="enp1s0f1np1"), detected(cx7_iface="enP2p1s0f1np1"), "enp1s0f1np1"),
    (inventory(), detected(cx7_iface="enP2p1s0f1np1"), "enP2p1s0f1np1"),
    (inventory(cx7_iface=""), detected(cx7_iface=""), None),     # found by its IP on the node
    (inventory(), {}, None),
    ({}, {}, None),
])
def test_the_interface_comes_from_the_inventory_else_preflight(inv: dict[str, Any], det: dict[str, Any],
                                                               chosen: str | None) -> None:
    assert chosen_iface(inv, det) == chosen


# -------------------------------------------------------------------------------------------- describe

@pytest.mark.parametrize("inv, det, rdma, hca, gid", [
    # inventory > detected > sysfs read
    (inventory(ib_hca="mlx5_0", gid_index=5), detected(ib_hca="mlx5_1", gid_index=4), READ, "mlx5_0", 5),
    (inventory(), detected(ib_hca="mlx5_1", gid_index=4), READ, "mlx5_1", 4),
    (inventory(), detected(), READ, "rocep1s0f1,roceP2p1s0f1", 3),
    # each fact on its own
    (inventory(ib_hca="mlx5_0"), detected(gid_index=4), READ, "mlx5_0", 4),
    (inventory(gid_index=5), detected(), READ, "rocep1s0f1,roceP2p1s0f1", 5),
    # GID index 0 is a given value at every level
    (inventory(gid_index=0), detected(gid_index=4), READ, "rocep1s0f1,roceP2p1s0f1", 0),
    (inventory(), detected(gid_index=0), READ, "rocep1s0f1,roceP2p1s0f1", 0),
    (inventory(), detected(), dict(READ, gid_index=0), "rocep1s0f1,roceP2p1s0f1", 0),
    # empty strings are unset
    (inventory(ib_hca="", gid_index=""), detected(ib_hca="", gid_index=""), READ, "rocep1s0f1,roceP2p1s0f1", 3),
])
def test_each_rdma_fact_from_the_first_source_that_gives_it(inv: dict[str, Any], det: dict[str, Any],
                                                            rdma: dict[str, Any], hca: str, gid: int) -> None:
    node = describe("spark-a", IP, True, "enp1s0f1np1", inv, det, rdma)
    assert node == {"name": "spark-a", "cx7_ip": IP, "head": True, "cx7_iface": "enp1s0f1np1", "ib_hca": hca,
                    "gid_index": gid}


@pytest.mark.parametrize("rdma", [
    None,                                                                 # not read (wants_rdma false, or rdma: false)
    {"ok": False, "msg": "no RDMA device under /sys/class/infiniband"},   # the read failed
    dict(READ, ok=False),                                                 # the read found problems: not trusted
    {"ok": True, "ib_hca": "", "gid_index": None},                        # the read found nothing
])
def test_an_unknown_fact_is_left_out_and_a_failed_read_ignored(rdma: dict[str, Any] | None) -> None:
    node = describe("spark-b", "192.168.100.12", False, None, inventory(head=False), detected(), rdma)
    assert node == {"name": "spark-b", "cx7_ip": "192.168.100.12", "head": False}


def test_a_failed_read_does_not_hide_what_the_inventory_and_preflight_gave() -> None:
    node = describe("spark-b", "192.168.100.12", False, "enp1s0f1np1", inventory(ib_hca="mlx5_0"),
                    detected(gid_index=0), {"ok": False, "msg": "permission denied"})
    assert (node["ib_hca"], node["gid_index"]) == ("mlx5_0", 0)


@pytest.mark.parametrize("iface", [None, ""])
def test_an_unknown_interface_is_left_out(iface: str | None) -> None:
    assert "cx7_iface" not in describe("spark-a", IP, True, iface, inventory(), detected(), READ)


def test_describe_reads_only_the_rdma_facts_of_the_inventory_entry() -> None:
    # the entry also has cx7_ip, head and rank: the arguments give those
    node = describe("spark-b", "192.168.100.12", False, "eth1", inventory(ib_hca="mlx5_0"), {}, None)
    assert node == {"name": "spark-b", "cx7_ip": "192.168.100.12", "head": False, "cx7_iface": "eth1",
                    "ib_hca": "mlx5_0"}


# -------------------------------------------------------------------------------------------- identity

GB10_STATE = {"image_id": "sha256:1111", "gpu": {"gpu_name": "NVIDIA GB10", "driver": "580.95.05",
                                                 "gpu_memory": "[N/A]"}, "mem_total_mb": 122572}


def test_identity_of_a_gb10() -> None:
    assert identity("spark-a", GB10_STATE) == {
        "name": "spark-a", "image_id": "sha256:1111",
        "hardware": {"gpu_name": "NVIDIA GB10", "driver": "580.95.05", "gpu_memory": "[N/A]",
                     "mem_total_bytes": 122572 * 1048576}}


@pytest.mark.parametrize("state, hardware, image_id", [
    # no nvidia-smi (the CPU lab): no GPU facts at all
    ({"image_id": "sha256:1", "gpu": None, "mem_total_mb": 23841},
     {"gpu_name": None, "driver": None, "gpu_memory": None, "mem_total_bytes": 23841 * 1048576}, "sha256:1"),
    # nvidia-smi answered with empty fields: known to be empty, not unknown
    ({"image_id": "sha256:1", "gpu": {"gpu_name": None, "driver": "", "gpu_memory": None}, "mem_total_mb": 1},
     {"gpu_name": "", "driver": "", "gpu_memory": "", "mem_total_bytes": 1048576}, "sha256:1"),
    # the image is not on the node, MemTotal unreadable
    ({"image_id": None, "gpu": None, "mem_total_mb": None},
     {"gpu_name": None, "driver": None, "gpu_memory": None, "mem_total_bytes": None}, ""),
    ({}, {"gpu_name": None, "driver": None, "gpu_memory": None, "mem_total_bytes": None}, ""),
])
def test_identity_of_partial_reads(state: dict[str, Any], hardware: dict[str, Any], image_id: str) -> None:
    assert identity("n", state) == {"name": "n", "image_id": image_id, "hardware": hardware}


def test_identity_from_a_real_read() -> None:
    answers = {"image inspect": (0, "sha256:abcd\n", ""), "nvidia-smi": (0, "NVIDIA GB10, 580.95.05, [N/A]\n", "")}

    def run(argv: Any) -> tuple[int, str, str]:
        return next(answer for key, answer in answers.items() if key in " ".join(argv))

    state = read_state(run, "docker", None, "vllm-node:latest", "nvidia-smi", None, None, None,
                       "MemTotal:       125515532 kB\n")
    assert identity("spark-a", state) == {
        "name": "spark-a", "image_id": "sha256:abcd",
        "hardware": {"gpu_name": "NVIDIA GB10", "driver": "580.95.05", "gpu_memory": "[N/A]",
                     "mem_total_bytes": 125515532 // 1024 * 1048576}}
