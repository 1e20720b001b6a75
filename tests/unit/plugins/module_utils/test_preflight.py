# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for plugins/module_utils/_preflight.py: probe output as the lab's nodes print it -> checks."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from ansible_collections.dgxspark.vllm.plugins.module_utils._preflight import (
    FAIL,
    PASS,
    SECRET_FILES_PROBE,
    SKIPPED,
    WARN,
    Check,
    Exposure,
    Link,
    PreflightError,
    Settings,
    api_exposure_check,
    arch_check,
    decide_interface,
    disk_check,
    docker_checks,
    evaluate,
    gpu_check,
    gpu_holders_check,
    human_bytes,
    memory_check,
    mtu_checks,
    parse_compute_apps,
    parse_disk_probe,
    parse_docker_inspect,
    parse_gpu_query,
    parse_ip_addr_json,
    parse_meminfo_available,
    parse_pids,
    parse_secret_files,
    parse_ss_listeners,
    ping_checks,
    port_checks,
    rdma_checks,
    secret_files_check,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._rdma import resolve_link

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures")
ROLE = pathlib.Path(__file__).resolve().parents[4] / "roles" / "preflight"
SUBNET = "10.77.1.0/24"


# ---------------------------------------------------------------- probe output as the lab prints it

def _iface(index: int, name: str, addr: str | None, prefix: int = 24, mtu: int = 1500, operstate: str = "UP",
           flags: tuple[str, ...] = ("BROADCAST", "MULTICAST", "UP", "LOWER_UP")) -> dict[str, Any]:
    info = [{"family": "inet", "local": addr, "prefixlen": prefix, "scope": "global"}] if addr else []
    info.append({"family": "inet6", "local": "fe80::42:aff:fe4d:%x" % index, "prefixlen": 64, "scope": "link"})
    return {"ifindex": index, "link_index": 100 + index, "ifname": name, "flags": list(flags), "mtu": mtu,
            "qdisc": "noqueue", "operstate": operstate, "group": "default", "link_type": "ether",
            "address": "02:42:0a:4d:00:%02x" % index, "link_netnsid": 0, "addr_info": info}


LO = {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
      "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host"}]}


def ip_addr(*ifaces: dict[str, Any]) -> str:
    return json.dumps([LO, _iface(2, "docker0", "172.17.0.1", 16, operstate="DOWN",
                                  flags=("NO-CARRIER", "BROADCAST", "MULTICAST", "UP"))] + list(ifaces))


HEAD_IP_ADDR = ip_addr(_iface(60, "eth0", "10.77.0.11"), _iface(62, "enp1s0f1np1", "10.77.1.11", mtu=9000))
WORKER_IP_ADDR = ip_addr(_iface(61, "eth0", "10.77.0.12"), _iface(63, "enP2p1s0f1np1", "10.77.1.12", mtu=9000))

SS_IDLE = """\
LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    users:(("sshd",pid=101,fd=3))
LISTEN 0      4096   127.0.0.53%lo:53         0.0.0.0:*    users:(("systemd-resolve",pid=90,fd=14))
LISTEN 0      128             [::]:22            [::]:*    users:(("sshd",pid=101,fd=4))
"""
SS_HTTP_SERVER = SS_IDLE + 'LISTEN 0      5      0.0.0.0:8000 0.0.0.0:* users:(("python3",pid=2211,fd=3))\n'
SS_SERVING = SS_IDLE + (
    'LISTEN 0      2048   0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=4100,fd=27))\n'
    'LISTEN 0      128    [::ffff:10.77.1.11]:29521 *:* users:(("python3",pid=4180,fd=20),("python3",pid=4181,fd=20))\n')

PING_OK = """\
PING 10.77.1.12 (10.77.1.12) from 10.77.1.11 enp1s0f1np1: 56(84) bytes of data.
64 bytes from 10.77.1.12: icmp_seq=1 ttl=64 time=0.071 ms
64 bytes from 10.77.1.12: icmp_seq=2 ttl=64 time=0.060 ms

--- 10.77.1.12 ping statistics ---
2 packets transmitted, 2 received, 0% packet loss, time 1018ms
rtt min/avg/max/mdev = 0.060/0.065/0.071/0.005 ms
"""
PING_UNREACHABLE = """\
PING 10.77.1.99 (10.77.1.99) from 10.77.1.11 enp1s0f1np1: 56(84) bytes of data.
From 10.77.1.11 icmp_seq=1 Destination Host Unreachable
From 10.77.1.11 icmp_seq=2 Destination Host Unreachable

--- 10.77.1.99 ping statistics ---
2 packets transmitted, 0 received, +2 errors, 100% packet loss, time 1030ms
"""

DOCKER_LAB = {"ServerVersion": "20.10.24+dfsg1", "Driver": "overlay2", "CgroupVersion": "1",
              "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}},
              "DefaultRuntime": "runc", "ServerErrors": None}
