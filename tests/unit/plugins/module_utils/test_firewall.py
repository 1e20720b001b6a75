# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The firewall ruleset: who may reach the API, the master port and the CX7 link (plugins/module_utils/_firewall.py)."""
from __future__ import annotations

import shutil
from re import escape as re_escape
import subprocess

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import (
    FirewallError,
    api_cidrs,
    controller_address,
    plan,
    rules,
    ruleset,
)

LAB = dict(cx7_iface="enp1s0f1np1", own_cx7_ip="10.77.1.11", cx7_ips=["10.77.1.11", "10.77.1.12"], api_port=8000,
           master_port=29521, cidrs=("10.77.0.0/24",))


def _rules(**change):
    params = dict(LAB)
    params.update(change)
    return rules(**params)


@pytest.mark.parametrize("given, controller, expected", [
    (None, ["10.77.0.1"], ("10.77.0.1/32",)),                                # the controller alone, not its network
    (["192.168.1.20/23"], [], ("192.168.0.0/23",)),                          # host bits cleared
    (["10.0.0.5", "10.1.0.0/16", "10.0.0.5/32"], ["10.1.2.3"], ("10.0.0.5/32", "10.1.0.0/16")),  # held: nothing added
    (["fd00::/64"], ["10.77.0.1", "fd01::1"], ("fd00::/64", "10.77.0.1/32", "fd01::1/128")),
])
def test_the_api_answers_the_given_networks_and_the_controller(given, controller, expected):
    assert api_cidrs(given, controller) == expected


@pytest.mark.parametrize("given, controller, message", [
    (["10.0.0.0/33"], [], "dgxspark_vllm_api_allowed_cidrs: '10.0.0.0/33' is not an address or a network"),
    (None, ["lab-head"], "the controller's address: 'lab-head' is not an address or a network"),
    (None, ["10.77.0.0/24"], "the controller's address: '10.77.0.0/24' is not one address"),
])
def test_bad_networks_are_refused_naming_the_variable(given, controller, message):
    with pytest.raises(FirewallError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        api_cidrs(given, controller)


@pytest.mark.parametrize("session, expected", [
    ("10.77.0.1 52144 10.77.0.11 22", "10.77.0.1"),
    ("fe80::1%eth0 52144 fe80::2%eth0 22", "fe80::1"),
    ("", ""), ("10.77.0.1 52144", ""), ("not-an-address 1 2 3", ""),
])
def test_the_controller_address_is_the_ssh_sessions_client(session, expected):
    assert controller_address(session) == expected


def test_the_peers_are_the_other_nodes_cx7_ips():
    r = _rules(cx7_ips=["10.77.1.11", "10.77.1.12", "10.77.1.13", "10.77.1.12"])
    assert r.peers == ("10.77.1.12", "10.77.1.13")


@pytest.mark.parametrize("change, message", [
    ({"cx7_iface": "eth0; drop"}, "the CX7 interface 'eth0; drop' is not an interface name"),
    ({"cx7_iface": "a" * 16}, "is not an interface name"),
    ({"api_port": 0}, "dgxspark_vllm_port must be a port number (1-65535), got 0"),
    ({"master_port": True}, "dgxspark_vllm_master_port must be a port number (1-65535), got True"),
    ({"master_port": 8000}, "dgxspark_vllm_port and dgxspark_vllm_master_port are both 8000"),
    ({"cx7_ips": ["10.77.1.11"]}, "no other node's CX7 IP besides 10.77.1.11"),
    ({"cidrs": ("nowhere",)}, "dgxspark_vllm_api_allowed_cidrs: 'nowhere' is not an address"),
])
def test_what_cannot_make_rules_is_refused(change, message):
    with pytest.raises(FirewallError) as info:
        _rules(**change)
    assert message in str(info.value)


def test_the_ruleset_replaces_its_own_table_and_names_every_rule():
    text = ruleset(rules(**LAB))
    lines = [line.strip() for line in text.splitlines()]
    # created (a no-op when it exists), deleted, defined again: one transaction under nft -f
    assert lines[1:4] == ["table inet dgxspark", "delete table inet dgxspark", "table inet dgxspark {"]
    assert "elements = { 10.77.0.0/24 }" in lines and "elements = { 10.77.1.12 }" in lines
    chain = lines[lines.index("chain input {") + 1:]
    assert chain[:12] == [
        "type filter hook input priority filter - 10; policy accept;",
        'iifname "lo" accept',
        'iifname "enp1s0f1np1" ip saddr @cx7_peers4 accept comment "the other ranks"',
        'iifname "enp1s0f1np1" ip6 saddr @cx7_peers6 accept comment "the other ranks"',
        'iifname "enp1s0f1np1" ct state established,related accept comment "answers to this node"',
        'iifname "enp1s0f1np1" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept',
        # a node not yet a peer (two nodes grown to four) answers the preflight's ping, and reaches no port
        'iifname "enp1s0f1np1" icmp type echo-request accept comment "ping on the link (the preflight)"',
        'iifname "enp1s0f1np1" icmpv6 type echo-request accept comment "ping on the link (the preflight)"',
        'iifname "enp1s0f1np1" counter drop comment "nothing else on the CX7 link"',
        'iifname != "enp1s0f1np1" ip daddr @cx7_own4 counter drop comment "the CX7 addresses off the CX7 link"',
        'iifname != "enp1s0f1np1" ip6 daddr @cx7_own6 counter drop comment "the CX7 addresses off the CX7 link"',
        'tcp dport 8000 ip saddr @api_allowed4 accept comment "the API"',
    ]
    assert "set cx7_own4 {\n    type ipv4_addr\n    elements = { 10.77.1.11 }" in text
    assert ('tcp dport { 8000, 29521 } counter reject with tcp reset comment "the API from elsewhere, the master port '
            'off the CX7 link"') in chain


def test_ipv6_networks_and_peers_go_to_their_own_sets():
    text = ruleset(_rules(cidrs=("10.77.0.0/24", "fd00::/64"), own_cx7_ip="fd01::1", cx7_ips=["fd01::1", "fd01::2"]))
    sets = text.split("chain input", maxsplit=1)[0]
    assert "set api_allowed6 {\n    type ipv6_addr\n    flags interval\n    elements = { fd00::/64 }" in sets
    assert "set cx7_peers6 {\n    type ipv6_addr\n    elements = { fd01::2 }" in sets
    assert "set cx7_peers4 {\n    type ipv4_addr\n  }" in sets       # an empty set has no elements line


def test_every_address_of_the_cx7_port_is_reached_only_over_it():
    # a LAN host routing the CX7 subnet through the management address must not reach the engine's ports on them
    r = _rules(own_addresses=["10.77.1.11", "10.77.1.99", "fe80::1", "fd01::11"])
    assert r.own == ("10.77.1.11", "10.77.1.99", "fe80::1", "fd01::11")
    sets = ruleset(r).split("chain input", maxsplit=1)[0]
    assert "set cx7_own4 {\n    type ipv4_addr\n    elements = { 10.77.1.11, 10.77.1.99 }" in sets
    assert "set cx7_own6 {\n    type ipv6_addr\n    elements = { fe80::1, fd01::11 }" in sets


def _nft_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-rn", "nft", "-c", "-f", "-"], input=text, capture_output=True, text=True,
                          check=False)


