# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for plugins/module_utils/_rdma.py over the recorded sysfs trees in tests/fixtures/sysfs/."""
from __future__ import annotations

import filecmp
import importlib.util
import ipaddress
import os
import sys
from dataclasses import replace
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._rdma import (
    ERROR,
    WARNING,
    RdmaError,
    decide,
    parse_cx7_ip,
    parse_gid,
    parse_rate_gbps,
    parse_speed_mbps,
    parse_state,
    read_sysfs,
    resolve_link,
    twin_key,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "sysfs")


def _load_generator() -> Any:
    name = "dgxspark_vllm_fixtures_make_trees"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(FIXTURES, "make_trees.py"))
    if spec is None or spec.loader is None:
        raise ImportError("cannot load make_trees.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


GEN = _load_generator()
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]
TWINS_PORT0 = ["rocep1s0f0", "roceP2p1s0f0"]   # the four-node lab's node3 and node4: the cable in port 0

# case, cx7_ip, gid_index, ib_hcas, socket_ifname, mtu, speed_mbps, problems as (check, severity), ok
EXPECTED = [
    ("cx7_twin_v2_at_3", "192.168.177.11", 3, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("v2_at_5", "192.168.177.11", 5, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("port_down", "192.168.177.11", 3, ["rocep1s0f1"], "enp1s0f1np1", 9000, None,
     [("port_state", ERROR), ("phys_state", ERROR), ("netdev_state", ERROR), ("speed", WARNING),
      ("twin_down", WARNING)], False),
    ("no_ipv4_gid", "192.168.177.11", None, [], None, None, None, [("gid_ipv4", ERROR)], False),
    ("ipv6_only", "192.168.177.11", None, [], None, None, None, [("ipv6_only", ERROR)], False),
    ("lab_head", "10.77.1.11", 3, TWINS, "enp1s0f1np1", 9000, 200000, [], True),
    ("lab_worker", "10.77.1.12", 4, TWINS, "enP2p1s0f1np1", 9000, 200000, [], True),
    ("lab_node3", "10.77.1.13", 3, TWINS_PORT0, "enp1s0f0np0", 9000, 200000, [], True),
    ("lab_node4", "10.77.1.14", 5, TWINS_PORT0, "enP2p1s0f0np0", 9000, 200000, [], True),
]


def tree(case: str) -> str:
    return os.path.join(FIXTURES, case)


def checks(info: Any) -> list[tuple[str, str]]:
    return [(p.check, p.severity) for p in info.problems]


def build(tmp_path: Any, base: str = "cx7_twin_v2_at_3", **changes: dict[str, Any]) -> str:
    """Write a variant of a generator case: changes maps an HCA name to Function field overrides."""
    source = GEN.CASES[base]
    functions = tuple(replace(f, **changes.get(f.hca, {})) for f in source.functions)
    root = str(tmp_path / "sysfs")
    GEN.write_tree(root, replace(source, functions=functions))
    return root


@pytest.mark.parametrize("case, ip, gid_index, ib_hcas, ifname, mtu, speed, problems, ok", EXPECTED,
                         ids=[e[0] for e in EXPECTED])
def test_fixture_trees(case: str, ip: str, gid_index: int | None, ib_hcas: list[str], ifname: str | None,
                       mtu: int | None, speed: int | None, problems: list[tuple[str, str]], ok: bool) -> None:
    info = resolve_link(ip, sysfs_root=tree(case))
    assert info.gid_index == gid_index
    assert list(info.ib_hcas) == ib_hcas
    assert info.ib_hca == ",".join(ib_hcas)
    assert info.socket_ifname == ifname
    assert info.mtu == mtu
    assert info.speed_mbps == speed
    assert checks(info) == problems
    assert info.ok is ok
    for problem in info.problems:
        assert problem.message and problem.fix


def test_every_case_is_covered() -> None:
    assert sorted(GEN.CASES) == sorted(e[0] for e in EXPECTED)


def test_committed_trees_match_generator(tmp_path: Any) -> None:
    """The committed trees are exactly what make_trees.py writes (re-run it after editing CASES)."""
    GEN.write_all(str(tmp_path))
    for case in GEN.CASES:
        fresh, committed = str(tmp_path / case), tree(case)
        fresh_files = sorted(os.path.relpath(os.path.join(d, f), fresh)
                             for d, _dirs, files in os.walk(fresh) for f in files)
        committed_files = sorted(os.path.relpath(os.path.join(d, f), committed)
                                 for d, _dirs, files in os.walk(committed) for f in files)
        assert committed_files == fresh_files, case
        _match, mismatch, errors = filecmp.cmpfiles(fresh, committed, fresh_files, shallow=False)
        assert (mismatch, errors) == ([], []), case


def test_fixture_values_end_with_newline() -> None:
    for case in GEN.CASES:
        for directory, _dirs, files in os.walk(tree(case)):
            for name in files:
                with open(os.path.join(directory, name), "rb") as handle:
                    assert handle.read().endswith(b"\n"), os.path.join(directory, name)


def test_v2_at_5_table_shows_v1_at_3() -> None:
    hcas, _netdevs = read_sysfs(tree("v2_at_5"))
    port = {h.name: h for h in hcas}["rocep1s0f1"].ports[0]
    entries = {g.index: g for g in port.gids}
    assert (entries[3].ipv4, entries[3].gid_type) == ("192.168.177.11", "IB/RoCE v1")
    assert (entries[5].ipv4, entries[5].gid_type) == ("192.168.177.11", "RoCE v2")
    assert entries[3].gid == "0000:0000:0000:0000:0000:ffff:c0a8:b10b"
    assert entries[0].gid.startswith("fe80:0000:0000:0000:") and entries[0].ipv4 is None
    assert [g.index for g in port.roce_v2_ipv4("192.168.177.11")] == [5]


def test_read_sysfs_records() -> None:
    hcas, netdevs = read_sysfs(tree("lab_head"))
    assert [h.name for h in hcas] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    head = hcas[1]
    assert (head.pci_address, head.fw_ver, head.board_id, head.hca_type) == (
        "0000:01:00.1", "28.45.1200", "NVD0000000087", "MT4129")
    assert head.node_guid == "946d:ae03:004a:0b61"
    port = head.ports[0]
    assert (port.number, port.state, port.phys_state, port.link_layer) == (1, "ACTIVE", "LinkUp", "Ethernet")
    assert (port.rate, port.rate_gbps, port.netdev) == ("200 Gb/sec (2X NDR)", 200.0, "enp1s0f1np1")
    # all-zero entries are left out of the table
    assert [g.index for g in port.gids] == [0, 1, 2, 3]
    unused = hcas[0].ports[0]
    assert (unused.state, unused.phys_state, unused.gids, unused.netdev) == ("DOWN", "Disabled", (), "enp1s0f0np0")
    by_name = {n.name: n for n in netdevs}
    assert "enP7s7" not in by_name
    assert (by_name["enp1s0f0np0"].operstate, by_name["enp1s0f0np0"].speed_mbps) == ("down", None)
    assert by_name["enP2p1s0f1np1"].address == "94:6d:ae:4a:0b:63"


def test_to_dict_shape() -> None:
    result = resolve_link("10.77.1.12", sysfs_root=tree("lab_worker")).to_dict()
    assert set(result) == {"hcas", "netdevs", "hca", "port", "gid_index", "ib_hca", "ib_hcas", "socket_ifname",
                           "mtu", "speed_mbps", "problems", "ok"}
    assert (result["hca"], result["port"], result["gid_index"]) == ("roceP2p1s0f1", 1, 4)
    worker = [h for h in result["hcas"] if h["name"] == "roceP2p1s0f1"][0]
    gid4 = [g for g in worker["ports"][0]["gids"] if g["index"] == 4][0]
    assert gid4 == {"index": 4, "gid": "0000:0000:0000:0000:0000:ffff:0a4d:010c", "type": "RoCE v2",
                    "ndev": "enP2p1s0f1np1", "ipv4": "10.77.1.12"}
    assert result["netdevs"]["enP2p1s0f1np1"] == {"name": "enP2p1s0f1np1", "operstate": "up", "mtu": 9000,
                                                  "speed_mbps": 200000, "address": "94:6d:ae:4a:1c:63"}


def test_head_and_worker_differ() -> None:
    """The peers' trap: one pinned index cannot serve both lab nodes."""
    head = resolve_link("10.77.1.11", sysfs_root=tree("lab_head"))
    worker = resolve_link("10.77.1.12", sysfs_root=tree("lab_worker"))
    assert (head.gid_index, worker.gid_index) == (3, 4)
    assert (head.socket_ifname, worker.socket_ifname) == ("enp1s0f1np1", "enP2p1s0f1np1")


def test_wrong_node_address_is_not_found() -> None:
    info = resolve_link("10.77.1.12", sysfs_root=tree("lab_head"))
    assert checks(info) == [("gid_ipv4", ERROR)]
    assert "10.77.1.11 on enp1s0f1np1" in info.problems[0].message


# --- variants built with the generator ----------------------------------------------------------------------

def test_no_hca(tmp_path: Any) -> None:
    root = str(tmp_path / "sysfs")
    GEN.write_tree(root, replace(GEN.CASES["lab_head"], functions=()))
    info = resolve_link("10.77.1.11", sysfs_root=root)
    assert checks(info) == [("no_hca", ERROR)]
    assert (info.hcas, info.gid_index, info.ib_hcas, info.ok) == ((), None, (), False)


def test_roce_v1_only(tmp_path: Any) -> None:
    root = build(tmp_path, rocep1s0f1={"gids": (GEN.Gid("192.168.177.11", "v1"),)})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("gid_roce_v2", ERROR)]
    assert "index 2 (IB/RoCE v1)" in info.problems[0].message
    assert info.gid_index is None


def test_low_mtu_and_speed_are_warnings(tmp_path: Any) -> None:
    root = build(tmp_path, rocep1s0f1={"mtu": 1500, "speed": "100000"}, roceP2p1s0f1={"mtu": 1500})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("mtu", WARNING), ("speed", WARNING), ("mtu", WARNING)]
    assert "enP2p1s0f1np1" in info.problems[2].message
    assert (info.mtu, info.speed_mbps, info.ok, list(info.ib_hcas)) == (1500, 100000, True, TWINS)


