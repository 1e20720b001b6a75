# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _node_state: the one-pass read of a node's serve state (commands answered by a fake)."""
from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _node_state as ns

INSPECT = json.dumps([{"Id": "c0ffee", "State": {"Running": True, "ExitCode": 0, "StartedAt": "2026-12-01T07:05:12Z"},
                       "Config": {"Labels": {ns.CONFIG_HASH_LABEL: "abc123", "other": "x"}}}])


class Fake:
    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        for key, answer in self.answers.items():
            if key in " ".join(argv):
                return answer
        raise AssertionError("unexpected %r" % (argv,))


def test_a_running_serve_with_its_hash_image_gpu_stamp_and_no_lock() -> None:
    fake = Fake({"container inspect": (0, INSPECT, ""), "image inspect": (0, "sha256:1111\n", ""),
                 "nvidia-smi": (0, "NVIDIA GB10, 580.95.05, [N/A]\n", "")})
    state = ns.read_state(fake, "docker", "vllm_glm53", "vllm-node:latest", "nvidia-smi",
                          '{"repo": "r", "commit": "%s"}' % ("a" * 40), "/m/.dgxspark-stamp.json", False)
    assert state["container"] == {"exists": True, "running": True, "id": "c0ffee", "exit_code": 0,
                                  "config_hash": "abc123", "started_at": "2026-12-01T07:05:12Z"}
    assert state["image_id"] == "sha256:1111"
    assert state["gpu"] == {"gpu_name": "NVIDIA GB10", "driver": "580.95.05", "gpu_memory": "[N/A]"}
    assert state["stamp"] == {"repo": "r", "commit": "a" * 40}
    assert state["staging_lock"] is False
    assert fake.calls[1] == ["docker", "image", "inspect", "--format", "{{.Id}}", "vllm-node:latest"]


def test_nothing_there_yet() -> None:
    fake = Fake({"container inspect": (1, "[]", "Error: No such container: vllm_glm53"),
                 "image inspect": (1, "[]", "Error: No such image: vllm-node:latest")})
    state = ns.read_state(fake, "docker", "vllm_glm53", "vllm-node:latest", None, None, "/m/.dgxspark-stamp.json", True)
    assert state["container"]["exists"] is False and state["container"]["config_hash"] is None
    assert state["image_id"] is None
    assert state["gpu"] is None             # no nvidia-smi (the lab)
    assert state["stamp"] is None           # no stamp file
    assert state["staging_lock"] is True


def test_a_stopped_container_without_labels() -> None:
    stopped = json.dumps([{"Id": "d1", "State": {"Running": False, "ExitCode": 137}, "Config": {"Labels": None}}])
    fake = Fake({"container inspect": (0, stopped, "")})
    state = ns.read_state(fake, "docker", "vllm_glm53", None, None, None, None, None)
    assert state["container"]["running"] is False and state["container"]["exit_code"] == 137
    assert state["container"]["config_hash"] is None
    assert state["image_id"] is None and state["stamp"] is None and state["staging_lock"] is None
    assert len(fake.calls) == 1             # nothing asked, nothing run


@pytest.mark.parametrize("what", ["container inspect", "image inspect"])
def test_an_unreachable_docker_is_an_error_naming_the_fix(what: str) -> None:
    answers = {"container inspect": (0, INSPECT, ""), "image inspect": (0, "sha256:1\n", "")}
    answers[what] = (1, "", "permission denied while trying to connect to the Docker daemon socket")
    with pytest.raises(ns.NodeStateError, match="permission denied.*dockerd running"):
        ns.read_state(Fake(answers), "docker", "vllm_glm53", "img", None, None, None, None)


def test_a_failing_nvidia_smi_reads_as_no_gpu() -> None:
    assert ns.parse_gpu(9, "NVIDIA-SMI has failed") is None
    assert ns.parse_gpu(0, "NVIDIA GB10\n") == {"gpu_name": "NVIDIA GB10", "driver": None, "gpu_memory": None}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_broken_stamp_says_to_stage_again(text: str) -> None:
    with pytest.raises(ns.NodeStateError, match="re-run the checkpoint staging"):
        ns.parse_stamp(text, "/m/.dgxspark-stamp.json")


def test_garbage_from_docker_inspect_is_an_error() -> None:
    with pytest.raises(ns.NodeStateError, match="no JSON"):
        ns.parse_container("<html>")


def test_mem_total_as_the_memtotal_mb_fact() -> None:
    meminfo = "MemTotal:       127535204 kB\nMemFree:         1000 kB\n"
    assert ns.mem_total_mb(meminfo) == 127535204 // 1024
    assert ns.mem_total_mb("MemFree: 1 kB\n") is None
    assert ns.read_state(Fake({"container inspect": (1, "", "No such container: x")}), "docker", "x", None, None,
                         None, None, None, meminfo)["mem_total_mb"] == 124546