@pytest.mark.skipif(not shutil.which("nft") or not shutil.which("unshare"), reason="nft or unshare not installed")
def test_nft_accepts_the_ruleset_and_refuses_a_broken_one():
    # nft's own parser, in a private network namespace (nothing on this machine is touched)
    ok = _nft_check(ruleset(_rules(cidrs=("10.77.0.0/24", "fd00::/64"), own_addresses=["fd01::11"])))
    if "Operation not permitted" in ok.stderr:
        pytest.skip("no user namespaces here: " + ok.stderr.strip())
    assert ok.returncode == 0, ok.stderr
    broken = _nft_check(ruleset(rules(**LAB)).replace("reject with tcp reset", "reject with tcp rst"))
    assert broken.returncode != 0


# ------------------------------------------------------------------------------------------------ the cluster's plan


def _ip_addr(*addresses):
    """`ip -j addr show` as a node prints it: (ifname, address/prefix) pairs."""
    links: dict = {}
    for ifname, cidr in addresses:
        local, prefix = cidr.split("/")
        links.setdefault(ifname, {"ifname": ifname, "addr_info": []})["addr_info"].append(
            {"family": "inet6" if ":" in local else "inet", "local": local, "prefixlen": int(prefix)})
    return list(links.values())


CONFIG = {"head": "lab-head", "workers": ["lab-worker"], "port": 8000, "master_port": 29521, "api_allowed_cidrs": [],
          "nodes": {"lab-head": {"cx7_ip": "10.77.1.11", "cx7_iface": ""},
                    "lab-worker": {"cx7_ip": "10.77.1.12", "cx7_iface": ""}}}