def test_twin_without_ipv4_is_left_out(tmp_path: Any) -> None:
    root = build(tmp_path, roceP2p1s0f1={"gids": ()})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("twin_gid_index", WARNING)]
    assert "no RoCE v2 IPv4 GID" in info.problems[0].message
    assert (list(info.ib_hcas), info.ok) == (["rocep1s0f1"], True)


def test_twin_at_other_index_is_left_out(tmp_path: Any) -> None:
    twin_at_5 = [f for f in GEN.CASES["v2_at_5"].functions if f.hca == "roceP2p1s0f1"][0]
    root = build(tmp_path, roceP2p1s0f1={"gids": twin_at_5.gids})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("twin_gid_index", WARNING)]
    assert "NCCL_IB_GID_INDEX=3" in info.problems[0].message and "at index 5" in info.problems[0].message
    assert list(info.ib_hcas) == ["rocep1s0f1"]


def test_twin_netdev_down(tmp_path: Any) -> None:
    root = build(tmp_path, roceP2p1s0f1={"operstate": "down", "speed": None})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("twin_down", WARNING)]
    assert "enP2p1s0f1np1 operstate down" in info.problems[0].message
    assert list(info.ib_hcas) == ["rocep1s0f1"]


def test_infiniband_link_layer(tmp_path: Any) -> None:
    root = build(tmp_path, rocep1s0f1={"link_layer": "InfiniBand"})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("link_layer", ERROR)]
    assert "LINK_TYPE_P1=2" in info.problems[0].fix and "0000:01:00.1" in info.problems[0].fix