DOCKER_SPARK = dict(DOCKER_LAB, ServerVersion="28.3.3", CgroupVersion="2",
                    Runtimes={"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}})
DOCKER_DOWN_STDERR = ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
                      "running?")


def cmd(stdout: str = "", rc: int = 0, stderr: str = "", **extra: Any) -> dict[str, Any]:
    return dict({"rc": rc, "stdout": stdout, "stderr": stderr, "changed": False}, **extra)


def not_found(binary: str) -> dict[str, Any]:
    """What ansible-core 2.19's command module registers (failed_when: false) when the binary does not exist."""
    return {"rc": 2, "stdout": "", "stderr": "", "cmd": "%s -L" % binary, "failed": False,
            "msg": "Error executing command.", "stdout_lines": [], "stderr_lines": [], "changed": False,
            "failed_when_result": False, "failed_when_suppressed_exception": "(traceback unavailable)"}


@pytest.mark.parametrize(("probe", "expected"), [
    (not_found("nvidia-smi"), True),
    ({"rc": 2, "msg": "[Errno 2] No such file or directory: b'nvidia-smi'"}, True),
    ({"rc": 127, "stderr": "sh: 1: nvidia-smi: not found"}, True),
    ({"rc": 2, "msg": "non-zero return code", "stdout": "Invalid combination of input arguments."}, False),
    ({"rc": 9, "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."}, False),
])
def test_a_missing_command_is_told_from_a_failing_one(probe, expected):
    assert gpu_check(probe, LAB).evidence.startswith("nvidia-smi is not installed") is expected


def disk(avail: int, present: int | None = None, probed: str = "/var/tmp/models/tiny-glm53") -> dict[str, Any]:
    text = "probed\t%s\ndf\t%d\t/\n" % (probed, avail)
    if present is not None:
        text += "present\t%d\n" % present
    return cmd(text)


def meminfo_text(available_kib: int) -> str:
    return "MemTotal:       24576000 kB\nMemFree:         8000000 kB\nMemAvailable:   %d kB\n" % available_kib


def ping_result(target: str, ip: str, iface: str, stdout: str, rc: int) -> dict[str, Any]:
    return dict(cmd(stdout, rc), item=target, cmd=["ping", "-I", iface, "-c", "2", "-W", "2", ip])


def rdma(fixture: str, ip: str, **extra: Any) -> dict[str, Any]:
    """What dgxspark.vllm.rdma_link_info registers over a recorded sysfs tree."""
    return dict(resolve_link(ip, None, os.path.join(FIXTURES, "sysfs", fixture)).to_dict(), changed=False, **extra)


# SECRET_FILES_PROBE on a lab node over the role's default paths: nothing there.
SECRETS_NONE = """\
pattern\t/var/tmp/cache/huggingface/token
error\t/var/tmp/cache/huggingface/token\tstat: cannot statx '/var/tmp/cache/huggingface/token': No such file or directory
pattern\t/var/tmp/cache/huggingface/stored_tokens
error\t/var/tmp/cache/huggingface/stored_tokens\tstat: cannot statx '/var/tmp/cache/huggingface/stored_tokens': No such file or directory
pattern\t/run/dgxspark/hf-token*
pattern\t/opt/dgxspark/exl3-kit/.env
error\t/opt/dgxspark/exl3-kit/.env\tstat: cannot statx '/opt/dgxspark/exl3-kit/.env': No such file or directory
"""


def lab_node(name: str, **override: Any) -> dict[str, Any]:
    head = name == "lab-head"
    node = {
        "name": name, "role": "head" if head else "worker",
        "cx7_ip": "10.77.1.11" if head else "10.77.1.12", "cx7_iface": "", "ib_hca": "", "gid_index": None,
        "ip_addr": HEAD_IP_ADDR if head else WORKER_IP_ADDR,
        "pings": [ping_result("lab-worker" if head else "lab-head", "10.77.1.12" if head else "10.77.1.11",
                              "enp1s0f1np1" if head else "enP2p1s0f1np1", PING_OK, 0)],
        "rdma": rdma("lab_head", "10.77.1.11") if head else rdma("lab_worker", "10.77.1.12"),
        "listeners": cmd(SS_IDLE),
        "own_pids": cmd(rc=1, stderr="Error: No such container: vllm_glm53"),
        "disk": disk(76004323328, 856064),
        "meminfo": meminfo_text(18000000),
        "docker_info": cmd(json.dumps(DOCKER_LAB)),
        "containers": {"changed": False, "skipped": True, "false_condition": "..."},
        "gpu": not_found("nvidia-smi"),
        "compute_apps": not_found("nvidia-smi"),
        "arch": "x86_64",
        "secret_files": cmd(SECRETS_NONE),
    }
    node.update(override)
    return node


LAB = Settings(cx7_subnet=SUBNET, model_path="/var/tmp/models/tiny-glm53", checkpoint_size_bytes=10 ** 9,
               disk_margin_bytes=10 ** 9, mem_available_floor_bytes=2 * 2 ** 30, lab=True)
SPARK = Settings(cx7_subnet=SUBNET, model_path="/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat")


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


# ---------------------------------------------------------------- interfaces

def test_parse_ip_addr_keeps_ipv4_with_prefix_mtu_and_state():
    links = {link.name: link for link in parse_ip_addr_json(HEAD_IP_ADDR)}
    assert set(links) == {"lo", "docker0", "eth0", "enp1s0f1np1"}
    cx7 = links["enp1s0f1np1"]
    assert (cx7.mtu, cx7.operstate, cx7.up) == (9000, "UP", True)
    assert [str(a) for a in cx7.addresses] == ["10.77.1.11/24"]
    assert links["docker0"].up is False
    assert links["lo"].up is True  # UNKNOWN with UP,LOWER_UP


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "did not print JSON"),
    ('{"ifname": "eth0"}', "not a list of interfaces"),
])
def test_parse_ip_addr_rejects(text, message):
    with pytest.raises(PreflightError, match=message):
        parse_ip_addr_json(text)


@pytest.mark.parametrize(("text", "ip", "iface"), [
    (HEAD_IP_ADDR, "10.77.1.11", "enp1s0f1np1"),
    (WORKER_IP_ADDR, "10.77.1.12", "enP2p1s0f1np1"),
])
def test_interface_is_the_carrier_of_the_cx7_ip_not_the_management_lan(text, ip, iface):
    decision = decide_interface(parse_ip_addr_json(text), ip, SUBNET)
    assert decision.detected.name == iface
    assert decision.effective.name == iface
    checks = by_name(list(decision.checks))
    assert {n: c.status for n, c in checks.items()} == {"cx7_ip": PASS, "cx7_interface": PASS, "cx7_subnet": PASS}
    assert checks["cx7_ip"].evidence == "%s is on %s (%s/24)." % (ip, iface, ip)


def test_wrong_cx7_ip_fails_and_names_the_address_in_the_subnet():
    decision = decide_interface(parse_ip_addr_json(WORKER_IP_ADDR), "10.77.1.99", SUBNET)
    checks = by_name(list(decision.checks))
    assert checks["cx7_ip"].status == FAIL
    assert checks["cx7_ip"].evidence == ("10.77.1.99 (dgxspark_vllm_cx7_ip) is not on any interface of this node. "
                                         "In the CX7 subnet 10.77.1.0/24: enP2p1s0f1np1 carries 10.77.1.12/24.")
    assert "(10.77.1.12)" in checks["cx7_ip"].fix
    # the interface is still found by subnet, so the pings and the MTU check can run from it
    assert decision.detected.name == "enP2p1s0f1np1"
    assert checks["cx7_interface"].status == PASS
    assert checks["cx7_subnet"].status == PASS


def test_no_interface_at_all():
    decision = decide_interface(parse_ip_addr_json(ip_addr(_iface(60, "eth0", "10.77.0.11"))), "10.77.1.11", SUBNET)
    checks = by_name(list(decision.checks))
    assert decision.detected is None and decision.effective is None
    assert checks["cx7_ip"].status == FAIL
    assert checks["cx7_interface"].status == FAIL
    assert "eth0 (UP, MTU 1500, 10.77.0.11/24)" in checks["cx7_interface"].evidence


def test_down_interface_fails():
    text = ip_addr(_iface(62, "enp1s0f1np1", "10.77.1.11", mtu=9000, operstate="DOWN",
                          flags=("NO-CARRIER", "BROADCAST", "MULTICAST", "UP")))
    checks = by_name(list(decide_interface(parse_ip_addr_json(text), "10.77.1.11", SUBNET).checks))
    assert checks["cx7_interface"].status == FAIL
    assert "NO-CARRIER" in checks["cx7_interface"].evidence
    assert "ip link set enp1s0f1np1 up" in checks["cx7_interface"].fix


