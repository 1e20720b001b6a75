# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight decisions: raw probe output from every node -> checks, a JSON report per node, a summary.

Private to the dgxspark.vllm collection: this API may change at any time.

Pure logic, no Ansible imports and no I/O: the preflight role runs read-only probes on the nodes (``ip -j addr``,
``ss -Hltnp``, ``df``, ``/proc/meminfo``, ``docker info``/``inspect``/``top``, ``nvidia-smi``, ``ping``,
``dgxspark.vllm.rdma_link_info``) and hands their raw results here. Every check becomes a ``Check`` with a
name, a status (pass, fail, warn, skipped), the evidence it was decided on and, when it is not a pass, the fix.
Checks are computed only for the probes that were given, so the role can ask for the CX7 interface first
(it pings from it) and for the whole report once every probe ran.

Check names: ``cx7_ip``, ``cx7_interface``, ``cx7_subnet``, ``cx7_mtu``, ``rdma`` (or ``rdma.<problem>`` per
problem of rdma_link_info), ``pin.gid_index``, ``pin.ib_hca``, ``ping.<node>``, ``port.<port>``, ``disk``,
``memory``, ``docker``, ``gpu_runtime``, ``gpu``, ``arch``, ``gpu_free``, ``secret_files``, and once for the
cluster, on the head, ``api_exposure``.
"""
from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._units import human_bytes

PASS = "pass"
FAIL = "fail"
WARN = "warn"
SKIPPED = "skipped"
STATUSES = (PASS, FAIL, WARN, SKIPPED)
REPORT_SCHEMA = 1

_SS_PROC_RE = re.compile(r'\("((?:[^"\\]|\\.)*)",pid=(\d+),fd=\d+\)')
_PING_SUMMARY_RE = re.compile(r"^\d+ packets transmitted.*$", re.MULTILINE)
_PING_RTT_RE = re.compile(r"^(?:rtt|round-trip) .*$", re.MULTILINE)


class PreflightError(Exception):
    """Input the decisions cannot work with (malformed node data, bad settings)."""


# --- records ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One decided check. ``fix`` is empty for a pass; ``data`` holds the numbers behind the evidence."""

    name: str
    status: str
    evidence: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise PreflightError("check %s has unknown status %r" % (self.name, self.status))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "evidence": self.evidence, "fix": self.fix,
                "data": dict(self.data)}


@dataclass(frozen=True)
class Link:
    """One interface from ``ip -j addr show``: name, state, MTU and its IPv4 addresses with prefixes."""

    name: str
    operstate: str
    flags: tuple[str, ...]
    mtu: int | None
    addresses: tuple[ipaddress.IPv4Interface, ...]

    @property
    def up(self) -> bool:
        """Administratively up with carrier (operstate UP, or UNKNOWN with LOWER_UP as some drivers report)."""
        if self.operstate == "UP":
            return True
        return self.operstate == "UNKNOWN" and "UP" in self.flags and "LOWER_UP" in self.flags

    def carries(self, ip: ipaddress.IPv4Address) -> ipaddress.IPv4Interface | None:
        return next((a for a in self.addresses if a.ip == ip), None)

    def in_subnet(self, subnet: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Interface, ...]:
        return tuple(a for a in self.addresses if a.ip in subnet)

    def describe(self) -> str:
        addrs = ", ".join(str(a) for a in self.addresses) or "no IPv4"
        return "%s (%s, MTU %s, %s)" % (self.name, self.operstate, self.mtu, addrs)


@dataclass(frozen=True)
class Listener:
    """One TCP listening socket from ``ss -Hltnp``; ``processes`` is empty when ss could not name them."""

    address: str
    port: int
    processes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PortSpec:
    port: int
    variable: str
    purpose: str


@dataclass(frozen=True)
class Settings:
    """The cluster-wide settings the decisions need (the role passes the dgxspark_vllm_* / preflight_* vars)."""

    cx7_subnet: str = ""
    api_port: int = 8000
    master_port: int = 29521
    container_name: str = "vllm_glm53"
    model_path: str = ""
    checkpoint_size_bytes: int = 185000000000
    disk_margin_bytes: int = 20000000000
    mem_available_floor_bytes: int = 110000000000
    lab: bool = False
    rdma_skip: bool = False
    expected_gpu: str = "GB10"
    expected_arch: str = "aarch64"
    min_mtu: int = 9000

    def ports(self) -> tuple[PortSpec, ...]:
        specs = [PortSpec(self.api_port, "dgxspark_vllm_port", "API port")]
        if self.master_port != self.api_port:
            specs.append(PortSpec(self.master_port, "dgxspark_vllm_master_port", "master port"))
        return tuple(specs)

    def validate(self) -> None:
        for name in ("checkpoint_size_bytes", "disk_margin_bytes", "mem_available_floor_bytes"):
            if getattr(self, name) < 0:
                raise PreflightError("%s must be >= 0, got %s" % (name, getattr(self, name)))
        for name in ("api_port", "master_port"):
            if not 1 <= getattr(self, name) <= 65535:
                raise PreflightError("%s must be within 1..65535, got %s" % (name, getattr(self, name)))
        if self.rdma_skip and not self.lab:
            raise PreflightError(
                "preflight_rdma_skip is honoured only in the lab (dgxspark_vllm_lab: true): on real Sparks the "
                "RDMA check decides NCCL_IB_HCA and NCCL_IB_GID_INDEX and cannot be skipped")


# --- small helpers ------------------------------------------------------------------------------------------