def test_same_ip_on_both_twins(tmp_path: Any) -> None:
    root = build(tmp_path, roceP2p1s0f1={"gids": GEN.pair("192.168.177.11")})
    info = resolve_link("192.168.177.11", sysfs_root=root)
    assert checks(info) == [("ip_ambiguous", WARNING)]
    assert (info.hca, info.socket_ifname) == ("rocep1s0f1", "enp1s0f1np1")


def test_twins_found_by_pci_address_with_kernel_names(tmp_path: Any) -> None:
    """The rule does not depend on rdma-core's PCI names: mlx5_N devices pair through device/uevent."""
    root = build(tmp_path, base="lab_worker",
                 rocep1s0f0={"hca": "mlx5_0"}, rocep1s0f1={"hca": "mlx5_1"},
                 roceP2p1s0f0={"hca": "mlx5_2"}, roceP2p1s0f1={"hca": "mlx5_3"})
    info = resolve_link("10.77.1.12", sysfs_root=root)
    assert (info.hca, list(info.ib_hcas), info.gid_index, checks(info)) == ("mlx5_3", ["mlx5_1", "mlx5_3"], 4, [])


@pytest.mark.parametrize("iface, expected", [
    ("enP2p1s0f1np1", []),
    ("enp1s0f1np1", [("cx7_iface", ERROR)]),
    ("enP7s7", [("cx7_iface", ERROR)]),
])
def test_cx7_iface(iface: str, expected: list[tuple[str, str]]) -> None:
    info = resolve_link("10.77.1.12", cx7_iface=iface, sysfs_root=tree("lab_worker"))
    assert checks(info) == expected
    assert info.socket_ifname == "enP2p1s0f1np1"


