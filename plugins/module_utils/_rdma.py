# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read RDMA (RoCE) devices, their GID tables and netdevs from a sysfs tree; pick what NCCL needs.

Private to the dgxspark.vllm collection: this API may change at any time.

Pure logic over a directory (``/sys`` on a node, a recorded tree in tests); no Ansible imports. Two steps:

* ``read_sysfs()`` turns ``class/infiniband/<hca>/...`` and ``class/net/<iface>/...`` into typed records.
* ``decide()`` takes those records and the node's CX7 IPv4 address and answers: which port carries that
  address (through the IPv4-mapped RoCE v2 GID the kernel adds for it), that GID's index
  (NCCL_IB_GID_INDEX), the HCAs for NCCL_IB_HCA, the interface for NCCL_SOCKET_IFNAME, its MTU and speed,
  and the problems found, each with a fix.

Rule for NCCL_IB_HCA (``ib_hcas``): on a DGX Spark each physical CX7 port is wired as two PCIe x4 links and
shows up twice, in PCI domain 0000 and 0002 (``rocep1s0f1`` and ``roceP2p1s0f1``). Two HCAs are twins when
their PCI addresses match except for the domain (``0000:01:00.1`` and ``0002:01:00.1``; the address comes
from ``device/uevent``, else from the HCA's name). ``ib_hcas`` is the HCA whose GID table holds the CX7
address as RoCE v2, plus each twin that is usable with the same NCCL settings: link layer Ethernet, port
ACTIVE and LinkUp, netdev operstate up, and a RoCE v2 IPv4 GID at the same index (NCCL_IB_GID_INDEX is one
value for every listed HCA). A twin that fails one of these is left out and reported as a warning, since
NCCL then runs on one PCIe half, about half the link's bandwidth. The list is in PCI address order, so it
reads the same on every node. Other HCAs are never added: sysfs carries no prefix lengths, so "same subnet"
cannot be decided from it, and on a DGX Spark the twin often has an address of its own subnet or none.
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_SYSFS_ROOT = "/sys"
MIN_MTU = 9000
MIN_SPEED_MBPS = 200000
ROCE_V2 = "RoCE v2"
ROCE_V1 = "IB/RoCE v1"
ERROR = "error"
WARNING = "warning"

_PCI_RE = re.compile(r"^(?P<domain>[0-9a-fA-F]{4,}):(?P<rest>[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$")
# rdma-core's PCI-path names: roce[P<domain>]p<bus>s<slot>[f<function>], the same scheme as the netdev names.
_HCA_NAME_RE = re.compile(r"^(?P<kind>[a-z]+?)(?:P(?P<domain>\d+))?(?P<rest>p\d+s\d+(?:f\d+)?)$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/s(?:ec)?\b")
_STATE_RE = re.compile(r"^\s*(\d+)\s*:\s*(.*?)\s*$")


class RdmaError(Exception):
    """Input that cannot be worked with: no sysfs tree at the root, a CX7 address that is not IPv4."""


# --- small parsers, each over one sysfs value ---------------------------------------------------------------

def parse_cx7_ip(text: str) -> ipaddress.IPv4Address:
    """The CX7 address as IPv4Address; RdmaError for anything else (IPv6, a CIDR, a name)."""
    try:
        return ipaddress.IPv4Address(str(text).strip())
    except ValueError as exc:
        raise RdmaError(
            "cx7_ip %r is not an IPv4 address: give the node's own address on the CX7 link, without a prefix "
            "length (NCCL_IB_ADDR_FAMILY=AF_INET needs the IPv4-mapped RoCE v2 GID of that address)" % (text,)
        ) from exc


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """``4: ACTIVE`` -> (4, "ACTIVE"); ``5: LinkUp`` -> (5, "LinkUp"); unreadable -> (None, None)."""
    if text is None:
        return None, None
    match = _STATE_RE.match(text)
    if not match:
        return None, text.strip() or None
    return int(match.group(1)), match.group(2) or None


def parse_rate_gbps(text: str | None) -> float | None:
    """``200 Gb/sec (2X NDR)`` -> 200.0, ``2.5 Gb/sec (1X SDR)`` -> 2.5; unreadable or other -> None."""
    if text is None:
        return None
    match = _RATE_RE.match(text)
    return float(match.group(1)) if match else None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_speed_mbps(text: str | None) -> int | None:
    """``class/net/<if>/speed``: Mb/s, or None when unknown (``-1``, the u32 form of -1, unreadable)."""
    value = parse_int(text)
    if value is None or value <= 0 or value == 0xFFFFFFFF:
        return None
    return value


def parse_gid(text: str | None) -> ipaddress.IPv6Address | None:
    """A GID as the kernel prints it, or None when unreadable, malformed or all-zero (an unused entry)."""
    if text is None:
        return None
    try:
        gid = ipaddress.IPv6Address(text.strip())
    except ValueError:
        return None
    return gid if int(gid) else None


def twin_key(pci_address: str | None, hca_name: str) -> str | None:
    """What twins share: the PCI address without its domain (``01:00.1``), else the name without ``P<n>``."""
    if pci_address:
        match = _PCI_RE.match(pci_address)
        if match:
            return match.group("rest").lower()
    match = _HCA_NAME_RE.match(hca_name)
    if match:
        return "%s%s" % (match.group("kind"), match.group("rest"))
    return None


def _pci_sort_key(pci_address: str | None, name: str) -> tuple[int, str, str]:
    match = _PCI_RE.match(pci_address or "")
    if match:
        return int(match.group("domain"), 16), match.group("rest").lower(), name
    return 1 << 32, "", name


# --- records ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GidEntry:
    """One used entry of a port's GID table."""

    index: int
    gid: str                   # as the kernel prints it
    gid_type: str | None       # "RoCE v2", "IB/RoCE v1", or None when unreadable
    ndev: str | None

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
        mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        return str(mapped) if mapped else None

    @property
    def is_roce_v2(self) -> bool:
        return self.gid_type == ROCE_V2

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "gid": self.gid, "type": self.gid_type, "ndev": self.ndev,
                "ipv4": self.ipv4}