def test_configured_interface_wins_and_must_carry_the_ip():
    links = parse_ip_addr_json(HEAD_IP_ADDR)
    ok = decide_interface(links, "10.77.1.11", SUBNET, configured="enp1s0f1np1")
    assert ok.effective.name == "enp1s0f1np1" and all(c.status == PASS for c in ok.checks)
    wrong = decide_interface(links, "10.77.1.11", SUBNET, configured="eth0")
    assert wrong.effective.name == "eth0" and wrong.detected.name == "enp1s0f1np1"
    checks = by_name(list(wrong.checks))
    assert checks["cx7_ip"].status == FAIL
    assert checks["cx7_ip"].fix.startswith("Set dgxspark_vllm_cx7_iface to enp1s0f1np1")
    missing = decide_interface(links, "10.77.1.11", SUBNET, configured="enP2p1s0f1np1")
    checks = by_name(list(missing.checks))
    assert checks["cx7_interface"].status == FAIL
    assert "does not exist" in checks["cx7_interface"].evidence
    assert "(enp1s0f1np1 carries 10.77.1.11)" in checks["cx7_interface"].fix


@pytest.mark.parametrize(("ip", "subnet", "status", "text"), [
    ("10.77.1.11", "", FAIL, "dgxspark_vllm_cx7_subnet is empty."),
    ("10.77.1.11", "10.77.1.0/33", FAIL, "is not an IPv4 CIDR"),
    ("10.77.1.11", "10.77.2.0/24", FAIL, "10.77.1.11 is not in dgxspark_vllm_cx7_subnet 10.77.2.0/24."),
    ("10.77.1.11", "10.77.0.0/16", WARN, "carries it as 10.77.1.11/24 (network 10.77.1.0/24)"),
])
def test_subnet(ip, subnet, status, text):
    checks = by_name(list(decide_interface(parse_ip_addr_json(HEAD_IP_ADDR), ip, subnet).checks))
    assert checks["cx7_subnet"].status == status
    assert text in checks["cx7_subnet"].evidence


@pytest.mark.parametrize("ip", ["", "10.77.1.11/24", "fe80::1", "head"])
def test_cx7_ip_must_be_ipv4(ip):
    decision = decide_interface(parse_ip_addr_json(HEAD_IP_ADDR), ip, SUBNET)
    assert [(c.name, c.status) for c in decision.checks] == [("cx7_ip", FAIL)]


def test_ip_on_two_interfaces_is_ambiguous():
    text = ip_addr(_iface(62, "enp1s0f1np1", "10.77.1.11", mtu=9000), _iface(64, "enP2p1s0f1np1", "10.77.1.11"))
    checks = [c for c in decide_interface(parse_ip_addr_json(text), "10.77.1.11", SUBNET).checks if c.name == "cx7_ip"]
    assert [c.status for c in checks] == [FAIL]
    assert "enp1s0f1np1, enP2p1s0f1np1" in checks[0].evidence


@pytest.mark.parametrize(("mtus", "expected"), [
    ({"a": ("x", 9000), "b": ("y", 9000)}, {"a": PASS, "b": PASS}),
    ({"a": ("x", 9000), "b": ("y", 1500)}, {"a": FAIL, "b": FAIL}),
    ({"a": ("x", 1500), "b": ("y", 1500)}, {"a": WARN, "b": WARN}),
    ({"a": ("x", 9000), "b": (None, None)}, {"a": PASS, "b": SKIPPED}),
])
def test_mtu_agreement(mtus, expected):
    checks = mtu_checks(mtus, 9000)
    assert {node: c.status for node, c in checks.items()} == expected


def test_mtu_mismatch_names_every_node():
    check = mtu_checks({"lab-head": ("enp1s0f1np1", 9000), "lab-worker": ("enP2p1s0f1np1", 1500)})["lab-worker"]
    assert check.evidence == "The CX7 MTU differs across nodes: lab-head enp1s0f1np1 9000, lab-worker enP2p1s0f1np1 1500."
    assert "Set the same MTU (9000)" in check.fix


# ---------------------------------------------------------------- pings

def test_pings():
    checks = ping_checks("lab-head", [
        ping_result("lab-worker", "10.77.1.12", "enp1s0f1np1", PING_OK, 0),
        ping_result("lab-w2", "10.77.1.99", "enp1s0f1np1", PING_UNREACHABLE, 1),
        {"item": "lab-w3", "skipped": True},
        dict(cmd(PING_OK.replace("10.77.1.12", "10.77.1.13")), item="lab-w4",
             cmd="ping -I enp1s0f1np1 -c 2 -W 2 10.77.1.13"),
    ], "enp1s0f1np1", SUBNET)
    assert [(c.name, c.status) for c in checks] == [
        ("ping.lab-worker", PASS), ("ping.lab-w2", FAIL), ("ping.lab-w3", SKIPPED), ("ping.lab-w4", PASS)]
    assert checks[3].data["ip"] == "10.77.1.13"
    assert "2 packets transmitted, 2 received, 0% packet loss" in checks[0].evidence
    assert checks[1].evidence == ("`ping -I enp1s0f1np1 -c 2 -W 2 10.77.1.99` (lab-w2's CX7 IP): 2 packets "
                                  "transmitted, 0 received, +2 errors, 100% packet loss, time 1030ms.")
    assert "lab-w2's dgxspark_vllm_cx7_ip (10.77.1.99)" in checks[1].fix


def test_no_interface_no_pings():
    checks = ping_checks("lab-head", [{"item": "lab-worker", "skipped": True}], None, SUBNET)
    assert [(c.name, c.status) for c in checks] == [("ping.lab-worker", SKIPPED)]
    assert "No CX7 interface" in checks[0].evidence


# ---------------------------------------------------------------- ports

def test_parse_ss():
    listeners = parse_ss_listeners(SS_SERVING)
    assert [(entry.address, entry.port) for entry in listeners] == [
        ("0.0.0.0", 22), ("127.0.0.53%lo", 53), ("[::]", 22), ("0.0.0.0", 8000), ("[::ffff:10.77.1.11]", 29521)]
    assert listeners[-1].processes == (("python3", 4180), ("python3", 4181))
    assert parse_ss_listeners("LISTEN 0 128 0.0.0.0:2024 0.0.0.0:*\n")[0].processes == ()


@pytest.mark.parametrize(("ss", "own", "head", "expected"), [
    (SS_IDLE, "", True, {"port.8000": PASS, "port.29521": PASS}),
    (SS_HTTP_SERVER, "", True, {"port.8000": FAIL, "port.29521": PASS}),
    (SS_HTTP_SERVER, "", False, {"port.8000": WARN, "port.29521": PASS}),
    (SS_SERVING, "PID\n4100\n4180\n4181\n", True, {"port.8000": PASS, "port.29521": PASS}),
    (SS_SERVING, "PID\n4100\n", True, {"port.8000": PASS, "port.29521": FAIL}),
    ("LISTEN 0 5 0.0.0.0:8000 0.0.0.0:*\n", "PID\n4100\n", True, {"port.8000": FAIL, "port.29521": PASS}),
])
def test_ports(ss, own, head, expected):
    checks = port_checks(parse_ss_listeners(ss), parse_pids(own), SPARK, head)
    assert {c.name: c.status for c in checks} == expected