def test_cx7_iface_is_read_even_without_rdma() -> None:
    info = resolve_link("10.77.1.12", cx7_iface="enP7s7", sysfs_root=tree("lab_worker"))
    assert {n.name: n.speed_mbps for n in info.netdevs}["enP7s7"] == 10000


def test_decide_is_pure() -> None:
    hcas, netdevs = read_sysfs(tree("cx7_twin_v2_at_3"))
    first = decide(hcas, netdevs, ipaddress.IPv4Address("192.168.177.11"))
    second = decide(hcas, netdevs, ipaddress.IPv4Address("192.168.177.11"), "enp1s0f1np1")
    assert first == second


# --- errors -------------------------------------------------------------------------------------------------

def test_missing_sysfs_root(tmp_path: Any) -> None:
    with pytest.raises(RdmaError, match="does not exist"):
        resolve_link("10.77.1.11", sysfs_root=str(tmp_path / "nope"))


def test_sysfs_root_that_is_not_sysfs() -> None:
    with pytest.raises(RdmaError, match="no class/net"):
        resolve_link("10.77.1.11", sysfs_root=os.path.join(tree("lab_head"), "class"))


@pytest.mark.parametrize("text", ["10.77.1.300", "fe80::1", "10.77.1.11/24", "", "spark-head"])
def test_invalid_cx7_ip(text: str) -> None:
    with pytest.raises(RdmaError, match="not an IPv4 address"):
        parse_cx7_ip(text)


# --- parsers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("4: ACTIVE", (4, "ACTIVE")),
    ("1: DOWN", (1, "DOWN")),
    ("5: LinkUp", (5, "LinkUp")),
    ("7: Phy Test", (7, "Phy Test")),
    ("garbage", (None, "garbage")),
    (None, (None, None)),
])
def test_parse_state(text: str | None, expected: tuple[int | None, str | None]) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("200 Gb/sec (2X NDR)", 200.0),
    ("2.5 Gb/sec (1X SDR)", 2.5),
    ("100 Gb/sec (4X EDR)", 100.0),
    ("400 Gb/s", 400.0),
    ("unknown", None),
    (None, None),
])
def test_parse_rate_gbps(text: str | None, expected: float | None) -> None:
    assert parse_rate_gbps(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("200000", 200000), ("-1", None), ("4294967295", None), ("0", None), ("", None), (None, None),
])
def test_parse_speed_mbps(text: str | None, expected: int | None) -> None:
    assert parse_speed_mbps(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("0000:0000:0000:0000:0000:ffff:0a4d:010b", "::ffff:a4d:10b"),
    ("fe80:0000:0000:0000:966d:aeff:fe4a:0b61", "fe80::966d:aeff:fe4a:b61"),
    ("0000:0000:0000:0000:0000:0000:0000:0000", None),
    ("not a gid", None),
    (None, None),
])
def test_parse_gid(text: str | None, expected: str | None) -> None:
    gid = parse_gid(text)
    assert (str(gid) if gid else None) == expected


@pytest.mark.parametrize("pci, name, expected", [
    ("0000:01:00.1", "rocep1s0f1", "01:00.1"),
    ("0002:01:00.1", "roceP2p1s0f1", "01:00.1"),
    ("0002:01:00.0", "whatever", "01:00.0"),
    (None, "rocep1s0f1", "rocep1s0f1"),
    (None, "roceP2p1s0f1", "rocep1s0f1"),
    (None, "mlx5_0", None),
])
def test_twin_key(pci: str | None, name: str, expected: str | None) -> None:
    assert twin_key(pci, name) == expected