ADDRESSES = {"lab-head": _ip_addr(("lo", "127.0.0.1/8"), ("eth0", "10.77.0.11/24"), ("enp1s0f1np1", "10.77.1.11/24"),
                                  ("docker0", "172.17.0.1/16")),
             "lab-worker": _ip_addr(("lo", "127.0.0.1/8"), ("eth0", "10.77.0.12/24"),
                                    ("enP2p1s0f1np1", "10.77.1.12/24"))}
REACHED = {"lab-head": "10.77.0.11", "lab-worker": "10.77.0.12"}


SESSIONS = {"lab-head": "10.77.0.1 52144 10.77.0.11 22", "lab-worker": "10.77.0.1 40022 10.77.0.12 22"}


def test_the_plan_finds_each_cx7_port_and_defaults_the_api_to_the_controller_and_the_nodes():
    result = plan(CONFIG, ADDRESSES, REACHED, SESSIONS)
    # not the management network: another host of that LAN is not the controller
    assert result["api_cidrs"] == ["10.77.0.1/32", "10.77.0.11/32", "10.77.0.12/32"]
    assert result["source"] == "the controller's address (10.77.0.1)" and result["controller"] == ["10.77.0.1"]
    head, worker = result["nodes"]["lab-head"], result["nodes"]["lab-worker"]
    assert (head["cx7_iface"], head["peers"]) == ("enp1s0f1np1", ["10.77.1.12"])
    # the CX7 port's addresses only (not the management, docker0 or loopback ones) are kept to that port
    assert "set cx7_own4 {\n    type ipv4_addr\n    elements = { 10.77.1.11 }" in head["ruleset"]
    assert "set cx7_own4 {\n    type ipv4_addr\n    elements = { 10.77.1.12 }" in worker["ruleset"]
    assert (worker["cx7_iface"], worker["peers"]) == ("enP2p1s0f1np1", ["10.77.1.11"])
    assert 'iifname "enP2p1s0f1np1" counter drop' in worker["ruleset"]
    assert "elements = { 10.77.0.1/32, 10.77.0.11/32, 10.77.0.12/32 }" in head["ruleset"]


def test_without_a_list_or_a_known_controller_the_plan_names_the_variable():
    for sessions in (None, {"lab-head": "", "lab-worker": ""},
                     # a session from a node itself (the controller is the head): not a controller beyond the nodes
                     {"lab-head": "10.77.0.11 1 10.77.0.11 22", "lab-worker": "10.77.0.11 2 10.77.0.12 22"}):
        with pytest.raises(FirewallError, match="the API would answer the nodes alone: dgxspark_vllm_api_allowed_cidrs "
                                                "is empty and the controller's address is not known"):
            plan(CONFIG, ADDRESSES, REACHED, sessions)
    given = plan(dict(CONFIG, api_allowed_cidrs=["192.168.1.0/24"]), ADDRESSES, REACHED, SESSIONS)
    assert given["api_cidrs"] == ["192.168.1.0/24", "10.77.0.1/32", "10.77.0.11/32", "10.77.0.12/32"]
    assert given["source"] == "dgxspark_vllm_api_allowed_cidrs and the controller's address (10.77.0.1)"


def test_given_networks_win_and_the_nodes_themselves_are_always_allowed():
    result = plan(dict(CONFIG, api_allowed_cidrs=["10.77.0.1/32"]), ADDRESSES, REACHED)
    assert result["api_cidrs"] == ["10.77.0.1/32", "10.77.0.11/32", "10.77.0.12/32"]
    assert result["source"] == "dgxspark_vllm_api_allowed_cidrs"
    assert "elements = { 10.77.0.1/32, 10.77.0.11/32, 10.77.0.12/32 }" in result["nodes"]["lab-worker"]["ruleset"]
    # a given network that holds the nodes adds nothing
    assert plan(dict(CONFIG, api_allowed_cidrs=["10.77.0.0/16"]), ADDRESSES, REACHED)["api_cidrs"] == ["10.77.0.0/16"]


def test_an_unknown_management_address_is_fine_once_the_networks_are_given():
    reached = {"lab-head": "spark-a.example", "lab-worker": ""}   # NAT, a jump host: not on the nodes
    assert plan(dict(CONFIG, api_allowed_cidrs=["192.168.1.0/24"]), ADDRESSES, reached)["api_cidrs"] == [
        "192.168.1.0/24"]