def test_port_held_by_a_foreign_process_names_it():
    check = port_checks(parse_ss_listeners(SS_HTTP_SERVER), frozenset(), SPARK, True)[0]
    assert check.evidence == ("Port 8000 (API port, dgxspark_vllm_port) is held by python3 (pid 2211) on "
                              "0.0.0.0:8000, not by the serve container vllm_glm53.")
    assert "ss -ltnp 'sport = :8000'" in check.fix
    assert check.data["holders"] == [{"process": "python3", "pid": 2211, "ours": False}]


def test_port_held_by_our_container_says_so():
    check = port_checks(parse_ss_listeners(SS_SERVING), parse_pids("PID\n4100\n"), SPARK, True)[0]
    assert "held by our serve container vllm_glm53 (vllm pid 4100)" in check.evidence


# ---------------------------------------------------------------- disk, memory

def test_disk_probe_parse():
    assert parse_disk_probe("probed\t/var/tmp\ndf\t1000\t/ \npresent\t10\n") == {
        "probed": "/var/tmp", "avail": 1000, "mount": "/ ", "present": 10}
    with pytest.raises(PreflightError, match="no free space"):
        parse_disk_probe("probed\t/var/tmp\n")


@pytest.mark.parametrize(("avail", "present", "status", "needed"), [
    (205 * 10 ** 9, None, PASS, 205 * 10 ** 9),
    (205 * 10 ** 9 - 1, None, FAIL, 205 * 10 ** 9),
    (30 * 10 ** 9, 180 * 10 ** 9, PASS, 25 * 10 ** 9),      # the checkpoint is mostly there already
    (10 * 10 ** 9, 200 * 10 ** 9, FAIL, 20 * 10 ** 9),      # the margin is kept even when it is all there
])
def test_disk(avail, present, status, needed):
    check = disk_check(disk(avail, present), SPARK)
    assert check.status == status
    assert check.data["needed_bytes"] == needed


def test_disk_failure_says_how_much_to_free():
    check = disk_check(disk(76004323328, None, "/var/tmp"), SPARK)
    assert check.evidence == ("/var/tmp (on /): 76.0 GB free; needs 205.0 GB (checkpoint 185.0 GB - 0 B already "
                              "there + margin 20.0 GB).")
    assert check.fix.startswith("Free at least 129.0 GB on /")


def test_disk_probe_failed():
    check = disk_check(cmd(rc=1, stderr="df: /var/tmp: Permission denied"), SPARK)
    assert (check.status, check.evidence.endswith("Permission denied")) == (FAIL, True)


@pytest.mark.parametrize(("name", "status"), [
    ("gb10_load_high_cache.txt", FAIL),          # 64.8 GB available, below 110 GB
    ("gb10_low_mem_available.txt", FAIL),
])
def test_memory_on_recorded_gb10_samples(name, status):
    with open(os.path.join(FIXTURES, "meminfo", name), encoding="ascii") as handle:
        check = memory_check(handle.read(), SPARK.mem_available_floor_bytes)
    assert check.status == status
    assert check.data["mem_available_bytes"] == parse_meminfo_available(open(
        os.path.join(FIXTURES, "meminfo", name), encoding="ascii").read())


def test_memory_floor_is_inclusive_and_in_bytes():
    assert parse_meminfo_available(meminfo_text(1000)) == 1024000
    assert memory_check(meminfo_text(1000), 1024000).status == PASS
    assert memory_check(meminfo_text(1000), 1024001).status == FAIL


@pytest.mark.parametrize(("text", "message"), [
    (None, "could not be read"),
    ("MemTotal: 1 kB\n", "no MemAvailable line"),
    ("MemAvailable: lots kB\n", "malformed MemAvailable"),
])
def test_memory_unreadable(text, message):
    check = memory_check(text, 1)
    assert check.status == FAIL and message in check.evidence


# ---------------------------------------------------------------- docker, GPU, arch

@pytest.mark.parametrize(("probe", "lab", "docker", "runtime"), [
    (cmd(json.dumps(DOCKER_SPARK)), False, PASS, PASS),
    (cmd(json.dumps(dict(DOCKER_LAB, DiscoveredDevices=[{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]))), False,
     PASS, PASS),
    (cmd(json.dumps(DOCKER_LAB)), False, PASS, FAIL),
    (cmd(json.dumps(DOCKER_LAB)), True, PASS, SKIPPED),
    (cmd(rc=1, stderr=DOCKER_DOWN_STDERR), False, FAIL, SKIPPED),
    (cmd(json.dumps(dict(DOCKER_LAB, ServerErrors=[DOCKER_DOWN_STDERR]))), False, FAIL, SKIPPED),
    (not_found("docker"), False, FAIL, SKIPPED),
    (cmd("{not json"), False, FAIL, SKIPPED),
])
def test_docker(probe, lab, docker, runtime):
    checks = by_name(docker_checks(probe, lab))
    assert (checks["docker"].status, checks["gpu_runtime"].status) == (docker, runtime)


def test_docker_down_says_why():
    check = by_name(docker_checks(cmd(rc=1, stderr=DOCKER_DOWN_STDERR), False))["docker"]
    assert DOCKER_DOWN_STDERR in check.evidence and "systemctl enable --now docker" in check.fix


def test_lab_gpu_runtime_is_skipped_visibly():
    check = by_name(docker_checks(cmd(json.dumps(DOCKER_LAB)), True))["gpu_runtime"]
    assert check.evidence.startswith("dgxspark_vllm_lab: the lab has no GPU (runtimes io.containerd.runc.v2, runc")


@pytest.mark.parametrize(("probe", "lab", "status"), [
    (cmd("NVIDIA GB10, 580.95.05, [N/A]\n"), False, PASS),
    (cmd("NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n"), False, WARN),
    (not_found("nvidia-smi"), True, SKIPPED),
    (not_found("nvidia-smi"), False, FAIL),
    (cmd("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", rc=9), False, FAIL),
    (cmd(""), False, FAIL),
])
def test_gpu(probe, lab, status):
    settings = LAB if lab else SPARK
    assert gpu_check(probe, settings).status == status


def test_gpu_query_parse():
    assert parse_gpu_query("NVIDIA GB10, 580.95.05, [N/A]\n") == [
        {"name": "NVIDIA GB10", "driver_version": "580.95.05", "memory_total": "[N/A]"}]


@pytest.mark.parametrize(("arch", "settings", "status"), [
    ("aarch64", SPARK, PASS), ("x86_64", SPARK, WARN), ("x86_64", LAB, SKIPPED)])
def test_arch(arch, settings, status):
    assert arch_check(arch, settings).status == status


def _container(name: str, gpu: bool = False, running: bool = True, runtime: str = "runc") -> dict[str, Any]:
    requests = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}] if gpu else None
    return {"Id": name * 4, "Name": "/" + name, "State": {"Running": running},
            "HostConfig": {"DeviceRequests": requests, "Runtime": runtime, "Devices": []}}