IP_JSON = json.dumps([
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "192.168.1.20", "prefixlen": 24}]},
    {"ifname": "enp1s0f0np0", "addr_info": [
        {"family": "inet", "local": "10.0.0.5", "prefixlen": 24},
        {"family": "inet", "local": "192.168.100.10", "prefixlen": 24, "secondary": True}]},
    {"ifname": "enp1s0f1np1", "addr_info": []},
    {"ifname": "wlP9s9", "addr_info": [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
])


def test_ipv4_addresses_keep_every_address_of_each_interface_and_skip_those_without() -> None:
    assert ns.parse_ipv4_addresses(IP_JSON) == {"lo": ["127.0.0.1"], "enP7s7": ["192.168.1.20"],
                                                "enp1s0f0np0": ["10.0.0.5", "192.168.100.10"]}


def test_the_cx7_ip_is_found_on_a_secondary_address_and_compared_as_an_address() -> None:
    addresses = ns.parse_ipv4_addresses(IP_JSON)
    assert ns.interface_with_ip(addresses, "192.168.100.10") == "enp1s0f0np0"
    assert ns.interface_with_ip(addresses, " 192.168.1.20 ") == "enP7s7"
    assert ns.interface_with_ip(addresses, "192.168.100.11") is None


def test_a_cx7_ip_that_is_not_an_address_names_the_variable() -> None:
    with pytest.raises(ns.NodeStateError, match="dgxspark_vllm_cx7_ip"):
        ns.interface_with_ip({}, "192.168.100")


@pytest.mark.parametrize("text", ["not json", '{"ifname": "x"}'])
def test_ip_output_that_is_not_a_json_list_is_an_error(text: str) -> None:
    with pytest.raises(ns.NodeStateError, match="ip -j -4 addr show"):
        ns.parse_ipv4_addresses(text)


def test_no_interface_message_lists_what_the_node_has_and_every_fix() -> None:
    msg = ns.no_interface_message("192.168.100.10", ns.parse_ipv4_addresses(IP_JSON))
    assert "192.168.100.10" in msg
    assert "enp1s0f0np0 10.0.0.5/192.168.100.10" in msg and "enP7s7 192.168.1.20" in msg
    for fix in ("dgxspark_vllm_cx7_ip", "dgxspark_vllm_cx7_iface", "address the CX7 port"):
        assert fix in msg
    assert "IPv4 interfaces: none" in ns.no_interface_message("192.168.100.10", {})


def test_without_a_container_or_image_nothing_runs_and_docker_is_not_needed() -> None:
    fake = Fake({})
    state = ns.read_state(fake, None, None, None, None, None, None, None, "MemTotal: 2048 kB\n")
    assert fake.calls == []
    assert state["container"] is None and state["image_id"] is None and state["mem_total_mb"] == 2


@pytest.mark.parametrize(("container", "image"), [("vllm_glm53", None), (None, "vllm-node:latest")])
def test_a_container_or_image_read_without_docker_says_so(container: str | None, image: str | None) -> None:
    with pytest.raises(ns.NodeStateError, match="docker CLI is not installed"):
        ns.read_state(Fake({}), None, container, image, None, None, None, None)


@pytest.mark.parametrize(("answer", "expected"), [
    ((0, "table inet dgxspark {\n\tchain input {\n\t}\n}\n", ""), {"present": True, "why": ""}),
    ((1, "", "Error: No such file or directory"), {"present": False, "why": "the table inet dgxspark is not loaded"}),
    ((0, "table inet dgxspark {\n}\n", ""), {"present": False, "why": "the table inet dgxspark has no input chain"}),
])
def test_the_firewall_table_is_read_when_asked(answer, expected) -> None:
    fake = Fake({"list table": answer})
    state = ns.read_state(fake, "docker", None, None, None, None, None, None, "", "inet dgxspark", "/usr/sbin/nft")
    assert state["firewall"] == expected
    assert fake.calls == [["/usr/sbin/nft", "list", "table", "inet", "dgxspark"]]


def test_no_nft_is_no_table_and_an_unasked_read_is_none() -> None:
    fake = Fake({})
    assert ns.read_state(fake, None, None, None, None, None, None, None, "", "inet dgxspark", None)["firewall"] == {
        "present": False, "why": "nft is not installed"}
    assert ns.read_state(fake, None, None, None, None, None, None, None)["firewall"] is None
    assert fake.calls == []