@pytest.mark.parametrize("nodes, message", [
    ({"lab-head": {"cx7_ip": "10.77.1.99", "cx7_iface": ""}},
     "lab-head: its dgxspark_vllm_cx7_ip 10.77.1.99 is on no interface of the node"),
    ({"lab-head": {"cx7_ip": "10.77.1.11", "cx7_iface": "eth0"}},
     "lab-head: dgxspark_vllm_cx7_iface is eth0, but 10.77.1.11 is on enp1s0f1np1"),
])
def test_a_cx7_address_or_port_that_the_node_does_not_have_is_refused(nodes, message):
    config = dict(CONFIG, nodes=dict(CONFIG["nodes"], **nodes))
    with pytest.raises(FirewallError, match=message):
        plan(config, ADDRESSES, REACHED)


def test_a_node_that_showed_no_address_is_named():
    with pytest.raises(FirewallError, match="lab-worker: `ip -j addr show` gave no address"):
        plan(CONFIG, dict(ADDRESSES, **{"lab-worker": []}), REACHED)


def test_the_guard_metrics_port_is_admitted_on_the_head_from_the_api_networks_only():
    result = plan(dict(CONFIG, guard=True, guard_metrics_port=9478), ADDRESSES, REACHED, SESSIONS)
    head, worker = result["nodes"]["lab-head"]["ruleset"], result["nodes"]["lab-worker"]["ruleset"]
    accept4 = 'tcp dport 9478 ip saddr @api_allowed4 accept comment "the guard metrics"'
    accept6 = 'tcp dport 9478 ip6 saddr @api_allowed6 accept comment "the guard metrics"'
    reject = 'tcp dport 9478 counter reject with tcp reset comment "the guard metrics from elsewhere"'
    lines = [line.strip() for line in head.splitlines()]
    # admitted from the API's networks, then everyone else reset, before the API's own reject
    assert lines.index(accept4) < lines.index(accept6) < lines.index(reject) < next(
        i for i, line in enumerate(lines) if line.startswith("tcp dport { 8000, 29521 }"))
    assert "9478" not in worker      # the guard listens on the head only
    # the guard off, or its endpoint off: the port is not named
    for config in (dict(CONFIG, guard=False, guard_metrics_port=9478), dict(CONFIG, guard=True, guard_metrics_port=0)):
        assert "9478" not in plan(config, ADDRESSES, REACHED, SESSIONS)["nodes"]["lab-head"]["ruleset"]


@pytest.mark.parametrize("port, message", [(8000, "the port of the API or the master"),
                                           (29521, "the port of the API or the master"),
                                           (70000, "must be a port number or 0"), (True, "must be a port number or 0")])
def test_a_guard_metrics_port_that_cannot_be_is_refused(port, message):
    with pytest.raises(FirewallError, match=message):
        _rules(metrics_port=port)


@pytest.mark.skipif(not shutil.which("nft") or not shutil.which("unshare"), reason="nft or unshare not installed")
def test_nft_accepts_the_ruleset_with_the_guard_metrics_port():
    checked = _nft_check(ruleset(_rules(cidrs=("10.77.0.0/24", "fd00::/64"), metrics_port=9478)))
    if "Operation not permitted" in checked.stderr:
        pytest.skip("no user namespaces here: " + checked.stderr.strip())
    assert checked.returncode == 0, checked.stderr


def test_the_api_answers_each_router_host_too():
    result = plan(CONFIG, ADDRESSES, REACHED, SESSIONS, {"router-1": "192.0.2.30", "lab-head": "10.77.0.11"})
    assert result["api_cidrs"] == ["10.77.0.1/32", "10.77.0.11/32", "192.0.2.30/32", "10.77.0.12/32"]
    assert result["routers"] == ["10.77.0.11", "192.0.2.30"]
    assert "the router's (10.77.0.11, 192.0.2.30)" in result["source"]
    assert "elements = { 10.77.0.1/32, 10.77.0.11/32, 192.0.2.30/32, 10.77.0.12/32 }" in result["nodes"]["lab-head"]["ruleset"]


@pytest.mark.parametrize(("address", "message"), [
    ("", "the router host router-1: its address could not be resolved (set its ansible_host"),
    ("router.example", "the router host router-1: 'router.example' is not an IP address"),
])
def test_a_router_host_without_an_address_is_refused(address, message):
    with pytest.raises(FirewallError, match=re_escape(message)):
        plan(CONFIG, ADDRESSES, REACHED, SESSIONS, {"router-1": address})