def _last_line(*texts: Any) -> str:
    for text in texts:
        lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def _probe(node: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A command probe as a dict (rc, stdout, stderr, msg), or None when the probe was not given."""
    value = node.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PreflightError("node %s: probe %s must be a dict of rc/stdout/stderr, got %s" % (
            node.get("name"), key, type(value).__name__))
    return value


def _rc(probe: dict[str, Any]) -> int | None:
    rc = probe.get("rc")
    try:
        return int(rc) if rc is not None else None
    except (TypeError, ValueError):
        return None


def _not_found(probe: dict[str, Any]) -> bool:
    """The command does not exist on the node (shell: rc 127; the command module: a failed exec)."""
    rc = _rc(probe)
    text = "%s %s" % (probe.get("msg") or "", probe.get("stderr") or "")
    if rc == 127 or "No such file or directory" in text or "command not found" in text:
        return True
    # ansible-core 2.19's command module: rc 2, "Error executing command.", and no output at all
    return rc == 2 and str(probe.get("msg") or "").startswith("Error executing command") and \
        not str(probe.get("stdout") or "").strip() and not str(probe.get("stderr") or "").strip()


# --- parsers ------------------------------------------------------------------------------------------------

def parse_ip_addr_json(text: str) -> tuple[Link, ...]:
    """``ip -j addr show`` -> links; PreflightError when it is not that JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PreflightError("`ip -j addr show` did not print JSON: %s" % exc) from exc
    if not isinstance(data, list):
        raise PreflightError("`ip -j addr show` printed %s, not a list of interfaces" % type(data).__name__)
    links = []
    for entry in data:
        if not isinstance(entry, dict) or not entry.get("ifname"):
            continue
        addresses = []
        for info in entry.get("addr_info") or ():
            if info.get("family") != "inet" or "local" not in info:
                continue
            try:
                addresses.append(ipaddress.IPv4Interface("%s/%s" % (info["local"], info.get("prefixlen", 32))))
            except ValueError:
                continue
        mtu = entry.get("mtu")
        links.append(Link(name=str(entry["ifname"]), operstate=str(entry.get("operstate") or "UNKNOWN"),
                          flags=tuple(str(f) for f in entry.get("flags") or ()),
                          mtu=mtu if isinstance(mtu, int) else None, addresses=tuple(addresses)))
    return tuple(links)


def parse_ss_listeners(text: str) -> tuple[Listener, ...]:
    """``ss -Hltnp`` lines -> listeners (``0.0.0.0:8000``, ``[::]:8000``, ``127.0.0.53%lo:53``, ``*:22``)."""
    listeners = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[0].startswith("LISTEN"):
            continue
        address, _sep, port = fields[3].rpartition(":")
        if not port.isdigit():
            continue
        processes = tuple((name.replace('\\"', '"'), int(pid))
                          for name, pid in _SS_PROC_RE.findall(" ".join(fields[5:])))
        listeners.append(Listener(address=address, port=int(port), processes=processes))
    return tuple(listeners)


def parse_pids(text: str) -> frozenset[int]:
    """``docker top NAME -eo pid``: a PID header, then one host PID a line."""
    return frozenset(int(line.strip()) for line in text.splitlines() if line.strip().isdigit())


def parse_meminfo_available(text: str) -> int:
    """MemAvailable in bytes (/proc/meminfo's kB are KiB); PreflightError when absent or malformed."""
    for line in text.splitlines():
        key, _sep, rest = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = rest.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
                return int(parts[0]) * 1024
            raise PreflightError("malformed MemAvailable line in /proc/meminfo: %r" % line)
    raise PreflightError("/proc/meminfo has no MemAvailable line (kernel older than 3.14?)")


def parse_disk_probe(text: str) -> dict[str, Any]:
    """The role's disk probe: tab-separated ``probed PATH``, ``df AVAIL MOUNT``, ``present BYTES`` lines."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        key, _sep, rest = line.partition("\t")
        if key == "probed":
            found["probed"] = rest
        elif key == "df":
            avail, _sep, mount = rest.partition("\t")
            if avail.strip().isdigit():
                found["avail"] = int(avail.strip())
                found["mount"] = mount
        elif key == "present" and rest.strip().isdigit():
            found["present"] = int(rest.strip())
    if "avail" not in found or "probed" not in found:
        raise PreflightError("the disk probe printed no free space: %r" % text[-300:])
    found.setdefault("present", 0)
    return found


def parse_docker_inspect(text: str) -> list[dict[str, Any]]:
    """``docker inspect ID...`` -> its list of containers; empty text is no containers."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PreflightError("`docker inspect` did not print JSON: %s" % exc) from exc
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


def parse_gpu_query(text: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`` -> one dict a GPU."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        parts += [""] * (3 - len(parts))
        gpus.append({"name": parts[0], "driver_version": parts[1], "memory_total": ", ".join(parts[2:]).strip(", ")})
    return gpus


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader``."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0].isdigit():
            apps.append({"pid": int(parts[0]), "process_name": parts[1] if len(parts) > 1 else "",
                         "used_memory": parts[2] if len(parts) > 2 else ""})
    return apps


# --- decisions: the CX7 interface ---------------------------------------------------------------------------

@dataclass(frozen=True)
class InterfaceDecision:
    checks: tuple[Check, ...]
    detected: Link | None      # what the node shows: the carrier of cx7_ip, else the one link in the subnet
    effective: Link | None     # the inventory's interface when set (and present), else the detected one


def decide_interface(links: tuple[Link, ...], cx7_ip_text: str, subnet_text: str,
                     configured: str = "") -> InterfaceDecision:
    """Which interface is the CX7 link, whether it carries the inventory IP, is up and sits in the subnet."""
    checks: list[Check] = []
    listing = "; ".join(link.describe() for link in links if link.name != "lo") or "none"
    try:
        ip = ipaddress.IPv4Address(str(cx7_ip_text).strip())
    except ValueError:
        checks.append(Check("cx7_ip", FAIL, "dgxspark_vllm_cx7_ip %r is not an IPv4 address." % (cx7_ip_text,),
                            "Set dgxspark_vllm_cx7_ip for this node to its IPv4 address on the CX7 link, without "
                            "a prefix length (`ip -4 -o addr show` on the CX7 interface)."))
        return InterfaceDecision(tuple(checks), None, None)
    subnet: ipaddress.IPv4Network | None = None
    if not str(subnet_text or "").strip():
        checks.append(Check("cx7_subnet", FAIL, "dgxspark_vllm_cx7_subnet is empty.",
                            "Set dgxspark_vllm_cx7_subnet to the CX7 link's subnet in CIDR form (for example "
                            "192.168.177.0/24); the launch passes it as NCCL_IB_ADDR_RANGE."))
    else:
        try:
            subnet = ipaddress.IPv4Network(str(subnet_text).strip(), strict=False)
        except ValueError:
            checks.append(Check("cx7_subnet", FAIL, "dgxspark_vllm_cx7_subnet %r is not an IPv4 CIDR." % subnet_text,
                                "Set dgxspark_vllm_cx7_subnet to the CX7 subnet in CIDR form, e.g. 192.168.177.0/24."))

    carriers = [link for link in links if link.carries(ip)]
    in_subnet = [link for link in links if subnet is not None and link.in_subnet(subnet)]
    detected: Link | None = None
    if len(carriers) == 1:
        detected = carriers[0]
    elif len(carriers) > 1:
        detected = carriers[0]
        checks.append(Check("cx7_ip", FAIL, "%s is on more than one interface: %s." % (
            ip, ", ".join(c.name for c in carriers)),
            "Keep %s on the CX7 interface only, or name it with dgxspark_vllm_cx7_iface." % ip,
            {"interfaces": [c.name for c in carriers]}))
    elif len(in_subnet) == 1:
        detected = in_subnet[0]

    by_name = {link.name: link for link in links}
    effective = detected
    if configured:
        effective = by_name.get(configured)
        if effective is None:
            checks.append(Check("cx7_interface", FAIL,
                                "dgxspark_vllm_cx7_iface is %s, which does not exist on this node. Interfaces: %s."
                                % (configured, listing),
                                "Set dgxspark_vllm_cx7_iface to this node's CX7 interface%s, or remove it to let "
                                "preflight detect it (names differ between nodes: set it per host)." % (
                                    " (%s carries %s)" % (detected.name, ip) if detected and detected.carries(ip)
                                    else "")))

    if len(carriers) > 1:
        pass  # reported above
    elif not carriers:
        near = "; ".join("%s carries %s" % (link.name, ", ".join(str(a) for a in link.in_subnet(subnet)))
                         for link in in_subnet) if subnet is not None else ""
        fix = "Set dgxspark_vllm_cx7_ip for this node to the address its CX7 interface carries"
        if len(in_subnet) == 1 and subnet is not None:
            fix += " (%s)" % in_subnet[0].in_subnet(subnet)[0].ip
        fix += ", or add %s to the CX7 interface (netplan `addresses`, MTU 9000) and bring it up." % ip
        checks.append(Check("cx7_ip", FAIL, "%s (dgxspark_vllm_cx7_ip) is not on any interface of this node.%s" % (
            ip, (" In the CX7 subnet %s: %s." % (subnet, near)) if near else " Interfaces: %s." % listing), fix,
            {"cx7_ip": str(ip), "in_subnet": [link.name for link in in_subnet]}))
    elif configured and effective is not None and not effective.carries(ip):
        checks.append(Check("cx7_ip", FAIL, "%s is on %s, not on dgxspark_vllm_cx7_iface %s." % (
            ip, ", ".join(c.name for c in carriers), configured),
            "Set dgxspark_vllm_cx7_iface to %s for this node, or move %s to %s." % (carriers[0].name, ip, configured),
            {"cx7_ip": str(ip), "carriers": [c.name for c in carriers]}))
    elif len(carriers) == 1:
        address = carriers[0].carries(ip)
        checks.append(Check("cx7_ip", PASS, "%s is on %s (%s)." % (ip, carriers[0].name, address), "",
                            {"cx7_ip": str(ip), "interface": carriers[0].name, "address": str(address)}))

    if effective is None:
        if not configured or configured in by_name:
            checks.append(Check("cx7_interface", FAIL,
                                "No interface carries %s%s. Interfaces: %s." % (
                                    ip, " and none is in %s" % subnet if subnet is not None else "", listing),
                                "Address the CX7 port (the one the cable is in) with %s/<prefix> and MTU 9000 "
                                "(netplan), or fix dgxspark_vllm_cx7_ip." % ip))
    elif effective.up:
        checks.append(Check("cx7_interface", PASS, "%s is up: %s." % (effective.name, effective.describe()), "",
                            {"interface": effective.name, "operstate": effective.operstate, "mtu": effective.mtu}))
    else:
        checks.append(Check("cx7_interface", FAIL, "%s is not up: %s, flags %s." % (
            effective.name, effective.describe(), ",".join(effective.flags)),
            "`ip link set %s up` and make it persistent (netplan); with NO-CARRIER, check the cable and the peer's "
            "port." % effective.name, {"interface": effective.name, "operstate": effective.operstate}))

    if subnet is not None:
        if ip not in subnet:
            checks.append(Check("cx7_subnet", FAIL, "%s is not in dgxspark_vllm_cx7_subnet %s." % (ip, subnet),
                                "Make dgxspark_vllm_cx7_subnet the subnet of the CX7 link (NCCL_IB_ADDR_RANGE) or "
                                "fix dgxspark_vllm_cx7_ip; every node's CX7 IP must be inside it."))
        else:
            address = effective.carries(ip) if effective is not None else None
            if address is not None and address.network != subnet:
                checks.append(Check("cx7_subnet", WARN, "%s is in %s, but %s carries it as %s (network %s)." % (
                    ip, subnet, effective.name if effective else "?", address, address.network),
                    "Make dgxspark_vllm_cx7_subnet and the interface's prefix agree (NCCL_IB_ADDR_RANGE selects "
                    "by it)."))
            else:
                checks.append(Check("cx7_subnet", PASS, "%s is in %s." % (ip, subnet)))
    return InterfaceDecision(tuple(checks), detected, effective)


def mtu_checks(mtus: dict[str, tuple[str | None, int | None]], min_mtu: int = 9000) -> dict[str, Check]:
    """Per node: does its CX7 MTU match every other node's (fail if not), and reach min_mtu (warn if not)."""
    known = {node: (iface, mtu) for node, (iface, mtu) in mtus.items() if iface and mtu is not None}
    listing = ", ".join("%s %s %s" % (node, iface, mtu) for node, (iface, mtu) in sorted(known.items()))
    values = {mtu for _iface, mtu in known.values()}
    out: dict[str, Check] = {}
    for node in mtus:
        if node not in known:
            out[node] = Check("cx7_mtu", SKIPPED, "No CX7 interface found on this node, so no MTU to compare.")
            continue
        iface, mtu = known[node]
        data = {"mtu": mtu, "nodes": {n: m for n, (_i, m) in known.items()}}
        if len(values) > 1:
            out[node] = Check("cx7_mtu", FAIL, "The CX7 MTU differs across nodes: %s." % listing,
                              "Set the same MTU (%d) on the CX7 interface of every node (netplan `mtu: %d`), on "
                              "both ends of the cable." % (max(min_mtu, *values), max(min_mtu, *values)),
                              data)
        elif mtu is not None and mtu < min_mtu:
            out[node] = Check("cx7_mtu", WARN, "%s MTU %s, below %d (same on every node: %s)." % (
                iface, mtu, min_mtu, listing),
                "Set MTU %d on the CX7 interface of every node (netplan `mtu: %d`): RoCE loses bandwidth below it."
                % (min_mtu, min_mtu), data)
        else:
            out[node] = Check("cx7_mtu", PASS, "%s MTU %s, the same on every node (%s)." % (iface, mtu, listing),
                              "", data)
    return out


# --- decisions: reachability, ports, disk, memory -----------------------------------------------------------

def ping_checks(node: str, pings: list[dict[str, Any]], iface: str | None, subnet: str) -> list[Check]:
    """One ``ping.<peer>`` check per peer from ``ping -I <iface> -c 2 -W 2 <peer ip>`` results."""
    checks = []
    for ping in pings:
        target = str(ping.get("target") or ping.get("item"))
        cmd = ping.get("cmd")
        if isinstance(cmd, str):
            cmd = cmd.split()
        ip = str(ping.get("ip") or (cmd[-1] if isinstance(cmd, list) and cmd else ""))
        name = "ping.%s" % target
        if not iface:
            checks.append(Check(name, SKIPPED, "No CX7 interface on %s to ping %s (%s) from: see cx7_interface."
                                % (node, target, ip)))
            continue
        if ping.get("skipped") or not ip.strip() or ip == "None":
            checks.append(Check(name, SKIPPED, "%s has no dgxspark_vllm_cx7_ip to ping (see its cx7_ip check)."
                                % target))
            continue
        rc = _rc(ping)
        stdout = str(ping.get("stdout") or "")
        summary = _PING_SUMMARY_RE.search(stdout)
        rtt = _PING_RTT_RE.search(stdout)
        outcome = summary.group(0) if summary else _last_line(ping.get("stderr"), ping.get("msg"), stdout) or "rc %s" % rc
        evidence = "`ping -I %s -c 2 -W 2 %s` (%s's CX7 IP): %s" % (iface, ip, target, outcome)
        data = {"target": target, "ip": ip, "interface": iface, "rc": rc}
        if rc == 0:
            checks.append(Check(name, PASS, evidence + (" (%s)" % rtt.group(0) if rtt else "") + ".", "", data))
        else:
            checks.append(Check(name, FAIL, evidence + ".",
                                "Check %s's dgxspark_vllm_cx7_ip (%s) against the address on its CX7 interface, "
                                "that both ends of the cable are up and inside %s, and that nothing drops ICMP "
                                "on the link; then `ping -I %s %s` from %s must answer." % (
                                    target, ip, subnet or "the CX7 subnet", iface, ip, node), data))
    return checks


def port_checks(listeners: tuple[Listener, ...], own_pids: frozenset[int], settings: Settings,
                head: bool) -> list[Check]:
    """Each serve port free, or held only by our own serve container's processes (a relaunch replaces them).

    A foreign holder fails on the head (it binds the API and master ports) and warns on a worker (a headless
    worker binds neither, but the port is still taken should this node become the head).
    """
    checks = []
    for spec in settings.ports():
        name = "port.%d" % spec.port
        holders = [listener for listener in listeners if listener.port == spec.port]
        label = "%d (%s, %s)" % (spec.port, spec.purpose, spec.variable)
        if not holders:
            checks.append(Check(name, PASS, "Port %s is free." % label, "", {"port": spec.port, "holders": []}))
            continue
        processes = sorted({p for listener in holders for p in listener.processes})
        where = ", ".join(sorted({"%s:%d" % (listener.address, listener.port) for listener in holders}))
        data = {"port": spec.port, "holders": [{"process": n, "pid": p, "ours": p in own_pids} for n, p in processes]}
        foreign = [(n, p) for n, p in processes if p not in own_pids]
        unnamed = any(not listener.processes for listener in holders)
        if processes and not foreign and not unnamed:
            checks.append(Check(name, PASS, "Port %s is held by our serve container %s (%s); a relaunch replaces it."
                                % (label, settings.container_name, ", ".join("%s pid %d" % p for p in processes)),
                                "", data))
            continue
        who = ", ".join("%s (pid %d)" % p for p in foreign) or "a process ss could not name (run with become)"
        evidence = "Port %s is held by %s on %s, not by the serve container %s." % (
            label, who, where, settings.container_name)
        fix = ("Stop that process (`ss -ltnp 'sport = :%d'` shows it, `systemctl status <pid>` names its unit) or "
               "set %s to a free port." % (spec.port, spec.variable))
        if head:
            checks.append(Check(name, FAIL, evidence, fix, data))
        else:
            checks.append(Check(name, WARN, evidence + " A headless worker does not bind it.", fix, data))
    return checks


def disk_check(probe: dict[str, Any], settings: Settings) -> Check:
    """Free bytes where the checkpoint goes >= what is still to download + the margin."""
    if _rc(probe) not in (0, None):
        return Check("disk", FAIL, "The disk probe for %s failed (rc %s): %s" % (
            settings.model_path, _rc(probe), _last_line(probe.get("stderr"), probe.get("msg"))),
            "Check that %s (or a parent) is readable and `df` works on the node." % settings.model_path)
    try:
        found = parse_disk_probe(str(probe.get("stdout") or ""))
    except PreflightError as exc:
        return Check("disk", FAIL, str(exc), "Check that `df -PB1` works on the node.")
    still = max(0, settings.checkpoint_size_bytes - found["present"])
    needed = still + settings.disk_margin_bytes
    data = {"path": found["probed"], "mount": found.get("mount", ""), "available_bytes": found["avail"],
            "present_bytes": found["present"], "needed_bytes": needed,
            "checkpoint_size_bytes": settings.checkpoint_size_bytes, "margin_bytes": settings.disk_margin_bytes}
    evidence = "%s (on %s): %s free; needs %s (checkpoint %s - %s already there + margin %s)." % (
        found["probed"], found.get("mount") or "?", human_bytes(found["avail"]), human_bytes(needed),
        human_bytes(settings.checkpoint_size_bytes), human_bytes(found["present"]),
        human_bytes(settings.disk_margin_bytes))
    if found["avail"] >= needed:
        return Check("disk", PASS, evidence, "", data)
    return Check("disk", FAIL, evidence,
                 "Free at least %s on %s, or point dgxspark_vllm_model_path at a local disk with room (each node "
                 "holds its own copy of the checkpoint)." % (human_bytes(needed - found["avail"]),
                                                             found.get("mount") or found["probed"]), data)


def memory_check(meminfo: str | None, floor: int) -> Check:
    if meminfo is None:
        return Check("memory", FAIL, "/proc/meminfo could not be read.", "Check the node (the probe reads /proc/meminfo).")
    try:
        available = parse_meminfo_available(meminfo)
    except PreflightError as exc:
        return Check("memory", FAIL, str(exc), "Run on a kernel that reports MemAvailable (3.14 or later).")
    data = {"mem_available_bytes": available, "floor_bytes": floor}
    evidence = "MemAvailable %s (%.1f GiB), floor %s." % (human_bytes(available), available / 2 ** 30, human_bytes(floor))
    if available >= floor:
        return Check("memory", PASS, evidence, "", data)
    return Check("memory", FAIL, evidence,
                 "Stop what uses memory on this node (other containers, downloads, desktop sessions) or drop the "
                 "page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`); on GB10 the GPU allocates from the same "
                 "memory, and vLLM claims gpu_memory_utilization of it at start.", data)


# --- decisions: Docker, GPU, RDMA ---------------------------------------------------------------------------

def docker_checks(probe: dict[str, Any], lab: bool) -> list[Check]:
    """``docker`` (the daemon answers) and ``gpu_runtime`` (an nvidia runtime or CDI GPU devices are known).

    Decided from ``docker info`` alone: read-only, no image needed (preflight runs before the image is
    pulled), and safe under --check. ``docker run --gpus all`` would start a container to prove the same.
    """
    fix_docker = ("Start Docker (`systemctl enable --now docker`) and check `docker info` as the user Ansible "
                  "becomes.")
    info: dict[str, Any] = {}
    problem = ""
    if _rc(probe) != 0:
        problem = _last_line(probe.get("stderr"), probe.get("msg"), probe.get("stdout")) or "rc %s" % _rc(probe)
    else:
        try:
            info = json.loads(str(probe.get("stdout") or ""))
        except ValueError:
            problem = "`docker info` did not print JSON"
        if not isinstance(info, dict):
            info, problem = {}, "`docker info` did not print a JSON object"
        errors = info.get("ServerErrors") or []
        if errors:
            problem = "; ".join(str(e) for e in errors)
    if problem:
        checks = [Check("docker", FAIL, "Docker is not usable: %s." % problem, fix_docker)]
        checks.append(Check("gpu_runtime", SKIPPED, "Docker does not answer, so its runtimes are unknown."
                            + (" (dgxspark_vllm_lab: the lab has no GPU.)" if lab else "")))
        return checks
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = sorted(str(d.get("ID")) for d in info.get("DiscoveredDevices") or ()
                 if isinstance(d, dict) and str(d.get("ID", "")).startswith("nvidia.com/gpu"))
    default = info.get("DefaultRuntime") or ""
    checks = [Check("docker", PASS, "Docker %s answers (storage %s, cgroup %s)." % (
        info.get("ServerVersion", "?"), info.get("Driver", "?"), info.get("CgroupVersion", "?")), "",
        {"server_version": info.get("ServerVersion")})]
    evidence = "runtimes %s (default %s)%s" % (", ".join(runtimes) or "none", default or "?",
                                               ", CDI devices %s" % ", ".join(cdi) if cdi else "")
    data = {"runtimes": runtimes, "default_runtime": default, "cdi_devices": cdi}
    if lab:
        checks.append(Check("gpu_runtime", SKIPPED, "dgxspark_vllm_lab: the lab has no GPU (%s)." % evidence, "", data))
    elif "nvidia" in runtimes or cdi:
        checks.append(Check("gpu_runtime", PASS, "Docker knows the NVIDIA GPUs: %s." % evidence, "", data))
    else:
        checks.append(Check("gpu_runtime", FAIL, "Docker has no NVIDIA runtime and no CDI GPU device: %s." % evidence,
                            "Install the NVIDIA Container Toolkit and register it: `nvidia-ctk runtime configure "
                            "--runtime=docker && systemctl restart docker` (DGX OS ships it configured).", data))
    return checks


def gpu_check(probe: dict[str, Any], settings: Settings) -> Check:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total``: a GB10 expected, anything else warns."""
    if _rc(probe) != 0:
        why = "nvidia-smi is not installed (it could not be run)" if _not_found(probe) else "nvidia-smi failed (rc %s): %s" % (
            _rc(probe), _last_line(probe.get("stderr"), probe.get("stdout"), probe.get("msg")))
        if settings.lab:
            return Check("gpu", SKIPPED, "%s (dgxspark_vllm_lab: the lab has no GPU)." % why)
        return Check("gpu", FAIL, why + ".",
                     "Install/repair the NVIDIA driver (DGX OS ships it); `nvidia-smi` must list the GB10.")
    gpus = parse_gpu_query(str(probe.get("stdout") or ""))
    listing = "; ".join("%s, driver %s, memory %s" % (g["name"], g["driver_version"], g["memory_total"]) for g in gpus)
    data = {"gpus": gpus}
    if not gpus:
        return Check("gpu", FAIL, "nvidia-smi lists no GPU.", "Check the driver: `nvidia-smi` must list the GB10.", data)
    if all(settings.expected_gpu in g["name"] for g in gpus):
        return Check("gpu", PASS, listing + ".", "", data)
    return Check("gpu", WARN, "%s: not the expected %s." % (listing, settings.expected_gpu),
                 "This collection's profiles are built for DGX Spark (%s); other GPUs may need other settings."
                 % settings.expected_gpu, data)


def arch_check(arch: str | None, settings: Settings) -> Check:
    arch = (arch or "").strip()
    if settings.lab:
        return Check("arch", SKIPPED, "%s (dgxspark_vllm_lab: the lab is not a Spark)." % (arch or "unknown"), "",
                     {"arch": arch})
    if arch == settings.expected_arch:
        return Check("arch", PASS, arch + ".", "", {"arch": arch})
    return Check("arch", WARN, "%s, not %s." % (arch or "unknown", settings.expected_arch),
                 "The recipe's image is built for DGX Spark (%s)." % settings.expected_arch, {"arch": arch})


def _uses_gpu(container: dict[str, Any]) -> bool:
    host = container.get("HostConfig") or {}
    for request in host.get("DeviceRequests") or ():
        caps = [c for group in request.get("Capabilities") or () for c in group or ()]
        if request.get("Driver") == "nvidia" or "gpu" in caps:
            return True
    if host.get("Runtime") == "nvidia":
        return True
    return any(str(d.get("PathOnHost", "")).startswith("/dev/nvidia") for d in host.get("Devices") or ())


def gpu_holders_check(containers: list[dict[str, Any]], apps_probe: dict[str, Any] | None,
                      own_pids: frozenset[int], settings: Settings) -> Check:
    """No running container other than ours asks for the GPU, and no process outside ours computes on it."""
    foreign = sorted(str(c.get("Name", "")).lstrip("/") for c in containers
                     if (c.get("State") or {}).get("Running", True)
                     and str(c.get("Name", "")).lstrip("/") != settings.container_name and _uses_gpu(c))
    apps: list[dict[str, Any]] = []
    apps_note = ""
    if apps_probe is None:
        apps_note = "compute apps not read"
    elif _rc(apps_probe) != 0:
        apps_note = "nvidia-smi absent (lab): compute apps not read" if settings.lab else \
            "compute apps unreadable (%s)" % (_last_line(apps_probe.get("stderr"), apps_probe.get("msg")) or "rc %s"
                                              % _rc(apps_probe))
    else:
        apps = [a for a in parse_compute_apps(str(apps_probe.get("stdout") or "")) if a["pid"] not in own_pids]
    data = {"foreign_containers": foreign, "foreign_processes": apps}
    parts = []
    if foreign:
        parts.append("containers with GPU access: %s" % ", ".join(foreign))
    if apps:
        procs = ", ".join("%s (pid %d, %s)" % (a["process_name"], a["pid"], a["used_memory"]) for a in apps)
        parts.append("processes on the GPU: %s" % procs)
    if parts:
        return Check("gpu_free", FAIL, "The GPU is in use by something other than %s: %s." % (
            settings.container_name, "; ".join(parts)),
            "Stop them (`docker stop <name>`, or end the process): the serve needs the whole GB10, and its "
            "memory is the host's.", data)
    evidence = "No other container requests the GPU%s." % ("; " + apps_note if apps_note else
                                                           " and no other process computes on it")
    if apps_note and not settings.lab and apps_probe is not None:
        return Check("gpu_free", WARN, evidence, "Make `nvidia-smi --query-compute-apps=pid --format=csv` work.", data)
    return Check("gpu_free", PASS, evidence, "", data)


def rdma_checks(result: dict[str, Any] | None, settings: Settings, iface: str | None,
                pinned_hca: str, pinned_gid: Any) -> tuple[list[Check], dict[str, Any]]:
    """rdma_link_info's result -> checks, and the detected HCA list and GID index (None when unknown)."""
    detected: dict[str, Any] = {"ib_hca": "", "gid_index": None}
    if settings.rdma_skip:
        return [Check("rdma", SKIPPED, "preflight_rdma_skip is true (lab only): HCA and GID index not detected.")], \
            detected
    if result is None:
        return [], detected
    if "problems" not in result:
        return [Check("rdma", FAIL, "rdma_link_info failed: %s" % (result.get("msg") or "no result"),
                      "Point preflight_sysfs_root at the node's sysfs (/sys; in the lab the recorded tree at "
                      "/var/lib/dgxspark-lab/sysfs).")], detected
    checks: list[Check] = []
    socket_ifname = result.get("socket_ifname")
    data = {k: result.get(k) for k in ("hca", "port", "gid_index", "ib_hca", "socket_ifname", "mtu", "speed_mbps")}
    for problem in result.get("problems") or ():
        if problem.get("check") == "mtu" and socket_ifname and socket_ifname == iface:
            continue  # cx7_mtu reports this interface's MTU, across nodes
        status = FAIL if problem.get("severity") == "error" else WARN
        fix = str(problem.get("fix") or "")
        if problem.get("check") == "no_hca" and settings.lab:
            fix += " In the lab, set preflight_sysfs_root to the recorded tree (/var/lib/dgxspark-lab/sysfs)."
        checks.append(Check("rdma.%s" % problem.get("check"), status, str(problem.get("message") or ""), fix, data))
    if result.get("gid_index") is not None:
        detected = {"ib_hca": str(result.get("ib_hca") or ""), "gid_index": int(result["gid_index"])}
    if not any(c.status == FAIL for c in checks) and detected["gid_index"] is not None:
        checks.insert(0, Check("rdma", PASS, "%s port %s carries %s as RoCE v2 GID index %s; NCCL_IB_HCA=%s." % (
            result.get("hca"), result.get("port"), socket_ifname, result.get("gid_index"), result.get("ib_hca")),
            "", data))
    if socket_ifname and iface and socket_ifname != iface:
        checks.append(Check("rdma.netdev", FAIL, "The RoCE GID of the CX7 IP is on %s, but the CX7 interface is %s."
                            % (socket_ifname, iface),
                            "Make dgxspark_vllm_cx7_iface (or the address) and the RDMA netdev agree "
                            "(`ibdev2netdev`).", data))
    if pinned_gid not in (None, "") and detected["gid_index"] is not None and int(pinned_gid) != detected["gid_index"]:
        checks.append(Check("pin.gid_index", FAIL, "dgxspark_vllm_gid_index is %s in the inventory, but this node's "
                            "RoCE v2 GID for its CX7 IP is at index %s." % (pinned_gid, detected["gid_index"]),
                            "Remove dgxspark_vllm_gid_index (the detected value is used) or set it to %s for this "
                            "node: the index differs per node and moves after reboots." % detected["gid_index"]))
    if pinned_hca and detected["ib_hca"] and set(pinned_hca.split(",")) != set(detected["ib_hca"].split(",")):
        checks.append(Check("pin.ib_hca", WARN, "dgxspark_vllm_ib_hca is %s in the inventory; detected %s." % (
            pinned_hca, detected["ib_hca"]),
            "Remove dgxspark_vllm_ib_hca to use the detected HCAs (both CX7 twins give the full link)."))
    return checks, detected


# --- decisions: who can reach the API, who can read the secrets ---------------------------------------------

# The EXL3 kit's start.sh starts the head with --host 0.0.0.0 whatever the settings say (docs/exl3-kit.md,
# launch_cluster): the collection cannot narrow it.
KIT_HOST = "0.0.0.0"


@dataclass(frozen=True)
class Exposure:
    """What decides who can use the API, from the dgxspark_vllm_config fact: where it listens (``host``, the
    render's ``settings.host``, and where that value came from), the launcher, whether an API key is set, whether
    one is required, the firewall and the networks it admits to the API port (empty: the nodes' management
    networks)."""

    host: str = ""
    host_source: str = ""
    launcher: str = "docker_run"
    api_key_set: bool = False
    require_api_key: bool = False
    firewall: bool = True
    api_allowed_cidrs: tuple[str, ...] = ()


def _is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (and ::ffff:127.x.y.z, and the name localhost); anything else listens beyond the node."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _listen(exposure: Exposure, port: int) -> tuple[str, str, bool]:
    """(host, the API's address and where its host comes from, on loopback only)."""
    if exposure.launcher == "exl3_kit":
        host, source = KIT_HOST, "the EXL3 kit's start.sh binds it, whatever the settings say"
    else:
        host = str(exposure.host or "").strip()
        source = "settings.host" + (", from %s" % exposure.host_source if exposure.host_source else "")
        if not host:
            source = "settings.host unset: vLLM's default"
    shown = "[%s]" % host.strip("[]") if ":" in host else host or "*"
    where = "%s:%d" % (shown, port)
    try:
        every = ipaddress.ip_address(host.strip("[]")).is_unspecified if host else True
    except ValueError:
        every = False
    return host, "%s (%s%s)" % (where, "every interface; " if every else "", source), _is_loopback(host)


def listens_beyond_loopback(launcher: str, host: Any) -> bool:
    """Whether the API answers beyond the head: any host but loopback, vLLM's default (unset: every interface),
    and the EXL3 kit, which binds 0.0.0.0 whatever the settings say."""
    return not _listen(Exposure(host=str(host or ""), launcher=launcher), 0)[2]


def _firewall_text(exposure: Exposure, port: int) -> str:
    if not exposure.firewall:
        return ("the firewall is off (dgxspark_vllm_firewall: false), so every network that reaches the head reaches "
                "port %d" % port)
    networks = ", ".join(exposure.api_allowed_cidrs) if exposure.api_allowed_cidrs else (
        "the controller's address (dgxspark_vllm_api_allowed_cidrs unset)")
    return "the collection's firewall (dgxspark_vllm_firewall) admits port %d only from %s and the nodes" % (
        port, networks)


def api_exposure_check(exposure: Exposure, port: int) -> Check:
    """Decided once for the cluster (the head serves the API): loopback, or beyond it with a key, passes; beyond
    loopback without a key warns, and fails with dgxspark_vllm_require_api_key."""
    host, where, loopback = _listen(exposure, port)
    data = {"host": host, "port": port, "loopback": loopback, "launcher": exposure.launcher,
            "api_key_set": exposure.api_key_set, "require_api_key": exposure.require_api_key,
            "firewall": exposure.firewall, "api_allowed_cidrs": list(exposure.api_allowed_cidrs)}
    if loopback:
        return Check("api_exposure", PASS, "The API listens on %s: loopback only, nothing beyond the head reaches "
                     "it." % where, "", data)
    firewall = _firewall_text(exposure, port)
    if exposure.api_key_set:
        return Check("api_exposure", PASS, "The API listens on %s and answers /v1 requests only with the API key; "
                     "its other routes (/health, /metrics, /version, /tokenize) answer without it, to whoever "
                     "reaches the port: %s." % (where, firewall), "", data)
    evidence = ("The API listens on %s without an API key (dgxspark_vllm_api_key is unset): %s, and whoever reaches "
                "it can use the model." % (where, firewall))
    narrow = "" if exposure.launcher == "exl3_kit" else (
        " Or, when nothing beyond the head needs the API, serve on loopback: dgxspark_vllm_settings: "
        "{host: 127.0.0.1}.")
    key = ("Set dgxspark_vllm_api_key (from a vault), or leave it unset for the key the collection generates on "
           "the head (dgxspark_vllm_api_key_file): vLLM then answers /v1 requests only with the key (its other "
           "routes, /health and /metrics among them, stay open to whoever the firewall admits), and every request "
           "of the collection carries it.")
    if exposure.require_api_key:
        return Check("api_exposure", FAIL, evidence + " dgxspark_vllm_require_api_key is true, so an API without a "
                     "key is refused.", key + narrow + " Or set dgxspark_vllm_require_api_key: false to accept an "
                     "open API (a warning then).", data)
    return Check("api_exposure", WARN, evidence, key + narrow + " dgxspark_vllm_require_api_key: true makes this "
                 "an error.", data)


# Run as `bash -c SECRET_FILES_PROBE dgxspark-secret-files PATH...` (roles/preflight/tasks/probe.yml carries it
# verbatim, a unit test keeps the two equal). Each PATH may be a glob (/run/dgxspark/hf-token*). Only reads
# metadata: prints `pattern<TAB>PATH` for each argument, then `file<TAB>mode<TAB>owner<TAB>group<TAB>type<TAB>path`
# for each file it names (symlinks followed), or `error<TAB>path<TAB>stat's message`.
SECRET_FILES_PROBE = r"""export LC_ALL=C
shopt -s nullglob
IFS=
for pattern in "$@"; do
  printf 'pattern\t%s\n' "$pattern"
  for path in $pattern; do
    if found=$(stat -L --printf '%a\t%U\t%G\t%F' -- "$path" 2>&1); then
      printf 'file\t%s\t%s\n' "$found" "$path"
    else
      printf 'error\t%s\t%s\n' "$path" "${found//$'\n'/ }"
    fi
  done
done
"""
_ABSENT_ERRORS = ("No such file or directory", "Not a directory")


@dataclass(frozen=True)
class SecretFile:
    """One file a secret path names: its permission bits (None when stat failed), owner, group and type."""

    path: str
    mode: int | None = None
    owner: str = ""
    group: str = ""
    kind: str = ""
    error: str = ""

    @property
    def absent(self) -> bool:
        return self.mode is None and any(text in self.error for text in _ABSENT_ERRORS)

    @property
    def regular(self) -> bool:
        return self.kind.startswith("regular")

    @property
    def readers(self) -> str:
        """Who beyond the owner may read it: "group", "others", "group and others" or ""."""
        if self.mode is None:
            return ""
        return " and ".join(who for who, bit in (("group", 0o040), ("others", 0o004)) if self.mode & bit)

    def describe(self) -> str:
        return "%s (mode %04o, %s:%s)" % (self.path, self.mode or 0, self.owner or "?", self.group or "?")


def parse_secret_files(text: str) -> list[tuple[str, list[SecretFile]]]:
    """SECRET_FILES_PROBE's output -> each path or glob asked for, with the files it names (a glob that matches
    nothing names none; a path that is not there names one, absent)."""
    found: list[tuple[str, list[SecretFile]]] = []
    for line in text.splitlines():
        kind, _sep, rest = line.partition("\t")
        if kind == "pattern":
            found.append((rest, []))
            continue
        if kind not in ("file", "error"):
            continue
        if not found:
            raise PreflightError("the secret-file probe printed a file before any path: %r" % line)
        if kind == "file":
            parts = rest.split("\t", 4)
            if len(parts) != 5 or not re.match(r"^[0-7]{1,4}$", parts[0]):
                raise PreflightError("the secret-file probe printed an unreadable line: %r" % line)
            found[-1][1].append(SecretFile(parts[4], int(parts[0], 8), parts[1], parts[2], parts[3]))
        else:
            path, _sep, message = rest.partition("\t")
            found[-1][1].append(SecretFile(path, error=message.strip()))
    return found


def secret_files_check(probe: dict[str, Any]) -> Check:
    """Every file that may hold the HF token or the API key (preflight_secret_paths) that exists is readable by its
    owner only: group or others reading one fails, with `chmod 600`; a file not there passes."""
    if _rc(probe) != 0:
        return Check("secret_files", WARN, "The probe of the files that may hold the HF token or the API key failed "
                     "(rc %s): %s" % (_rc(probe), _last_line(probe.get("stderr"), probe.get("msg"))),
                     "Make `bash` and `stat` (coreutils) work on the node; preflight runs them read-only.")
    try:
        found = parse_secret_files(str(probe.get("stdout") or ""))
    except PreflightError as exc:
        return Check("secret_files", WARN, str(exc), "Make `stat --printf` (GNU coreutils) work on the node.")
    files = [f for _pattern, named in found for f in named]
    regular = [f for f in files if f.mode is not None and f.regular]
    other = [f for f in files if f.mode is not None and not f.regular]
    exposed = [f for f in regular if f.readers]
    unknown = [f for f in files if f.mode is None and not f.absent]
    missing = [pattern for pattern, named in found if all(f.absent for f in named)]
    data = {"patterns": [pattern for pattern, _named in found],
            "files": [{"path": f.path, "mode": "%04o" % (f.mode or 0), "owner": f.owner, "group": f.group,
                       "type": f.kind, "readable_by": f.readers} for f in regular + other],
            "absent": missing, "errors": [{"path": f.path, "error": f.error} for f in unknown]}
    if exposed:
        return Check("secret_files", FAIL, "%s: it may hold the HF token or the API key." % "; ".join(
            "%s is readable by %s" % (f.describe(), f.readers) for f in exposed),
            "`chmod 600 %s` on this node: its owner keeps reading it (the collection hands the token and the key "
            "to the containers through their environment, not through these files)."
            % " ".join(shlex.quote(f.path) for f in exposed), data)
    if unknown:
        return Check("secret_files", WARN, "The mode of %s could not be read." % "; ".join(
            "%s (%s)" % (f.path, f.error) for f in unknown),
            "Run preflight with become (root): these files may belong to root or to the kit user.", data)
    parts = []
    if regular:
        parts.append("owner only: %s" % ", ".join(f.describe() for f in regular))
    if other:
        parts.append("not a regular file, not judged: %s" % ", ".join("%s (%s)" % (f.path, f.kind) for f in other))
    if missing:
        parts.append("not there: %s" % ", ".join(missing))
    return Check("secret_files", PASS, "No file that may hold the HF token or the API key is readable by group or "
                 "others (%s)." % ("; ".join(parts) or "no path to check"), "", data)


# --- the whole run ------------------------------------------------------------------------------------------

def _node_checks(node: dict[str, Any], settings: Settings, decision: InterfaceDecision | None) -> tuple[
        list[Check], dict[str, Any]]:
    name = str(node["name"])
    checks: list[Check] = []
    detected: dict[str, Any] = {"cx7_iface": decision.detected.name if decision and decision.detected else "",
                                "ib_hca": "", "gid_index": None}
    iface = decision.effective.name if decision and decision.effective else None
    if decision is not None:
        checks.extend(decision.checks)
    if "rdma" in node or settings.rdma_skip:
        rdma, found = rdma_checks(node.get("rdma"), settings, iface, str(node.get("ib_hca") or ""),
                                  node.get("gid_index"))
        checks.extend(rdma)
        detected.update(found)
    if node.get("pings") is not None:
        checks.extend(ping_checks(name, list(node["pings"]), iface, settings.cx7_subnet))
    listeners = _probe(node, "listeners")
    own = _probe(node, "own_pids")
    own_pids = parse_pids(str(own.get("stdout") or "")) if own and _rc(own) == 0 else frozenset()
    if listeners is not None:
        if _rc(listeners) != 0:
            why = _last_line(listeners.get("stderr"), listeners.get("msg"))
            checks.append(Check("ports", FAIL, "`ss -Hltnp` failed: %s" % why, "Install iproute2 (ss) on the node."))
        else:
            checks.extend(port_checks(parse_ss_listeners(str(listeners.get("stdout") or "")), own_pids, settings,
                                      node.get("role") == "head"))
    disk = _probe(node, "disk")
    if disk is not None:
        checks.append(disk_check(disk, settings))
    if "meminfo" in node:
        checks.append(memory_check(node.get("meminfo"), settings.mem_available_floor_bytes))
    docker = _probe(node, "docker_info")
    if docker is not None:
        checks.extend(docker_checks(docker, settings.lab))
    gpu = _probe(node, "gpu")
    if gpu is not None:
        checks.append(gpu_check(gpu, settings))
    if "arch" in node:
        checks.append(arch_check(node.get("arch"), settings))
    containers = _probe(node, "containers")
    if containers is not None:
        try:
            inspected = parse_docker_inspect(str(containers.get("stdout") or "")) if _rc(containers) in (0, None) else []
        except PreflightError as exc:
            checks.append(Check("gpu_free", FAIL, str(exc), "Check `docker inspect` on the node."))
        else:
            checks.append(gpu_holders_check(inspected, _probe(node, "compute_apps"), own_pids, settings))
    secrets = _probe(node, "secret_files")
    if secrets is not None:
        checks.append(secret_files_check(secrets))
    return checks, detected


def node_report(name: str, role: str, checks: list[Check], detected: dict[str, Any],
                configured: dict[str, Any]) -> dict[str, Any]:
    """The JSON report of one node."""
    counts = {status: sum(1 for c in checks if c.status == status) for status in STATUSES}
    effective = {
        "cx7_iface": configured.get("cx7_iface") or detected.get("cx7_iface") or "",
        "ib_hca": configured.get("ib_hca") or detected.get("ib_hca") or "",
        "gid_index": configured.get("gid_index") if configured.get("gid_index") not in (None, "")
        else detected.get("gid_index"),
    }
    return {"schema": REPORT_SCHEMA, "node": name, "role": role, "ok": counts[FAIL] == 0, "counts": counts,
            "detected": dict(detected), "configured": dict(configured), "effective": effective,
            "checks": [c.to_dict() for c in checks]}


def evaluate(nodes: list[dict[str, Any]], settings: Settings, exposure: Exposure | None = None) -> dict[str, Any]:
    """Every node's checks (plus the cross-node MTU agreement) -> reports, failures, summary, ok.

    With ``exposure``, the cluster-wide ``api_exposure`` check is decided once and reported on the head (the node
    whose role is head, else the first node): the head is the rank that serves the API.
    """
    settings.validate()
    if not nodes:
        raise PreflightError("no nodes given")
    names = [str(n.get("name") or "") for n in nodes if isinstance(n, dict)]
    if len(names) != len(nodes) or not all(names):
        raise PreflightError("every node needs a name")
    if len(set(names)) != len(names):
        raise PreflightError("node names repeat: %s" % ", ".join(names))
    for node in nodes:
        pinned = node.get("gid_index")
        if pinned not in (None, "") and (isinstance(pinned, bool) or not str(pinned).strip().isdigit()):
            raise PreflightError("node %s: dgxspark_vllm_gid_index %r is not a GID index (a whole number)" % (
                node["name"], pinned))
    decisions: dict[str, InterfaceDecision | None] = {}
    for node in nodes:
        if node.get("ip_addr") is None:
            decisions[node["name"]] = None
            continue
        try:
            links = parse_ip_addr_json(str(node["ip_addr"]))
        except PreflightError as exc:
            decisions[node["name"]] = InterfaceDecision((Check("cx7_interface", FAIL, str(exc),
                                                               "Install iproute2 with JSON output (`ip -j`)."),),
                                                        None, None)
            continue
        decisions[node["name"]] = decide_interface(links, str(node.get("cx7_ip") or ""), settings.cx7_subnet,
                                                   str(node.get("cx7_iface") or ""))
    mtus = {name: ((d.effective.name, d.effective.mtu) if d.effective else (None, None))
            for name, d in decisions.items() if d is not None}
    mtu = mtu_checks(mtus, settings.min_mtu) if mtus else {}

    serving = next((n["name"] for n in nodes if n.get("role") == "head"), nodes[0]["name"])
    exposed = api_exposure_check(exposure, settings.api_port) if exposure is not None else None

    reports: dict[str, Any] = {}
    for node in nodes:
        name = node["name"]
        checks, detected = _node_checks(node, settings, decisions[name])
        if name in mtu:
            index = next((i + 1 for i, c in enumerate(checks) if c.name == "cx7_interface"), len(checks))
            checks.insert(index, mtu[name])
        if exposed is not None and name == serving:
            checks.append(exposed)
        pinned_gid = node.get("gid_index")
        configured = {"cx7_iface": str(node.get("cx7_iface") or ""), "ib_hca": str(node.get("ib_hca") or ""),
                      "gid_index": None if pinned_gid in (None, "") else int(pinned_gid)}
        reports[name] = node_report(name, str(node.get("role") or ""), checks, detected, configured)
    failures = [{"node": name, "name": c["name"], "evidence": c["evidence"], "fix": c["fix"]}
                for name, report in reports.items() for c in report["checks"] if c["status"] == FAIL]
    return {"ok": not failures, "reports": reports, "failures": failures,
            "detected": {name: report["detected"] for name, report in reports.items()},
            "summary": summary_text(reports), "message": failure_text(failures)}


_MARK = {PASS: "PASS", FAIL: "FAIL", WARN: "WARN", SKIPPED: "SKIP"}


def summary_text(reports: dict[str, Any]) -> str:
    """One line per check, grouped by node; warnings and failures carry their fix."""
    lines = []
    total = {status: sum(r["counts"][status] for r in reports.values()) for status in STATUSES}
    lines.append("preflight: %d node(s), %d passed, %d failed, %d warnings, %d skipped" % (
        len(reports), total[PASS], total[FAIL], total[WARN], total[SKIPPED]))
    for name, report in reports.items():
        eff = report["effective"]
        lines.append("%s (%s): CX7 %s, NCCL_IB_HCA %s, GID index %s" % (
            name, report["role"] or "?", eff["cx7_iface"] or "-", eff["ib_hca"] or "-",
            "-" if eff["gid_index"] is None else eff["gid_index"]))
        for check in report["checks"]:
            lines.append("  %s %-16s %s" % (_MARK[check["status"]], check["name"], check["evidence"]))
            if check["status"] in (FAIL, WARN) and check["fix"]:
                lines.append("       %-16s fix: %s" % ("", check["fix"]))
    return "\n".join(lines)


def failure_text(failures: list[dict[str, Any]]) -> str:
    """Every failed check on every node, with its fix; empty when nothing failed."""
    if not failures:
        return ""
    nodes = sorted({f["node"] for f in failures})
    lines = ["Preflight failed: %d check(s) on %d node(s) (%s). Nothing was pulled, staged or started." % (
        len(failures), len(nodes), ", ".join(nodes))]
    for failure in failures:
        lines.append("- %s %s: %s" % (failure["node"], failure["name"], failure["evidence"]))
        lines.append("  fix: %s" % failure["fix"])
    return "\n".join(lines)
