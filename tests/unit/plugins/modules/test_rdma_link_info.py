# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the dgxspark.vllm.rdma_link_info module, run in-process over the recorded sysfs trees."""
from __future__ import annotations

import os
from typing import Any

import pytest

from helpers.module_runner import ModuleFail, run_module

from ansible_collections.dgxspark.vllm.plugins.modules.rdma_link_info import main

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "sysfs")
TWINS = "rocep1s0f1,roceP2p1s0f1"

# case, cx7_ip, gid_index, ib_hca, socket_ifname, mtu, speed_mbps, problem checks, ok
CASES = [
    ("cx7_twin_v2_at_3", "192.168.177.11", 3, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("v2_at_5", "192.168.177.11", 5, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("port_down", "192.168.177.11", 3, "rocep1s0f1", "enp1s0f1np1", 9000, None,
     ["port_state", "phys_state", "netdev_state", "speed", "twin_down"], False),
    ("no_ipv4_gid", "192.168.177.11", None, "", None, None, None, ["gid_ipv4"], False),
    ("ipv6_only", "192.168.177.11", None, "", None, None, None, ["ipv6_only"], False),
    ("lab_head", "10.77.1.11", 3, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("lab_worker", "10.77.1.12", 4, TWINS, "enP2p1s0f1np1", 9000, 200000, [], True),
]


def args(case: str, ip: str, **extra: Any) -> dict[str, Any]:
    return dict({"sysfs_root": os.path.join(FIXTURES, case), "cx7_ip": ip}, **extra)


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("case, ip, gid_index, ib_hca, ifname, mtu, speed, problems, ok", CASES,
                         ids=[c[0] for c in CASES])
def test_module_over_fixtures(case: str, ip: str, gid_index: int | None, ib_hca: str, ifname: str | None,
                              mtu: int | None, speed: int | None, problems: list[str], ok: bool,
                              check_mode: bool) -> None:
    result = run_module(main, args(case, ip), check_mode=check_mode)
    assert result["changed"] is False
    assert result["gid_index"] == gid_index
    assert result["ib_hca"] == ib_hca
    assert result["ib_hcas"] == (ib_hca.split(",") if ib_hca else [])
    assert result["socket_ifname"] == ifname
    assert (result["mtu"], result["speed_mbps"]) == (mtu, speed)
    assert [p["check"] for p in result["problems"]] == problems
    assert all(set(p) == {"check", "severity", "message", "fix"} for p in result["problems"])
    assert result["ok"] is ok
    assert len(result["hcas"]) == 4
    assert "failed" not in result


def test_cx7_iface_mismatch_is_a_problem() -> None:
    result = run_module(main, args("lab_worker", "10.77.1.12", cx7_iface="enp1s0f1np1"))
    assert [p["check"] for p in result["problems"]] == ["cx7_iface"]
    assert result["ok"] is False
    assert result["socket_ifname"] == "enP2p1s0f1np1"
    assert "enP2p1s0f1np1" in result["problems"][0]["fix"]


def test_cx7_iface_match() -> None:
    result = run_module(main, args("lab_head", "10.77.1.11", cx7_iface="enp1s0f1np1"))
    assert (result["problems"], result["ok"]) == ([], True)


@pytest.mark.parametrize("ip", ["10.77.1.300", "fe80::1", "10.77.1.11/24", "spark-head"])
def test_invalid_cx7_ip_fails(ip: str) -> None:
    with pytest.raises(ModuleFail) as failed:
        run_module(main, args("lab_head", ip))
    assert "not an IPv4 address" in failed.value.result["msg"]


def test_missing_sysfs_root_fails(tmp_path: Any) -> None:
    with pytest.raises(ModuleFail) as failed:
        run_module(main, {"sysfs_root": str(tmp_path / "missing"), "cx7_ip": "10.77.1.11"}, check_mode=True)
    assert "does not exist" in failed.value.result["msg"]


def test_cx7_ip_is_required() -> None:
    with pytest.raises(ModuleFail) as failed:
        run_module(main, {"sysfs_root": os.path.join(FIXTURES, "lab_head")})
    assert "cx7_ip" in failed.value.result["msg"]
