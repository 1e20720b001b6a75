# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may reach which port of a node: the nftables ruleset the collection applies, as text.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports.

The recipe serves with ``--network host`` on ``0.0.0.0:<port>``, and the ranks talk over the master port and the
ephemeral ports gloo and NCCL open on the CX7 link. The ruleset (one table of its own, ``inet dgxspark``, so that
nothing else on the node is touched and removing it is one command) says:

- the API port only from ``api_cidrs``: the networks the user lists (``dgxspark_vllm_api_allowed_cidrs``), the
  controller's own address (where Ansible's SSH connections to the nodes come from) and the nodes themselves;
- everything arriving on the CX7 interface only from the other nodes' CX7 IPs (the master port, gloo, NCCL);
- nothing for this node's CX7 addresses arriving on any other interface: Linux accepts a packet for any of its
  addresses on any interface, so a host of the management LAN that routes the CX7 subnet through a node's
  management address would otherwise reach every engine port bound to the CX7 address (vLLM's ZMQ and
  torch.distributed ports, which speak serialized Python objects);
- the master port from nowhere else (not from the management LAN);
- on the head, the group guard's metrics port (``dgxspark_vllm_guard_metrics_port``, while the guard is on) only from
  ``api_cidrs``, as the API: a Prometheus that may scrape the engine may scrape the guard, no other LAN host.

Everything else keeps the node's own policy: the table's chain accepts what it does not name, so SSH and the
node's other services are not this collection's business. The text replaces the table atomically: ``nft -f``
applies a file as one transaction, and the file first creates the table (a no-op when it exists), deletes it,
then defines it again.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

TABLE = "dgxspark"
"""The collection's own nftables table (family inet)."""

_IFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


class FirewallError(ValueError):
    """Inputs that cannot make a ruleset; the message names the variable to fix."""


@dataclass(frozen=True)
class Rules:
    """What one node's ruleset allows."""

    cx7_iface: str
    peers: tuple[str, ...]          # the other nodes' CX7 IPs
    api_port: int
    master_port: int
    api_cidrs: tuple[str, ...]      # networks the API answers (IPv4 and IPv6)
    own: tuple[str, ...] = ()       # this node's addresses on its CX7 interface (reached only over that interface)
    metrics_port: int = 0           # the guard's metrics port (the head, the guard on; 0: none), from api_cidrs only