@pytest.mark.parametrize(("containers", "apps", "own", "status"), [
    ([_container("vllm_glm53", gpu=True)], cmd(""), "", PASS),
    ([_container("comfyui", gpu=True)], cmd(""), "", FAIL),
    ([_container("ollama", runtime="nvidia")], cmd(""), "", FAIL),
    ([_container("web")], cmd(""), "", PASS),
    ([], cmd("4100, VLLM::Worker_TP0, [N/A]\n"), "PID\n4100\n", PASS),
    ([], cmd("5120, python3, [N/A]\n"), "PID\n4100\n", FAIL),
    ([], not_found("nvidia-smi"), "", WARN),
])
def test_gpu_holders(containers, apps, own, status):
    check = gpu_holders_check(containers, apps, parse_pids(own), SPARK)
    assert check.status == status


def test_gpu_holders_in_the_lab_say_what_was_not_read():
    check = gpu_holders_check([], not_found("nvidia-smi"), frozenset(), LAB)
    assert check.status == PASS
    assert check.evidence == "No other container requests the GPU; nvidia-smi absent (lab): compute apps not read."


def test_gpu_holder_names_the_container():
    check = gpu_holders_check([_container("comfyui", gpu=True)], cmd(""), frozenset(), SPARK)
    assert "containers with GPU access: comfyui" in check.evidence


def test_parsers_of_docker_and_nvidia_smi():
    assert parse_docker_inspect("") == []
    assert parse_docker_inspect(json.dumps([_container("a")]))[0]["Name"] == "/a"
    with pytest.raises(PreflightError):
        parse_docker_inspect("[{")
    assert parse_compute_apps("4100, VLLM::Worker_TP0, 1024 MiB\nNo running processes found\n") == [
        {"pid": 4100, "process_name": "VLLM::Worker_TP0", "used_memory": "1024 MiB"}]


# ---------------------------------------------------------------- RDMA (over the recorded sysfs trees)

@pytest.mark.parametrize(("fixture", "ip", "iface", "gid"), [
    ("lab_head", "10.77.1.11", "enp1s0f1np1", 3),
    ("lab_worker", "10.77.1.12", "enP2p1s0f1np1", 4),
])
def test_rdma_from_the_lab_trees(fixture, ip, iface, gid):
    checks, detected = rdma_checks(rdma(fixture, ip), LAB, iface, "", None)
    assert [(c.name, c.status) for c in checks] == [("rdma", PASS)]
    assert detected == {"ib_hca": "rocep1s0f1,roceP2p1s0f1", "gid_index": gid}
    assert "as RoCE v2 GID index %d" % gid in checks[0].evidence


def test_rdma_port_down_fails_each_problem():
    checks, detected = rdma_checks(rdma("port_down", "192.168.177.11"), SPARK, "enp1s0f1np1", "", None)
    assert [(c.name, c.status) for c in checks] == [
        ("rdma.port_state", FAIL), ("rdma.phys_state", FAIL), ("rdma.netdev_state", FAIL), ("rdma.speed", WARN),
        ("rdma.twin_down", WARN)]
    assert all(c.fix for c in checks)
    assert detected["gid_index"] == 3


def test_rdma_wrong_ip_fails():
    checks, detected = rdma_checks(rdma("lab_worker", "10.77.1.99"), LAB, "enP2p1s0f1np1", "", None)
    assert [(c.name, c.status) for c in checks] == [("rdma.gid_ipv4", FAIL)]
    assert detected == {"ib_hca": "", "gid_index": None}


def test_rdma_mtu_warning_is_left_to_the_mtu_check_for_the_cx7_interface():
    result = rdma("lab_head", "10.77.1.11")
    result["problems"] = [{"check": "mtu", "severity": "warning", "message": "enp1s0f1np1 MTU is 1500, below 9000",
                           "fix": "Set MTU 9000"}]
    result["mtu"] = 1500
    assert [c.name for c in rdma_checks(result, LAB, "enp1s0f1np1", "", None)[0]] == ["rdma"]
    assert [c.name for c in rdma_checks(result, LAB, "eth9", "", None)[0]] == ["rdma", "rdma.mtu", "rdma.netdev"]


def test_rdma_skip_and_module_failure():
    checks, detected = rdma_checks(None, Settings(lab=True, rdma_skip=True), "x", "", None)
    assert [(c.name, c.status) for c in checks] == [("rdma", SKIPPED)]
    assert detected == {"ib_hca": "", "gid_index": None}
    failed = {"failed": True, "msg": "/sys does not look like a sysfs tree (no class/net under it)"}
    checks, _detected = rdma_checks(failed, LAB, "x", "", None)
    assert [(c.name, c.status) for c in checks] == [("rdma", FAIL)]
    assert "no class/net" in checks[0].evidence


def test_rdma_no_hca_in_the_lab_points_at_the_recorded_tree():
    result = dict(rdma("lab_head", "10.77.1.11"), problems=[
        {"check": "no_hca", "severity": "error", "message": "No RDMA device", "fix": "Load mlx5_ib."}],
        gid_index=None)
    checks, _detected = rdma_checks(result, LAB, "enp1s0f1np1", "", None)
    assert checks[0].name == "rdma.no_hca"
    assert "preflight_sysfs_root" in checks[0].fix
    assert "preflight_sysfs_root" not in rdma_checks(result, SPARK, "enp1s0f1np1", "", None)[0][0].fix


@pytest.mark.parametrize(("pin_hca", "pin_gid", "expected"), [
    ("", 3, []),
    ("", "3", []),
    ("", 4, [("pin.gid_index", FAIL)]),
    ("roceP2p1s0f1,rocep1s0f1", None, []),
    ("rocep1s0f1", None, [("pin.ib_hca", WARN)]),
])
def test_pins_against_detected(pin_hca, pin_gid, expected):
    checks, _detected = rdma_checks(rdma("lab_head", "10.77.1.11"), LAB, "enp1s0f1np1", pin_hca, pin_gid)
    assert [(c.name, c.status) for c in checks if c.name.startswith("pin.")] == expected


# ---------------------------------------------------------------- who can reach the API (api_exposure)

KEYLESS = Exposure(host="0.0.0.0", host_source="profile glm53_flash_nvfp4")


@pytest.mark.parametrize(("exposure", "status"), [
    (Exposure(host="127.0.0.1"), PASS),
    (Exposure(host="127.0.0.53"), PASS),                            # all of 127.0.0.0/8
    (Exposure(host="::1"), PASS),
    (Exposure(host="::ffff:127.0.0.1"), PASS),
    (Exposure(host="localhost"), PASS),
    (Exposure(host="127.0.0.1", require_api_key=True), PASS),      # strictness is about what lies beyond loopback
    (Exposure(host="0.0.0.0", api_key_set=True), PASS),
    (Exposure(host="0.0.0.0", api_key_set=True, require_api_key=True, firewall=False), PASS),
    (KEYLESS, WARN),
    (Exposure(host="::"), WARN),
    (Exposure(host="10.77.0.11"), WARN),                           # one address, still beyond the node
    (Exposure(host=""), WARN),                                     # vLLM's default: every interface
    (Exposure(host="128.0.0.1"), WARN),
    (Exposure(host="0.0.0.0", require_api_key=True), FAIL),
    (Exposure(host="0.0.0.0", require_api_key=True, firewall=False), FAIL),
    (Exposure(host="127.0.0.1", launcher="exl3_kit"), WARN),       # the kit binds 0.0.0.0 whatever settings.host says
    (Exposure(host="127.0.0.1", launcher="exl3_kit", require_api_key=True), FAIL),
    (Exposure(host="127.0.0.1", launcher="exl3_kit", api_key_set=True), PASS),
])
def test_api_exposure(exposure, status):
    check = api_exposure_check(exposure, 8000)
    assert (check.name, check.status) == ("api_exposure", status)
    assert bool(check.fix) is (status != PASS)