@dataclass(frozen=True)
class Port:
    number: int
    state: str | None          # "ACTIVE"
    phys_state: str | None     # "LinkUp"
    link_layer: str | None     # "Ethernet" / "InfiniBand"
    rate: str | None           # "200 Gb/sec (2X NDR)"
    gids: tuple[GidEntry, ...]
    netdevs: tuple[str, ...]   # from gid_attrs/ndevs, else the HCA's device/net

    @property
    def rate_gbps(self) -> float | None:
        return parse_rate_gbps(self.rate)

    @property
    def netdev(self) -> str | None:
        return self.netdevs[0] if self.netdevs else None

    def roce_v2_ipv4(self, ip: str | None = None) -> list[GidEntry]:
        """RoCE v2 entries holding an IPv4-mapped GID (of ``ip`` when given), lowest index first."""
        return [g for g in self.gids if g.is_roce_v2 and g.ipv4 is not None and (ip is None or g.ipv4 == ip)]

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.number, "state": self.state, "phys_state": self.phys_state,
                "link_layer": self.link_layer, "rate": self.rate, "rate_gbps": self.rate_gbps,
                "netdev": self.netdev, "gids": [g.to_dict() for g in self.gids]}


@dataclass(frozen=True)
class Hca:
    name: str
    node_guid: str | None
    fw_ver: str | None
    board_id: str | None
    hca_type: str | None
    pci_address: str | None
    netdevs: tuple[str, ...]   # device/net/<iface>
    ports: tuple[Port, ...]

    @property
    def twin_key(self) -> str | None:
        return twin_key(self.pci_address, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "node_guid": self.node_guid, "fw_ver": self.fw_ver,
                "board_id": self.board_id, "hca_type": self.hca_type, "pci_address": self.pci_address,
                "netdevs": list(self.netdevs), "ports": [p.to_dict() for p in self.ports]}


@dataclass(frozen=True)
class Netdev:
    name: str
    operstate: str | None      # "up", "down", ...
    mtu: int | None
    speed_mbps: int | None     # None when the kernel reports it unknown or cannot read it
    address: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "operstate": self.operstate, "mtu": self.mtu,
                "speed_mbps": self.speed_mbps, "address": self.address}