def _network(where: str, value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError as exc:
        raise FirewallError(f"{where}: {value!r} is not an address or a network (e.g. 192.168.1.0/24)") from exc


def api_cidrs(given: Sequence[str] | None, controller: Sequence[str] = ()) -> tuple[str, ...]:
    """The networks the API answers besides the nodes: the given ones (dgxspark_vllm_api_allowed_cidrs) and the
    controller's own addresses (each alone, /32 or /128). Normalised (host bits cleared), deduplicated, in order; a
    controller address inside a given network adds nothing."""
    out: list[str] = []
    for source, values in (("dgxspark_vllm_api_allowed_cidrs", list(given or ())),
                           ("the controller's address", list(controller))):
        for value in values:
            network = _network(source, value)
            if source != "dgxspark_vllm_api_allowed_cidrs" and network.num_addresses != 1:
                raise FirewallError(f"{source}: {value!r} is not one address")
            if any(network.subnet_of(ipaddress.ip_network(known)) for known in out   # type: ignore[arg-type]
                   if ipaddress.ip_network(known).version == network.version):
                continue
            out.append(str(network))
    return tuple(out)


def controller_address(ssh_connection: str) -> str:
    """The controller's address as a node sees it: the first field of the SSH session's SSH_CONNECTION
    (``client_ip client_port server_ip server_port``); '' when the node was not reached over SSH."""
    fields = str(ssh_connection or "").split()
    if len(fields) != 4:
        return ""
    try:
        return str(ipaddress.ip_address(fields[0].split("%")[0]))
    except ValueError:
        return ""


def rules(cx7_iface: str, own_cx7_ip: str, cx7_ips: Sequence[str], api_port: int, master_port: int,
          cidrs: Sequence[str], own_addresses: Sequence[str] = (), metrics_port: int = 0) -> Rules:
    """One node's rules; raises FirewallError naming what is wrong. `own_addresses`: every address of the node's CX7
    interface (its CX7 IP is always one of them); `metrics_port`: the guard's, admitted like the API (0: none)."""
    if not isinstance(cx7_iface, str) or not _IFACE.match(cx7_iface):
        raise FirewallError(f"the CX7 interface {cx7_iface!r} is not an interface name")
    for name, port in (("dgxspark_vllm_port", api_port), ("dgxspark_vllm_master_port", master_port)):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise FirewallError(f"{name} must be a port number (1-65535), got {port!r}")
    if api_port == master_port:
        raise FirewallError(f"dgxspark_vllm_port and dgxspark_vllm_master_port are both {api_port}")
    if isinstance(metrics_port, bool) or not isinstance(metrics_port, int) or not 0 <= metrics_port <= 65535:
        raise FirewallError(f"dgxspark_vllm_guard_metrics_port must be a port number or 0, got {metrics_port!r}")
    if metrics_port in (api_port, master_port):
        raise FirewallError(f"dgxspark_vllm_guard_metrics_port is {metrics_port}, the port of the API or the master")
    own = str(ipaddress.ip_address(own_cx7_ip))
    peers: list[str] = []
    for ip in cx7_ips:
        text = str(_network("dgxspark_vllm_cx7_ip", ip).network_address)
        if text != own and text not in peers:
            peers.append(text)
    if not peers:
        raise FirewallError(f"no other node's CX7 IP besides {own}: the ranks could not reach each other")
    for cidr in cidrs:
        _network("dgxspark_vllm_api_allowed_cidrs", cidr)
    mine = [own]
    for address in own_addresses:
        text = str(ipaddress.ip_address(address))
        if text not in mine:
            mine.append(text)
    return Rules(cx7_iface, tuple(peers), api_port, master_port, tuple(cidrs), tuple(mine), metrics_port)


def _elements(values: Sequence[str]) -> str:
    return ", ".join(values)


def ruleset(r: Rules, table: str = TABLE) -> str:
    """The nftables file that replaces the table with r, in one transaction."""
    v4 = [c for c in r.api_cidrs if ipaddress.ip_network(c).version == 4]
    v6 = [c for c in r.api_cidrs if ipaddress.ip_network(c).version == 6]
    peers4 = [p for p in r.peers if ipaddress.ip_address(p).version == 4]
    peers6 = [p for p in r.peers if ipaddress.ip_address(p).version == 6]
    own4 = [a for a in r.own if ipaddress.ip_address(a).version == 4]
    own6 = [a for a in r.own if ipaddress.ip_address(a).version == 6]
    lines = [
        "# Written by the dgxspark.vllm collection (role firewall): who may reach the serve ports of this node.",
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
    ]
    for name, kind, values, interval in (("api_allowed4", "ipv4_addr", v4, True), ("api_allowed6", "ipv6_addr", v6, True),
                                         ("cx7_peers4", "ipv4_addr", peers4, False),
                                         ("cx7_peers6", "ipv6_addr", peers6, False),
                                         ("cx7_own4", "ipv4_addr", own4, False), ("cx7_own6", "ipv6_addr", own6, False)):
        lines.append(f"  set {name} {{")
        lines.append(f"    type {kind}")
        if interval:
            lines.append("    flags interval")
        if values:
            lines.append(f"    elements = {{ {_elements(values)} }}")
        lines.append("  }")
    lines += [
        "  chain input {",
        "    type filter hook input priority filter - 10; policy accept;",
        '    iifname "lo" accept',
        f'    iifname "{r.cx7_iface}" ip saddr @cx7_peers4 accept comment "the other ranks"',
        f'    iifname "{r.cx7_iface}" ip6 saddr @cx7_peers6 accept comment "the other ranks"',
        f'    iifname "{r.cx7_iface}" ct state established,related accept comment "answers to this node"',
        f'    iifname "{r.cx7_iface}" icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept',
        # a node this table does not know yet (a cluster grown from two nodes to four) must still answer the
        # preflight's ping on the link before the firewall step names it a peer: echo only, no port
        f'    iifname "{r.cx7_iface}" icmp type echo-request accept comment "ping on the link (the preflight)"',
        f'    iifname "{r.cx7_iface}" icmpv6 type echo-request accept comment "ping on the link (the preflight)"',
        f'    iifname "{r.cx7_iface}" counter drop comment "nothing else on the CX7 link"',
        f'    iifname != "{r.cx7_iface}" ip daddr @cx7_own4 counter drop comment "the CX7 addresses off the CX7 link"',
        f'    iifname != "{r.cx7_iface}" ip6 daddr @cx7_own6 counter drop comment "the CX7 addresses off the CX7 link"',
        f'    tcp dport {r.api_port} ip saddr @api_allowed4 accept comment "the API"',
        f'    tcp dport {r.api_port} ip6 saddr @api_allowed6 accept comment "the API"',
    ]
    if r.metrics_port:
        lines += [
            f'    tcp dport {r.metrics_port} ip saddr @api_allowed4 accept comment "the guard metrics"',
            f'    tcp dport {r.metrics_port} ip6 saddr @api_allowed6 accept comment "the guard metrics"',
            f'    tcp dport {r.metrics_port} counter reject with tcp reset comment "the guard metrics from elsewhere"',
        ]
    lines += [
        f'    tcp dport {{ {r.api_port}, {r.master_port} }} counter reject with tcp reset '
        'comment "the API from elsewhere, the master port off the CX7 link"',
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the cluster's plan

ARGUMENT_SPEC: dict = {
    "config": {"type": "dict", "required": True},
    "addresses": {"type": "dict", "required": True},
    "reached": {"type": "dict", "required": True},
    "controller": {"type": "dict", "default": {}},
    "routers": {"type": "list", "elements": "str", "default": []},
}
"""firewall_plan's options: the resolved configuration, per host its ``ip -j addr show`` (parsed), per host the
address Ansible reaches it on (resolved on the controller; "" when it could not be); the hosts of spark_router (the
action plugin hands plan() each one's ``ansible_host``, resolved the same way: where the router's requests come from)."""


def _addresses(listing: object) -> list[tuple[str, str, int]]:
    """(interface, address, prefix length) of every address in ``ip -j addr show``'s output."""
    out: list[tuple[str, str, int]] = []
    for link in listing if isinstance(listing, list) else []:
        if not isinstance(link, dict):
            continue
        for info in link.get("addr_info") or []:
            if isinstance(info, dict) and info.get("local") and isinstance(info.get("prefixlen"), int):
                out.append((str(link.get("ifname", "")), str(info["local"]), info["prefixlen"]))
    return out


def _same(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def plan(config: dict, addresses: dict, reached: dict, controller: dict | None = None,
         routers: dict | None = None) -> dict:
    """Every node's ruleset and what it allows; raises FirewallError naming what to fix. ``controller`` holds, per
    node, the SSH_CONNECTION Ansible's session on it had ('' when it was not reached over SSH); ``routers``, per host
    of spark_router, its address: the API answers each (the router's health checks and requests come from there)."""
    hosts = [config["head"]] + list(config["workers"])
    nodes = config["nodes"]
    problems: list[str] = []
    node_addresses: list[str] = []
    ifaces: dict[str, str] = {}
    for host in hosts:
        found = _addresses(addresses.get(host))
        if not found:
            problems.append(f"{host}: `ip -j addr show` gave no address")
            continue
        cx7_ip = str(nodes[host]["cx7_ip"])
        carrying = [iface for iface, local, _prefix in found if _same(local, cx7_ip)]
        given = nodes[host].get("cx7_iface") or ""
        if not carrying:
            problems.append(f"{host}: its dgxspark_vllm_cx7_ip {cx7_ip} is on no interface of the node (the preflight "
                            "names the CX7 port and its address)")
            continue
        if given and given not in carrying:
            problems.append(f"{host}: dgxspark_vllm_cx7_iface is {given}, but {cx7_ip} is on {carrying[0]}")
            continue
        ifaces[host] = given or carrying[0]
        address = str(reached.get(host) or "")
        mine = [(local, prefix) for _iface, local, prefix in found if address and _same(local, address)]
        if mine:
            node_addresses.append(str(ipaddress.ip_address(mine[0][0])))
    if problems:
        raise FirewallError("; ".join(problems))
    given_cidrs = list(config.get("api_allowed_cidrs") or [])
    controllers = list(dict.fromkeys(
        found for found in (controller_address((controller or {}).get(host, "")) for host in hosts)
        if found and found not in node_addresses))
    if not given_cidrs and not controllers:
        raise FirewallError(
            "the API would answer the nodes alone: dgxspark_vllm_api_allowed_cidrs is empty and the controller's "
            "address is not known (Ansible did not reach the nodes over SSH: a local or docker connection). Name "
            "the networks or addresses that may use the API in dgxspark_vllm_api_allowed_cidrs (e.g. "
            "[192.168.1.10/32]; the nodes themselves are always allowed)")
    router_addresses: list[str] = []
    for host, address in sorted((routers or {}).items()):
        if not address:
            problems.append(f"the router host {host}: its address could not be resolved (set its ansible_host to the "
                            "address its requests to the clusters come from)")
            continue
        try:
            router_addresses.append(str(ipaddress.ip_address(str(address).split("%", maxsplit=1)[0])))
        except ValueError:
            problems.append(f"the router host {host}: {address!r} is not an IP address")
    if problems:
        raise FirewallError("; ".join(problems))
    cidrs = list(api_cidrs(given_cidrs, [*controllers, *(a for a in router_addresses if a not in controllers)]))
    for address in node_addresses:   # the nodes themselves always may (the guard, status, verify from a node)
        if not any(ipaddress.ip_address(address) in ipaddress.ip_network(c) for c in cidrs):
            cidrs.append(str(ipaddress.ip_network(address)))
    cx7_ips = [str(nodes[host]["cx7_ip"]) for host in hosts]
    out = {}
    for host in hosts:
        on_cx7 = [local for iface, local, _prefix in _addresses(addresses.get(host)) if iface == ifaces[host]]
        metrics_port = int(config.get("guard_metrics_port") or 0) if host == config["head"] and config.get("guard") else 0
        r = rules(ifaces[host], str(nodes[host]["cx7_ip"]), cx7_ips, int(config["port"]), int(config["master_port"]),
                  cidrs, on_cx7, metrics_port)
        out[host] = {"ruleset": ruleset(r), "cx7_iface": ifaces[host], "peers": list(r.peers)}
    source = " and ".join(part for part in (
        "dgxspark_vllm_api_allowed_cidrs" if given_cidrs else "",
        f"the controller's address ({', '.join(controllers)})" if controllers else "",
        f"the router's ({', '.join(router_addresses)})" if router_addresses else "") if part)
    return {"nodes": out, "api_cidrs": cidrs, "controller": controllers, "routers": router_addresses, "source": source}


# ------------------------------------------------------------------------------------------------ the launch's check

def table_state(rc: int | None, out: str) -> dict:
    """What `nft list table inet dgxspark` said (rc None: nft is not installed): present when the table is there
    with its input chain."""
    if rc is None:
        return {"present": False, "why": "nft is not installed"}
    if rc != 0:
        return {"present": False, "why": "the table inet dgxspark is not loaded"}
    if "chain input" not in out:
        return {"present": False, "why": "the table inet dgxspark has no input chain"}
    return {"present": True, "why": ""}


def missing_nodes(order: Sequence[str], states: dict) -> list[str]:
    """The nodes, in `order`, whose read found no firewall table (a read that did not look counts as missing)."""
    return [name for name in order if not ((states.get(name) or {}).get("firewall") or {}).get("present")]


def launch_refusal(enabled: bool, order: Sequence[str], states: dict) -> str | None:
    """Why nothing may start: the firewall is on (dgxspark_vllm_firewall) but its table is not loaded on a node, so
    the engine's ports would answer the whole LAN. None when it is off or loaded everywhere."""
    if not enabled:
        return None
    missing = missing_nodes(order, states)
    if not missing:
        return None
    whys = "; ".join(f"{name}: {((states.get(name) or {}).get('firewall') or {}).get('why') or 'not read'}"
                     for name in missing)
    return (f"The firewall is on (dgxspark_vllm_firewall) but its table is not in place ({whys}): the engine's ports "
            "would answer the whole LAN. Apply it with playbooks/firewall.yml (or site.yml --tags firewall) and launch "
            "again, or set dgxspark_vllm_firewall: false to serve without it.")