def test_api_on_loopback_says_nothing_beyond_the_head_reaches_it():
    check = api_exposure_check(Exposure(host="::1", host_source="dgxspark_vllm_settings"), 8000)
    assert check.evidence == ("The API listens on [::1]:8000 (settings.host, from dgxspark_vllm_settings): loopback "
                              "only, nothing beyond the head reaches it.")
    assert check.data["loopback"] is True


def test_api_without_a_key_warns_naming_the_variables_and_the_firewall():
    check = api_exposure_check(KEYLESS, 8000)
    assert check.evidence == (
        "The API listens on 0.0.0.0:8000 (every interface; settings.host, from profile glm53_flash_nvfp4) without an "
        "API key (dgxspark_vllm_api_key is unset): the collection's firewall (dgxspark_vllm_firewall) admits port "
        "8000 only from the controller's address (dgxspark_vllm_api_allowed_cidrs unset) and the nodes, "
        "and whoever reaches it can use the model.")
    assert check.fix.startswith("Set dgxspark_vllm_api_key (from a vault)")
    assert "dgxspark_vllm_require_api_key: true makes this an error." in check.fix
    assert "dgxspark_vllm_settings: {host: 127.0.0.1}" in check.fix


@pytest.mark.parametrize(("firewall", "cidrs", "text"), [
    (True, ("192.168.1.0/24", "10.1.0.0/16"),
     "the collection's firewall (dgxspark_vllm_firewall) admits port 8000 only from 192.168.1.0/24, 10.1.0.0/16 and "
     "the nodes"),
    (True, (), "only from the controller's address (dgxspark_vllm_api_allowed_cidrs unset)"),
    (False, ("192.168.1.0/24",), "the firewall is off (dgxspark_vllm_firewall: false), so every network that reaches "
                                 "the head reaches port 8000"),
])
@pytest.mark.parametrize("key", [True, False])
def test_api_exposure_names_what_the_firewall_lets_through(firewall, cidrs, text, key):
    check = api_exposure_check(Exposure(host="0.0.0.0", api_key_set=key, firewall=firewall, api_allowed_cidrs=cidrs),
                               8000)
    assert text in check.evidence
    # the key guards /v1 only: the evidence must not say more (vLLM's /health and /metrics answer without it)
    assert ("answers /v1 requests only with the API key; its other routes (/health, /metrics, /version, /tokenize) "
            "answer without it" in check.evidence) is key
    assert check.data["api_allowed_cidrs"] == list(cidrs)


def test_api_exposure_strict_fails_and_says_how_to_relax():
    check = api_exposure_check(Exposure(host="0.0.0.0", require_api_key=True, firewall=False), 8000)
    assert check.status == FAIL
    assert check.evidence.endswith("dgxspark_vllm_require_api_key is true, so an API without a key is refused.")
    assert "the firewall is off" in check.evidence
    assert "Set dgxspark_vllm_api_key" in check.fix
    assert "dgxspark_vllm_require_api_key: false" in check.fix


def test_api_exposure_of_the_kit_is_its_own_0_0_0_0_and_offers_no_loopback():
    check = api_exposure_check(Exposure(host="127.0.0.1", launcher="exl3_kit"), 8888)
    assert check.evidence.startswith("The API listens on 0.0.0.0:8888 (every interface; the EXL3 kit's start.sh "
                                     "binds it, whatever the settings say) without an API key")
    assert "127.0.0.1" not in check.fix
    assert check.data["host"] == "0.0.0.0"


def test_api_exposure_is_decided_once_on_the_head():
    nodes = [lab_node("lab-worker"), lab_node("lab-head")]
    result = evaluate(nodes, LAB, Exposure(host="0.0.0.0", require_api_key=True))
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("lab-head", "api_exposure")]
    assert "api_exposure" not in statuses(result["reports"]["lab-worker"])
    assert result["reports"]["lab-head"]["checks"][-1]["name"] == "api_exposure"
    assert "- lab-head api_exposure: The API listens on 0.0.0.0:8000" in result["message"]
    warned = evaluate(nodes, LAB, Exposure(host="0.0.0.0"))
    assert warned["ok"] is True
    assert statuses(warned["reports"]["lab-head"])["api_exposure"] == WARN
    assert "  WARN api_exposure" in warned["summary"]
    assert "fix: Set dgxspark_vllm_api_key" in warned["summary"]
    # without the exposure settings (the interface-only call) it is not decided at all
    assert all("api_exposure" not in statuses(r) for r in evaluate(nodes, LAB)["reports"].values())


def test_api_exposure_without_a_head_goes_to_the_first_node():
    result = evaluate([{"name": "a"}, {"name": "b"}], LAB, Exposure(host="127.0.0.1"))
    assert statuses(result["reports"]["a"]) == {"api_exposure": PASS}
    assert statuses(result["reports"]["b"]) == {}


# ---------------------------------------------------------------- who can read the secrets (secret_files)

def run_secret_probe(*paths: str) -> dict[str, Any]:
    """SECRET_FILES_PROBE run for real over local files, registered as the command module would."""
    done = subprocess.run(["bash", "-c", SECRET_FILES_PROBE, "dgxspark-secret-files", *paths], capture_output=True,
                          text=True, check=False)
    return cmd(done.stdout, done.returncode, done.stderr)


def secret(tmp_path: pathlib.Path, name: str, mode: int) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("hf_not_a_real_token\n")
    path.chmod(mode)
    return str(path)


def test_the_role_runs_the_same_secret_probe():
    """roles/preflight/tasks/probe.yml carries SECRET_FILES_PROBE verbatim, and its paths are the role's list."""
    tasks = yaml.safe_load((ROLE / "tasks" / "probe.yml").read_text(encoding="utf-8"))
    task = next(t for t in tasks if t.get("register") == "__preflight_secret_files")
    assert task["vars"]["__preflight_secret_probe"] == ["bash", "-c", SECRET_FILES_PROBE, "dgxspark-secret-files"]
    assert task["ansible.builtin.command"]["argv"] == "{{ __preflight_secret_probe + preflight_secret_paths }}"
    assert (task["check_mode"], task["changed_when"], task["failed_when"]) == (False, False, False)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    assert defaults["preflight_secret_paths"] == [
        "{{ dgxspark_vllm_config.hf_home }}/token", "{{ dgxspark_vllm_config.hf_home }}/stored_tokens",
        "/run/dgxspark/hf-token*", "/run/dgxspark-kit/start.env",
        "{{ kit_launch_dir | default('/opt/dgxspark/exl3-kit') }}/.env"]