@dataclass(frozen=True)
class Problem:
    check: str
    severity: str              # ERROR makes ok false; WARNING does not
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "severity": self.severity, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class LinkInfo:
    hcas: tuple[Hca, ...]
    netdevs: tuple[Netdev, ...]
    hca: str | None            # the HCA whose port carries cx7_ip as RoCE v2
    port: int | None
    gid_index: int | None
    ib_hcas: tuple[str, ...]
    socket_ifname: str | None
    mtu: int | None
    speed_mbps: int | None
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)

    @property
    def ib_hca(self) -> str:
        return ",".join(self.ib_hcas)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hcas": [h.to_dict() for h in self.hcas],
            "netdevs": {n.name: n.to_dict() for n in self.netdevs},
            "hca": self.hca,
            "port": self.port,
            "gid_index": self.gid_index,
            "ib_hca": self.ib_hca,
            "ib_hcas": list(self.ib_hcas),
            "socket_ifname": self.socket_ifname,
            "mtu": self.mtu,
            "speed_mbps": self.speed_mbps,
            "problems": [p.to_dict() for p in self.problems],
            "ok": self.ok,
        }


# --- reading a tree -----------------------------------------------------------------------------------------

def _read(path: str) -> str | None:
    """A sysfs value without its trailing newline; None when absent or unreadable (EINVAL on live sysfs)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _numeric(names: list[str]) -> list[int]:
    return sorted(int(n) for n in names if n.isdigit())


def _pci_address(hca_dir: str) -> str | None:
    uevent = _read(os.path.join(hca_dir, "device", "uevent")) or ""
    for line in uevent.splitlines():
        key, _sep, value = line.partition("=")
        if key == "PCI_SLOT_NAME" and _PCI_RE.match(value.strip()):
            return value.strip().lower()
    device = os.path.join(hca_dir, "device")
    if os.path.islink(device):
        target = os.path.basename(os.path.realpath(device))
        if _PCI_RE.match(target):
            return target.lower()
    return None


def read_port(port_dir: str, number: int, hca_netdevs: tuple[str, ...]) -> Port:
    gids: list[GidEntry] = []
    for index in _numeric(_listdir(os.path.join(port_dir, "gids"))):
        gid = parse_gid(_read(os.path.join(port_dir, "gids", str(index))))
        if gid is None:
            continue
        gids.append(GidEntry(
            index=index,
            gid=gid.exploded,
            gid_type=_read(os.path.join(port_dir, "gid_attrs", "types", str(index))) or None,
            ndev=_read(os.path.join(port_dir, "gid_attrs", "ndevs", str(index))) or None,
        ))
    netdevs: list[str] = []
    for entry in gids:
        if entry.ndev and entry.ndev not in netdevs:
            netdevs.append(entry.ndev)
    if not netdevs:
        netdevs = list(hca_netdevs)
    return Port(
        number=number,
        state=parse_state(_read(os.path.join(port_dir, "state")))[1],
        phys_state=parse_state(_read(os.path.join(port_dir, "phys_state")))[1],
        link_layer=_read(os.path.join(port_dir, "link_layer")) or None,
        rate=_read(os.path.join(port_dir, "rate")) or None,
        gids=tuple(gids),
        netdevs=tuple(netdevs),
    )


def read_hca(hca_dir: str) -> Hca:
    hca_netdevs = tuple(_listdir(os.path.join(hca_dir, "device", "net")))
    ports = tuple(read_port(os.path.join(hca_dir, "ports", str(n)), n, hca_netdevs)
                  for n in _numeric(_listdir(os.path.join(hca_dir, "ports"))))
    return Hca(
        name=os.path.basename(hca_dir),
        node_guid=_read(os.path.join(hca_dir, "node_guid")),
        fw_ver=_read(os.path.join(hca_dir, "fw_ver")),
        board_id=_read(os.path.join(hca_dir, "board_id")),
        hca_type=_read(os.path.join(hca_dir, "hca_type")),
        pci_address=_pci_address(hca_dir),
        netdevs=hca_netdevs,
        ports=ports,
    )


def read_netdev(sysfs_root: str, name: str) -> Netdev | None:
    """class/net/<name>, or None when there is no such netdev."""
    directory = os.path.join(sysfs_root, "class", "net", name)
    if not os.path.isdir(directory):
        return None
    return Netdev(
        name=name,
        operstate=_read(os.path.join(directory, "operstate")),
        mtu=parse_int(_read(os.path.join(directory, "mtu"))),
        speed_mbps=parse_speed_mbps(_read(os.path.join(directory, "speed"))),
        address=_read(os.path.join(directory, "address")),
    )


def check_sysfs_root(sysfs_root: str) -> None:
    """RdmaError unless sysfs_root looks like a sysfs mount (every Linux sysfs has class/net)."""
    if not os.path.isdir(sysfs_root):
        raise RdmaError("sysfs root %s does not exist or is not a directory" % sysfs_root)
    if not os.path.isdir(os.path.join(sysfs_root, "class", "net")):
        raise RdmaError("%s does not look like a sysfs tree (no class/net under it): point sysfs_root at "
                        "the sysfs mount itself, /sys on a node" % sysfs_root)


def read_sysfs(sysfs_root: str = DEFAULT_SYSFS_ROOT,
               extra_netdevs: tuple[str, ...] = ()) -> tuple[tuple[Hca, ...], tuple[Netdev, ...]]:
    """Every HCA under class/infiniband (PCI order) and the netdevs they map to, plus extra_netdevs."""
    check_sysfs_root(sysfs_root)
    ib_dir = os.path.join(sysfs_root, "class", "infiniband")
    hcas = sorted((read_hca(os.path.join(ib_dir, name)) for name in _listdir(ib_dir)),
                  key=lambda h: _pci_sort_key(h.pci_address, h.name))
    names: list[str] = []
    for hca in hcas:
        for name in list(hca.netdevs) + [n for p in hca.ports for n in p.netdevs]:
            if name not in names:
                names.append(name)
    for name in extra_netdevs:
        if name and name not in names:
            names.append(name)
    netdevs = tuple(nd for nd in (read_netdev(sysfs_root, n) for n in names) if nd is not None)
    return tuple(hcas), netdevs


# --- the decision -------------------------------------------------------------------------------------------

def _port_faults(port: Port, netdev: Netdev | None) -> list[str]:
    faults = []
    if port.link_layer != "Ethernet":
        faults.append("link layer %s" % port.link_layer)
    if port.state != "ACTIVE":
        faults.append("port state %s" % port.state)
    if port.phys_state != "LinkUp":
        faults.append("phys_state %s" % port.phys_state)
    if netdev is None:
        faults.append("no netdev")
    elif netdev.operstate != "up":
        faults.append("%s operstate %s" % (netdev.name, netdev.operstate))
    return faults


def _gid_problem(hcas: tuple[Hca, ...], ip: str) -> Problem:
    """Why no port carries ip as a RoCE v2 GID."""
    v1_only = [(h, p, g) for h in hcas for p in h.ports for g in p.gids if g.ipv4 == ip]
    if v1_only:
        where = ", ".join("%s port %d index %d (%s)" % (h.name, p.number, g.index, g.gid_type)
                          for h, p, g in v1_only)
        return Problem(
            "gid_roce_v2", ERROR,
            "%s is in the GID table only without RoCE v2: %s." % (ip, where),
            "Enable RoCE v2 on the port (mlx5 adds a RoCE v2 entry for every address by default; check "
            "`cma_roce_mode -d <hca> -p 1` and the rdma_cm configfs default_roce_mode), then re-add the "
            "address so the kernel rebuilds the GID entries.")
    ipv4 = [(h, p, g) for h in hcas for p in h.ports for g in p.gids if g.ipv4 is not None]
    if not ipv4:
        return Problem(
            "ipv6_only", ERROR,
            "No RDMA port has an IPv4 GID: the GID tables hold only IPv6 entries, so %s is not on any CX7 "
            "netdev and NCCL_IB_ADDR_FAMILY=AF_INET finds nothing." % ip,
            "Assign %s to the CX7 interface (netplan `addresses: [%s/<prefix>]` on the port the cable is in, "
            "MTU 9000) and re-run; the kernel adds the IPv4-mapped RoCE v2 GID as soon as the address is "
            "up." % (ip, ip))
    shown = [(h, p, g) for h, p, g in ipv4 if g.is_roce_v2] or ipv4
    seen = ", ".join("%s on %s (%s port %d, %s index %d)" % (g.ipv4, g.ndev or p.netdev, h.name, p.number,
                                                             g.gid_type, g.index)
                     for h, p, g in shown)
    return Problem(
        "gid_ipv4", ERROR,
        "No GID encodes %s: the address is not on any RDMA netdev. IPv4 GIDs present: %s." % (ip, seen),
        "Check the node's cx7_ip in the inventory against `ip -4 -o addr show` on the CX7 interface, or "
        "configure %s on it (netplan, not only a link-local address); then re-run." % ip)


def decide(hcas: tuple[Hca, ...], netdevs: tuple[Netdev, ...], cx7_ip: ipaddress.IPv4Address,
           cx7_iface: str | None = None) -> LinkInfo:
    """What NCCL needs on this node for cx7_ip, from records read with read_sysfs(); never raises."""
    ip = str(cx7_ip)
    by_name = {nd.name: nd for nd in netdevs}
    problems: list[Problem] = []

    def result(**found: Any) -> LinkInfo:
        values: dict[str, Any] = {"hca": None, "port": None, "gid_index": None, "ib_hcas": (),
                                  "socket_ifname": None, "mtu": None, "speed_mbps": None}
        values.update(found)
        return LinkInfo(hcas=hcas, netdevs=netdevs, problems=tuple(problems), **values)

    if not hcas:
        problems.append(Problem(
            "no_hca", ERROR,
            "No RDMA device under class/infiniband: the CX7 is not visible as an HCA.",
            "Load the RDMA stack (`modprobe mlx5_ib`; DGX OS loads it by default) and check `ibdev2netdev` or "
            "`ls /sys/class/infiniband`; when this runs in a container, the host's /sys must be visible."))
        return result()

    matches = [(h, p, g) for h in hcas for p in h.ports for g in p.roce_v2_ipv4(ip)]
    if not matches:
        problems.append(_gid_problem(hcas, ip))
        return result()

    hca, port, gid = matches[0]
    others = sorted({"%s port %d" % (h.name, p.number) for h, p, _g in matches[1:]
                     if (h.name, p.number) != (hca.name, port.number)})
    if others:
        problems.append(Problem(
            "ip_ambiguous", WARNING,
            "%s is a RoCE v2 GID on more than one port: %s port %d (used) and %s." % (
                ip, hca.name, port.number, ", ".join(others)),
            "Keep %s on one CX7 netdev only; give a twin its own subnet." % ip))

    iface = gid.ndev or port.netdev
    netdev = by_name.get(iface) if iface else None
    if port.link_layer != "Ethernet":
        problems.append(Problem(
            "link_layer", ERROR,
            "%s port %d runs link layer %s, not Ethernet: RoCE (and this GID index) needs Ethernet." % (
                hca.name, port.number, port.link_layer),
            "Set the CX7 port to Ethernet (`mlxconfig -d %s set LINK_TYPE_P1=2`, then a cold reboot) on both "
            "nodes." % (hca.pci_address or hca.name)))
    if port.state != "ACTIVE":
        problems.append(Problem(
            "port_state", ERROR,
            "%s port %d is %s, not ACTIVE." % (hca.name, port.number, port.state),
            "Check the cable between the two nodes' CX7 ports and that %s is up on both ends "
            "(`ip link set %s up`, persistent in netplan); `ibdev2netdev` must show (Up)." % (iface, iface)))
    if port.phys_state != "LinkUp":
        hint = {"Polling": " Polling means no link partner: cable unplugged, faulty, or the peer port down.",
                "Disabled": " Disabled means the netdev is administratively down."}.get(port.phys_state or "", "")
        problems.append(Problem(
            "phys_state", ERROR,
            "%s port %d physical state is %s, not LinkUp.%s" % (hca.name, port.number, port.phys_state, hint),
            "Reseat or replace the QSFP cable, use the same CX7 port on both nodes, and bring %s up on both "
            "ends." % iface))
    if netdev is None:
        problems.append(Problem(
            "netdev_state", ERROR,
            "%s port %d maps to netdev %s, which is not under class/net." % (hca.name, port.number, iface),
            "Check `ibdev2netdev`: the RDMA device and its netdev must both exist (driver loaded, not "
            "renamed mid-boot)."))
    elif netdev.operstate != "up":
        problems.append(Problem(
            "netdev_state", ERROR,
            "%s is %s, not up." % (netdev.name, netdev.operstate),
            "`ip link set %s up` and make it persistent in netplan; with no carrier, check the cable and the "
            "peer's port." % netdev.name))
    if netdev is not None:
        problems.extend(_netdev_warnings(netdev))
    if cx7_iface and cx7_iface != iface:
        problems.append(Problem(
            "cx7_iface", ERROR,
            "cx7_iface is %s, but %s is on %s (%s port %d)." % (cx7_iface, ip, iface, hca.name, port.number),
            "Set cx7_iface to %s for this node (interface names differ between nodes), or move %s to "
            "%s." % (iface, ip, cx7_iface)))

    listed = [hca]
    for twin in hcas:
        if twin is hca or twin.twin_key is None or twin.twin_key != hca.twin_key:
            continue
        for twin_port in twin.ports:
            if _twin_usable(twin, twin_port, by_name, gid.index, problems):
                listed.append(twin)
                break
    ib_hcas = tuple(h.name for h in hcas if any(h is x for x in listed))

    return result(hca=hca.name, port=port.number, gid_index=gid.index, ib_hcas=ib_hcas, socket_ifname=iface,
                  mtu=netdev.mtu if netdev else None, speed_mbps=netdev.speed_mbps if netdev else None)


def _netdev_warnings(netdev: Netdev) -> list[Problem]:
    found = []
    if netdev.mtu is None or netdev.mtu < MIN_MTU:
        found.append(Problem(
            "mtu", WARNING,
            "%s MTU is %s, below %d: RoCE then uses a smaller path MTU and NCCL loses bandwidth." % (
                netdev.name, netdev.mtu, MIN_MTU),
            "Set MTU %d on %s on both nodes (netplan `mtu: %d`; the peer must match)." % (
                MIN_MTU, netdev.name, MIN_MTU)))
    if netdev.speed_mbps is None or netdev.speed_mbps < MIN_SPEED_MBPS:
        speed = "unknown" if netdev.speed_mbps is None else "%d Mb/s" % netdev.speed_mbps
        found.append(Problem(
            "speed", WARNING,
            "%s link speed is %s, below %d Mb/s." % (netdev.name, speed, MIN_SPEED_MBPS),
            "Check `ethtool %s`: a CX7 port of a DGX Spark links at 200000Mb/s with a 200G QSFP112 cable; "
            "reseat or replace the cable and use the same port on both nodes." % netdev.name))
    return found


def _twin_usable(twin: Hca, port: Port, by_name: dict[str, Netdev], gid_index: int,
                 problems: list[Problem]) -> bool:
    """Whether a twin port can join NCCL_IB_HCA with the same GID index; add a warning if it cannot."""
    netdev = by_name.get(port.netdev) if port.netdev else None
    faults = _port_faults(port, netdev)
    if faults:
        problems.append(Problem(
            "twin_down", WARNING,
            "Twin %s port %d (%s) is not usable (%s): NCCL gets one PCIe x4 half of the CX7 port, about half "
            "the link's bandwidth." % (twin.name, port.number, port.netdev, "; ".join(faults)),
            "Bring %s up with MTU 9000 (netplan); it shares the cable with the primary port, then add it to "
            "NCCL_IB_HCA by re-running this check." % port.netdev))
        return False
    at_index = [g for g in port.gids if g.index == gid_index]
    if not (at_index and at_index[0].is_roce_v2 and at_index[0].ipv4):
        v2 = port.roce_v2_ipv4()
        where = ("its RoCE v2 IPv4 GID is at index %s" % ", ".join(str(g.index) for g in v2)) if v2 \
            else "it has no RoCE v2 IPv4 GID"
        problems.append(Problem(
            "twin_gid_index", WARNING,
            "Twin %s port %d (%s) is left out of NCCL_IB_HCA: NCCL_IB_GID_INDEX=%d applies to every listed "
            "HCA and %s." % (twin.name, port.number, port.netdev, gid_index, where),
            "Give %s an IPv4 address of its own subnet (the peer's twin on the same subnet) so its RoCE v2 "
            "IPv4 GID also sits at index %d, or leave NCCL_IB_GID_INDEX unset and let NCCL pick per "
            "HCA." % (port.netdev, gid_index)))
        return False
    if netdev is not None and (netdev.mtu is None or netdev.mtu < MIN_MTU):
        problems.extend(p for p in _netdev_warnings(netdev) if p.check == "mtu")
    return True


def resolve_link(cx7_ip: str, cx7_iface: str | None = None,
                 sysfs_root: str = DEFAULT_SYSFS_ROOT) -> LinkInfo:
    """read_sysfs() + decide(); RdmaError only for a bad sysfs root or a cx7_ip that is not IPv4."""
    ip = parse_cx7_ip(cx7_ip)
    hcas, netdevs = read_sysfs(sysfs_root, extra_netdevs=(cx7_iface,) if cx7_iface else ())
    return decide(hcas, netdevs, ip, cx7_iface)