@pytest.mark.parametrize(("mode", "status", "readers"), [
    (0o600, PASS, ""),
    (0o400, PASS, ""),
    (0o700, PASS, ""),
    (0o644, FAIL, "group and others"),
    (0o640, FAIL, "group"),
    (0o604, FAIL, "others"),
    (0o660, FAIL, "group"),
    (0o4604, FAIL, "others"),
])
def test_secret_file_modes(tmp_path, mode, status, readers):
    path = secret(tmp_path, "huggingface/token", mode)
    check = secret_files_check(run_secret_probe(path))
    assert (check.name, check.status) == ("secret_files", status)
    assert check.data["files"][0]["mode"] == "%04o" % mode
    assert check.data["files"][0]["readable_by"] == readers
    if status == FAIL:
        assert check.evidence.startswith("%s (mode %04o, " % (path, mode))
        assert "is readable by %s: it may hold the HF token or the API key." % readers in check.evidence
        assert check.fix.startswith("`chmod 600 %s` on this node" % path)
    else:
        assert "owner only: %s (mode %04o, " % (path, mode) in check.evidence


def test_missing_secret_files_pass(tmp_path):
    check = secret_files_check(run_secret_probe(str(tmp_path / "hf" / "token"), str(tmp_path / "run" / "hf-token*"),
                                                str(tmp_path / "not-a-dir" / ".env")))
    assert check.status == PASS
    assert check.evidence == ("No file that may hold the HF token or the API key is readable by group or others (not "
                              "there: %s/hf/token, %s/run/hf-token*, %s/not-a-dir/.env)." % ((tmp_path,) * 3))
    assert check.data["files"] == [] and check.data["errors"] == []


def test_a_glob_names_every_token_file_and_each_readable_one_fails(tmp_path):
    open_one = secret(tmp_path, "run/hf-token.1234", 0o644)
    closed = secret(tmp_path, "run/hf-token", 0o600)
    secret(tmp_path, "run/staging.lock", 0o644)            # not a token file: not matched
    spaced = secret(tmp_path, "kit dir/.env", 0o640)
    check = secret_files_check(run_secret_probe(str(tmp_path / "run" / "hf-token*"), spaced))
    assert check.status == FAIL
    assert sorted(f["path"] for f in check.data["files"]) == sorted([open_one, closed, spaced])
    assert closed + " (mode" not in check.evidence
    assert "chmod 600 %s '%s'" % (open_one, spaced) in check.fix   # quoted for the shell


def test_a_symlink_is_judged_by_its_target(tmp_path):
    target = secret(tmp_path, "real-token", 0o600)
    link = tmp_path / "token"
    link.symlink_to(target)                                 # the link itself is 0777
    assert secret_files_check(run_secret_probe(str(link))).status == PASS
    os.chmod(target, 0o644)
    assert secret_files_check(run_secret_probe(str(link))).status == FAIL


def test_a_directory_is_not_judged(tmp_path):
    folder = tmp_path / "hf-token.d"
    folder.mkdir(mode=0o755)
    check = secret_files_check(run_secret_probe(str(folder)))
    assert check.status == PASS
    assert "not a regular file, not judged: %s (directory)" % folder in check.evidence


def test_parse_secret_files():
    found = parse_secret_files(SECRETS_NONE + "pattern\t/x/token\nfile\t644\troot\troot\tregular file\t/x/token\n")
    assert [pattern for pattern, _files in found] == [
        "/var/tmp/cache/huggingface/token", "/var/tmp/cache/huggingface/stored_tokens", "/run/dgxspark/hf-token*",
        "/opt/dgxspark/exl3-kit/.env", "/x/token"]
    assert found[2][1] == []
    assert found[0][1][0].absent is True
    token = found[4][1][0]
    assert (token.path, token.mode, token.owner, token.readers, token.regular) == (
        "/x/token", 0o644, "root", "group and others", True)
    with pytest.raises(PreflightError, match="before any path"):
        parse_secret_files("file\t600\troot\troot\tregular file\t/x\n")


@pytest.mark.parametrize(("probe", "text"), [
    (cmd("pattern\t/root/.cache/huggingface/token\nerror\t/root/.cache/huggingface/token\tstat: cannot statx "
         "'/root/.cache/huggingface/token': Permission denied\n"), "Permission denied"),
    (cmd(rc=127, stderr="bash: not found"), "failed (rc 127): bash: not found"),
    (cmd("pattern\t/x\nfile\trw-r--r--\troot\troot\tregular file\t/x\n"), "unreadable line"),
])
def test_secret_files_unknown_warn(probe, text):
    check = secret_files_check(probe)
    assert check.status == WARN
    assert text in check.evidence
    assert check.fix


def test_secret_files_fail_on_their_node_only():
    exposed = cmd("pattern\t/var/tmp/cache/huggingface/token\n"
                  "file\t644\troot\troot\tregular file\t/var/tmp/cache/huggingface/token\n")
    result = evaluate([lab_node("lab-head"), lab_node("lab-worker", secret_files=exposed)], LAB)
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("lab-worker", "secret_files")]
    assert result["failures"][0]["evidence"] == (
        "/var/tmp/cache/huggingface/token (mode 0644, root:root) is readable by group and others: it may hold the HF "
        "token or the API key.")
    assert "`chmod 600 /var/tmp/cache/huggingface/token` on this node" in result["message"]
    assert statuses(result["reports"]["lab-head"])["secret_files"] == PASS


# ---------------------------------------------------------------- the whole run

def test_lab_run_passes_and_detects_per_node():
    result = evaluate([lab_node("lab-head"), lab_node("lab-worker")], LAB)
    assert result["ok"] is True, result["message"]
    assert result["failures"] == [] and result["message"] == ""
    assert result["detected"] == {
        "lab-head": {"cx7_iface": "enp1s0f1np1", "ib_hca": "rocep1s0f1,roceP2p1s0f1", "gid_index": 3},
        "lab-worker": {"cx7_iface": "enP2p1s0f1np1", "ib_hca": "rocep1s0f1,roceP2p1s0f1", "gid_index": 4}}
    head = result["reports"]["lab-head"]
    assert statuses(head) == {
        "cx7_ip": PASS, "cx7_interface": PASS, "cx7_mtu": PASS, "cx7_subnet": PASS, "rdma": PASS,
        "ping.lab-worker": PASS, "port.8000": PASS, "port.29521": PASS, "disk": PASS, "memory": PASS,
        "docker": PASS, "gpu_runtime": SKIPPED, "gpu": SKIPPED, "arch": SKIPPED, "gpu_free": PASS,
        "secret_files": PASS}
    assert [c["name"] for c in head["checks"]][:3] == ["cx7_ip", "cx7_interface", "cx7_mtu"]
    assert head["counts"] == {PASS: 13, FAIL: 0, WARN: 0, SKIPPED: 3}
    assert (head["schema"], head["node"], head["role"], head["ok"]) == (1, "lab-head", "head", True)
    assert head["effective"] == result["detected"]["lab-head"]
    assert json.loads(json.dumps(result)) == result  # the report is plain JSON


def test_inventory_pins_win_in_the_effective_values():
    head = lab_node("lab-head", cx7_iface="enp1s0f1np1", ib_hca="rocep1s0f1", gid_index=3)
    report = evaluate([head, lab_node("lab-worker")], LAB)["reports"]["lab-head"]
    assert report["effective"] == {"cx7_iface": "enp1s0f1np1", "ib_hca": "rocep1s0f1", "gid_index": 3}
    assert report["detected"]["ib_hca"] == "rocep1s0f1,roceP2p1s0f1"
    assert statuses(report)["pin.ib_hca"] == WARN


def test_port_fault_fails_naming_the_port_and_the_process():
    result = evaluate([lab_node("lab-head", listeners=cmd(SS_HTTP_SERVER)), lab_node("lab-worker")], LAB)
    assert result["ok"] is False
    assert [(f["node"], f["name"]) for f in result["failures"]] == [("lab-head", "port.8000")]
    assert result["message"].splitlines()[:2] == [
        "Preflight failed: 1 check(s) on 1 node(s) (lab-head). Nothing was pulled, staged or started.",
        "- lab-head port.8000: Port 8000 (API port, dgxspark_vllm_port) is held by python3 (pid 2211) on "
        "0.0.0.0:8000, not by the serve container vllm_glm53."]
    assert result["message"].splitlines()[2].startswith("  fix: Stop that process")


def test_wrong_worker_ip_fails_on_both_nodes_precisely():
    head = lab_node("lab-head", pings=[ping_result("lab-worker", "10.77.1.99", "enp1s0f1np1", PING_UNREACHABLE, 1)])
    worker = lab_node("lab-worker", cx7_ip="10.77.1.99", rdma=rdma("lab_worker", "10.77.1.99"))
    result = evaluate([head, worker], LAB)
    assert [(f["node"], f["name"]) for f in result["failures"]] == [
        ("lab-head", "ping.lab-worker"), ("lab-worker", "cx7_ip"), ("lab-worker", "rdma.gid_ipv4")]
    assert "Preflight failed: 3 check(s) on 2 node(s) (lab-head, lab-worker)." in result["message"]
    assert "enP2p1s0f1np1 carries 10.77.1.12/24" in result["message"]
    assert result["detected"]["lab-worker"] == {"cx7_iface": "enP2p1s0f1np1", "ib_hca": "", "gid_index": None}


def test_mtu_mismatch_fails_on_every_node():
    worker_addr = ip_addr(_iface(61, "eth0", "10.77.0.12"), _iface(63, "enP2p1s0f1np1", "10.77.1.12", mtu=1500))
    result = evaluate([lab_node("lab-head"), lab_node("lab-worker", ip_addr=worker_addr)], LAB)
    assert [(f["node"], f["name"]) for f in result["failures"]] == [
        ("lab-head", "cx7_mtu"), ("lab-worker", "cx7_mtu")]


def test_interface_only_call_decides_only_the_interface():
    nodes = [{"name": n["name"], "cx7_ip": n["cx7_ip"], "ip_addr": n["ip_addr"]}
             for n in (lab_node("lab-head"), lab_node("lab-worker"))]
    result = evaluate(nodes, Settings(cx7_subnet=SUBNET))
    assert statuses(result["reports"]["lab-worker"]) == {
        "cx7_ip": PASS, "cx7_interface": PASS, "cx7_mtu": PASS, "cx7_subnet": PASS}
    assert result["reports"]["lab-worker"]["effective"]["cx7_iface"] == "enP2p1s0f1np1"


def test_every_problem_on_every_node_at_once():
    head = lab_node("lab-head", listeners=cmd(SS_HTTP_SERVER), disk=disk(10 ** 9, 0), meminfo=meminfo_text(1000),
                    docker_info=cmd(rc=1, stderr=DOCKER_DOWN_STDERR))
    worker = lab_node("lab-worker", ip_addr=ip_addr(_iface(61, "eth0", "10.77.0.12")))
    result = evaluate([head, worker], LAB)
    assert sorted((f["node"], f["name"]) for f in result["failures"]) == [
        ("lab-head", "disk"), ("lab-head", "docker"), ("lab-head", "memory"), ("lab-head", "port.8000"),
        ("lab-worker", "cx7_interface"), ("lab-worker", "cx7_ip")]
    assert all(f["fix"] for f in result["failures"])
    assert statuses(result["reports"]["lab-worker"])["ping.lab-head"] == SKIPPED


def test_summary_lists_every_check_with_fixes():
    result = evaluate([lab_node("lab-head", listeners=cmd(SS_HTTP_SERVER)), lab_node("lab-worker")], LAB)
    lines = result["summary"].splitlines()
    assert lines[0] == "preflight: 2 node(s), 25 passed, 1 failed, 0 warnings, 6 skipped"
    assert "lab-head (head): CX7 enp1s0f1np1, NCCL_IB_HCA rocep1s0f1,roceP2p1s0f1, GID index 3" in lines
    assert any(line.startswith("  FAIL port.8000") for line in lines)
    assert any(line.strip().startswith("fix: Stop that process") for line in lines)
    assert any(line.startswith("  SKIP gpu_runtime") for line in lines)


@pytest.mark.parametrize(("nodes", "settings", "message"), [
    ([], LAB, "no nodes"),
    ([{"cx7_ip": "1.2.3.4"}], LAB, "every node needs a name"),
    ([{"name": "a"}, {"name": "a"}], LAB, "node names repeat"),
    ([{"name": "a"}], Settings(rdma_skip=True), "only in the lab"),
    ([{"name": "a"}], Settings(checkpoint_size_bytes=-1), "checkpoint_size_bytes must be >= 0"),
    ([{"name": "a"}], Settings(api_port=70000), "api_port must be within"),
    ([{"name": "a", "gid_index": "three"}], LAB, "not a GID index"),
    ([{"name": "a", "gid_index": True}], LAB, "not a GID index"),
])
def test_evaluate_rejects(nodes, settings, message):
    with pytest.raises(PreflightError, match=message):
        evaluate(nodes, settings)


def test_check_status_is_validated_and_bytes_are_readable():
    with pytest.raises(PreflightError, match="unknown status"):
        Check("x", "ok", "")
    assert [human_bytes(v) for v in (185 * 10 ** 9, 1500, 12, None, 2 * 10 ** 12)] == [
        "185.0 GB", "1.5 kB", "12 B", "unknown", "2.0 TB"]
    assert Link("x", "UNKNOWN", ("UP",), 1500, ()).up is False
