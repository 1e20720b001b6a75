# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from helpers.profiles import PROFILES
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    HASH_LABEL,
    SpecError,
    config_hash,
    docker_run_argv,
    parse_args,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import render_spec as _render_spec

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "recipe_nvfp4_command.txt"

HEAD_IP = "192.168.100.11"
WORKER_IP = "192.168.100.12"
SUBNET = "192.168.100.0/24"
IFACE = "enp1s0f1np1"
HCA = "rocep1s0f1,roceP2p1s0f1"
KV_BYTES = 41875931136


def render_spec(profile: str, nodes: Any, node: str, settings: Any = None, api_key: str | None = None):
    """The render of a built-in profile (profiles/*.yml), by name."""
    return _render_spec(PROFILES[profile], nodes, node, settings, api_key)


def cluster() -> list[dict[str, Any]]:
    return [
        {"name": "spark1", "cx7_ip": HEAD_IP, "head": True},
        {"name": "spark2", "cx7_ip": WORKER_IP},
    ]


def nvfp4_settings(**extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"cx7_subnet": SUBNET, "cx7_iface": IFACE, "ib_hca": HCA,
                                "kv_cache_memory_bytes": KV_BYTES}
    settings.update(extra)
    return settings


def render(node: str = "spark1", nodes: list[dict[str, Any]] | None = None, profile: str = "glm53_flash_nvfp4",
           api_key: str | None = None, **settings: Any):
    return render_spec(profile, cluster() if nodes is None else nodes, node, nvfp4_settings(**settings), api_key)


def recipe_argv(rank: int, this_ip: str, headless: bool) -> list[str]:
    """The recipe's docker run, placeholders substituted with this test's values."""
    text = FIXTURE.read_text()
    variables = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Z_]+)=(.*)$", line)
        if match:
            variables[match.group(1)] = shlex.split(match.group(2), comments=True)[0]
    command = text[text.index("docker run"):].replace("\\\n", " ")
    # the recipe's abbreviated flag, rendered under vLLM's real name (notes/vllm-facts.md)
    command = command.replace("--kv-cache-memory <BYTES>", f"--kv-cache-memory-bytes {KV_BYTES}")
    # the collection's one addition to the recipe's container options: its json-file log rotates (issue 20)
    command = command.replace("--restart no ", "--restart no --log-driver json-file --log-opt max-size=100m "
                                               "--log-opt max-file=5 ", 1)
    # and its one omission: --trust-remote-code, which GLM-5.3-Flash does not need (its architecture is native in
    # vLLM; the profile's trust_remote_code says why, issue 39)
    assert "--trust-remote-code " in command
    command = command.replace("--trust-remote-code ", "", 1)
    for placeholder, value in {
        "<THIS_NODE_CX7_IP>": this_ip,
        "<HCA_NAMES>": HCA,
        "<CX7_SUBNET_CIDR>": SUBNET,
        "<CX7_IFACE>": IFACE,
        "<HEAD_CX7_IP>": HEAD_IP,
        "<0 on head, 1 on worker>": str(rank),
    }.items():
        assert placeholder in command, placeholder
        command = command.replace(placeholder, value)
    for name, value in variables.items():
        command = command.replace(f"${name}", value)
    assert "<" not in command and "$" not in command
    argv = shlex.split(command)
    return argv + ["--headless"] if headless else argv


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# --------------------------------------------------------------------------- the recipe, byte for byte


@pytest.mark.parametrize("node, rank, ip, headless", [
    ("spark1", 0, HEAD_IP, False),
    ("spark2", 1, WORKER_IP, True),
])
def test_recipe_command_byte_for_byte(node: str, rank: int, ip: str, headless: bool) -> None:
    spec = render(node)
    expected = recipe_argv(rank, ip, headless)
    assert shlex.split(spec.command_line) == expected
    assert spec.command_line == shlex.join(expected)
    assert (spec.rank, spec.headless, spec.role) == (rank, headless, "worker" if headless else "head")


@pytest.mark.parametrize("node, rank, ip, headless", [
    ("spark1", 0, HEAD_IP, False),
    ("spark2", 1, WORKER_IP, True),
])
def test_recipe_container_matches_command(node: str, rank: int, ip: str, headless: bool) -> None:
    container = render(node).container
    argv = recipe_argv(rank, ip, headless)
    env = [argv[i + 1] for i, token in enumerate(argv) if token == "-e"]
    assert [f"{name}={value}" for name, value in container["env"].items()] == env
    image_at = argv.index("ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8")
    assert container["image"] == argv[image_at]
    assert container["command"] == argv[image_at + 1:]
    assert container["volumes"] == [argv[i + 1] for i, token in enumerate(argv) if token == "-v"]
    assert container["devices"] == ["/dev/infiniband:/dev/infiniband"]
    assert container["ulimits"] == ["memlock:-1:-1"]
    assert container["capabilities"] == ["IPC_LOCK"]
    assert (container["ipc_mode"], container["network_mode"], container["shm_size"]) == ("host", "host", "32g")
    assert container["restart_policy"] == "no"
    assert container["name"] == "vllm_glm53"
    assert container["device_requests"] == [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    assert all(isinstance(value, str) for value in container["env"].values())
    assert container["labels"] == {
        "dgxspark.vllm.config_hash": render(node).config_hash,
        "dgxspark.vllm.rank": str(rank),
        "dgxspark.vllm.role": "worker" if headless else "head",
        "dgxspark.vllm.profile": "glm53_flash_nvfp4",
    }


def test_head_and_worker_differ_only_where_the_recipe_says() -> None:
    head, worker = render("spark1").command_line.split(), render("spark2").command_line.split()
    assert worker[-1] == "--headless" and "--headless" not in head
    assert len(worker) == len(head) + 1
    differences = [(a, b) for a, b in zip(head, worker[:-1]) if a != b]
    assert differences == [(f"VLLM_HOST_IP={HEAD_IP}", f"VLLM_HOST_IP={WORKER_IP}"), ("0", "1")]
    assert flag_value(render("spark2").container["command"], "--node-rank") == "1"


def test_workers_keep_host_and_port() -> None:
    command = render("spark2").container["command"]
    assert flag_value(command, "--host") == "0.0.0.0" and flag_value(command, "--port") == "8000"


def test_kv_flag_omitted_while_unknown() -> None:
    command = render(kv_cache_memory_bytes=None).container["command"]
    assert not any(token.startswith("--kv-cache-memory") for token in command)
    assert "--kv-cache-dtype" in command


# --------------------------------------------------------------------------- nodes, ranks, N=4


def four_nodes(ranks: bool = False) -> list[dict[str, Any]]:
    nodes = [
        {"name": "w1", "cx7_ip": "192.168.100.21"},
        {"name": "head", "cx7_ip": "192.168.100.20", "head": True},
        {"name": "w2", "cx7_ip": "192.168.100.22"},
        {"name": "w3", "cx7_ip": "192.168.100.23"},
    ]
    if ranks:
        for node, rank in zip(nodes, (3, 0, 1, 2)):
            node["rank"] = rank
    return nodes


@pytest.mark.parametrize("ranks, expected", [
    (False, {"head": 0, "w1": 1, "w2": 2, "w3": 3}),
    (True, {"head": 0, "w1": 3, "w2": 1, "w3": 2}),
])
def test_four_nodes(ranks: bool, expected: dict[str, int]) -> None:
    for name, rank in expected.items():
        spec = render(name, nodes=four_nodes(ranks))
        command = spec.container["command"]
        assert spec.rank == rank
        assert flag_value(command, "--node-rank") == str(rank)
        assert flag_value(command, "--nnodes") == "4"
        assert flag_value(command, "--tensor-parallel-size") == "4"
        assert "--pipeline-parallel-size" not in command
        assert flag_value(command, "--master-addr") == "192.168.100.20"
        assert (command[-1] == "--headless") == (name != "head")
        assert command.count("--headless") == (0 if name == "head" else 1)
        assert spec.container["labels"]["dgxspark.vllm.rank"] == str(rank)


def test_four_nodes_pipeline_two() -> None:
    command = render("w2", nodes=four_nodes(), pipeline_parallel_size=2).container["command"]
    at = command.index("--tensor-parallel-size")
    assert command[at:at + 4] == ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]


@pytest.mark.parametrize("settings, tp", [
    ({"gpus_per_node": 2}, "4"),
    ({"tensor_parallel_size": 2}, "2"),
    ({"tensor_parallel_size": 1, "pipeline_parallel_size": 2}, "1"),
])
def test_parallel_sizes(settings: dict[str, Any], tp: str) -> None:
    assert flag_value(render(**settings).container["command"], "--tensor-parallel-size") == tp


def test_per_node_network_identity() -> None:
    nodes = cluster()
    nodes[1].update(cx7_iface="enP2p1s0f1np1", ib_hca="roceP2p1s0f1", gid_index=4)
    head, worker = render("spark1", nodes=nodes, gid_index=5).container, render("spark2", nodes=nodes).container
    assert head["env"]["NCCL_SOCKET_IFNAME"] == IFACE and head["env"]["NCCL_IB_HCA"] == HCA
    assert head["env"]["NCCL_IB_GID_INDEX"] == "5"
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MN_IF_NAME"):
        assert worker["env"][name] == "enP2p1s0f1np1"
    assert worker["env"]["NCCL_IB_HCA"] == "roceP2p1s0f1"
    assert worker["env"]["NCCL_IB_GID_INDEX"] == "4"
    assert worker["env"]["NCCL_IB_ADDR_RANGE"] == SUBNET


def test_gid_index_zero_on_a_node_is_kept() -> None:
    nodes = cluster()
    nodes[1]["gid_index"] = 0
    assert render("spark2", nodes=nodes).container["env"]["NCCL_IB_GID_INDEX"] == "0"


def test_master_addr_equal_to_head_is_accepted() -> None:
    assert flag_value(render(master_addr=HEAD_IP).container["command"], "--master-addr") == HEAD_IP


# --------------------------------------------------------------------------- validation


def _nodes(*changes: tuple[int, dict[str, Any]]) -> list[dict[str, Any]]:
    nodes = cluster()
    for index, change in changes:
        nodes[index].update(change)
    return nodes


@pytest.mark.parametrize("kwargs, message", [
    ({"profile": "glm53_flash_exl3"}, r"profile glm53_flash_exl3 is started by its exl3_kit launcher, not rendered"),
    ({"node": "spark9"}, r"node 'spark9' is not in nodes \(spark1, spark2\)"),
    ({"nodes": []}, r"nodes must be a non-empty list"),
    ({"nodes": _nodes((0, {"rank": 0}))}, r"some nodes give a rank and some do not \(no rank: spark2\)"),
    ({"nodes": _nodes((0, {"rank": 0}), (1, {"rank": 0}))}, r"nodes\[\]\.rank has duplicates \[0\]"),
    ({"nodes": _nodes((0, {"rank": 0}), (1, {"rank": 2}))}, r"must be exactly 0\.\.1 \(contiguous\), got \[0, 2\]"),
    ({"nodes": _nodes((0, {"rank": 1}), (1, {"rank": 0}))}, r"the head spark1 has rank 1: the head must be rank 0"),
    ({"nodes": _nodes((0, {"head": False}))}, r"no node has head: true"),
    ({"nodes": _nodes((1, {"head": True}))}, r"2 nodes have head: true \(spark1, spark2\)"),
    ({"nodes": _nodes((1, {"name": "spark1"}))}, r"duplicate name 'spark1'"),
    ({"nodes": _nodes((1, {"cx7_ip": HEAD_IP}))}, r"duplicate cx7_ip '192\.168\.100\.11'"),
    ({"nodes": _nodes((1, {"cx7_ip": "192.168.100.300"}))},
     r"nodes\[1\] \(spark2\)\.cx7_ip must be an IP address"),
    ({"nodes": _nodes((1, {"cx7_ip": None}))}, r"nodes\[1\] \(spark2\)\.cx7_ip must be a non-empty string"),
    ({"nodes": _nodes((1, {"hostname": "x"}))}, r"nodes\[1\] has unknown key\(s\): hostname"),
    ({"nodes": _nodes((1, {"rank": "one"}))}, r"nodes\[1\] \(spark2\)\.rank must be an integer"),
    ({"nodes": _nodes((1, {"gid_index": -1}))}, r"\.gid_index must be >= 0"),
    ({"nodes": _nodes((1, {"ib_hca": "mlx5_0, mlx5_1"}))}, r"\.ib_hca must not contain whitespace"),
    ({"nodes": _nodes((1, {"cx7_ip": "192.168.200.12"}))},
     r"the cx7_ip of spark2, 192\.168\.200\.12, is outside settings\.cx7_subnet 192\.168\.100\.0/24"),
    ({"master_addr": WORKER_IP}, r"settings\.master_addr 192\.168\.100\.12 is not the head's cx7_ip \(spark1: "),
    ({"master_addr": "spark1.local"}, r"settings\.master_addr must be an IP address"),
    ({"host": "localhost"}, r"settings\.host must be an IP address"),
    ({"cx7_subnet": "192.168.100.0"}, r"settings\.cx7_subnet must be a CIDR network"),
    ({"cx7_subnet": "192.168.100.5/24"}, r"did you mean 192\.168\.100\.0/24\?"),
    ({"tensor_parallel_size": 4}, r"tensor_parallel_size x pipeline_parallel_size = 4 x 1 must equal nodes x "
                                  r"gpus_per_node = 2 x 1 = 2"),
    ({"pipeline_parallel_size": 3}, r"settings\.pipeline_parallel_size 3 does not divide the 2 GPUs"),
    ({"gpus_per_node": 0}, r"settings\.gpus_per_node must be >= 1"),
    ({"gpu_memory_utilization": 0.87}, r"settings\.gpu_memory_utilization is 0\.87, above 0\.85.*"
                                       r"allow_high_gpu_memory_utilization: true"),
    ({"gpu_memory_utilization": 0}, r"settings\.gpu_memory_utilization must be in \(0, 1\], got 0"),
    ({"gpu_memory_utilization": 1.2, "allow_high_gpu_memory_utilization": True}, r"must be in \(0, 1\], got 1\.2"),
    ({"gpu_memory_utilization": "lots"}, r"settings\.gpu_memory_utilization must be a number"),
    ({"allow_high_gpu_memory_utilization": "yes"}, r"allow_high_gpu_memory_utilization must be true or false"),
    ({"speculative_config": "{method: mtp}"}, r"settings\.speculative_config is not valid JSON"),
    ({"default_chat_template_kwargs": '{"enable_thinking": False}'},
     r"settings\.default_chat_template_kwargs is not valid JSON"),
    ({"default_chat_template_kwargs": "[1, 2]"}, r"settings\.default_chat_template_kwargs must be a JSON object"),
    ({"port": 0}, r"settings\.port must be >= 1, got 0"),
    ({"port": 65536}, r"settings\.port must be <= 65535, got 65536"),
    ({"master_port": 70000}, r"settings\.master_port must be <= 65535"),
    ({"master_port": 8000}, r"settings\.port and settings\.master_port are both 8000"),
    ({"model_path": "models/glm"}, r"settings\.model_path must be an absolute path"),
    ({"cache_path": "/var/tmp/a:b"}, r"settings\.cache_path must not contain ':'"),
    ({"kv_cache_memory_bytes": 0}, r"settings\.kv_cache_memory_bytes must be >= 1, got 0"),
    ({"kv_cache_memory_bytes": -5}, r"settings\.kv_cache_memory_bytes must be >= 1"),
    ({"kv_cache_memory_bytes": "39GiB"}, r"settings\.kv_cache_memory_bytes must be a plain positive integer"),
    ({"kv_cache_memory_bytes": True}, r"settings\.kv_cache_memory_bytes must be an integer"),
    ({"kv_cache_memory_bytes": 1.5}, r"settings\.kv_cache_memory_bytes must be an integer"),
    ({"max_model_len": 0}, r"settings\.max_model_len must be >= 1"),
    ({"distributed_timeout_seconds": 0}, r"settings\.distributed_timeout_seconds must be >= 1"),
    ({"container_name": "-bad"}, r"settings\.container_name '-bad' is not a valid container name"),
    ({"shm_size": "32 GB"}, r"settings\.shm_size must not contain whitespace"),
    ({"shm_size": "32GB"}, r"settings\.shm_size must be a size like 32g"),
    ({"image": ""}, r"settings\.image must be a non-empty string"),
    ({"bogus": 1}, r"settings has unknown key\(s\): bogus; known keys: "),
    ({"cx7_iface": None}, r"profile glm53_flash_nvfp4 needs cx7_iface for NCCL_SOCKET_IFNAME on node spark1: "
                          r"set nodes\[\]\.cx7_iface or settings\.cx7_iface"),
    ({"ib_hca": None}, r"needs ib_hca for NCCL_IB_HCA on node spark1: set nodes\[\]\.ib_hca or settings\.ib_hca"),
    ({"cx7_subnet": None}, r"needs cx7_subnet for NCCL_IB_ADDR_RANGE on node spark1: set settings\.cx7_subnet"),
    ({"cx7_iface": "a-very-long-interface-name"}, r"settings\.cx7_iface must be a network interface name"),
    ({"extra_args": ["--gpu-memory-utilization", "0.9"]},
     r"settings\.extra_args must not contain --gpu-memory-utilization: set settings\.gpu_memory_utilization"),
    ({"extra_args": ["--kv-cache-memory=1000"]},
     r"must not contain --kv-cache-memory-bytes: set settings\.kv_cache_memory_bytes"),
    ({"extra_args": ["-tp", "2"]}, r"must not contain --tensor-parallel-size: set settings\.tensor_parallel_size"),
    ({"extra_args": ["--node-rank", "1"]}, r"must not contain --node-rank: set nodes\[\]\.rank"),
    ({"extra_args": ["--headless"]}, r"settings\.extra_args must not contain --headless"),
    ({"extra_args": ["8"]}, r"settings\.extra_args must start with a flag"),
    ({"extra_args": ["--max-num-seqs 8"]}, r"settings\.extra_args\[0\] '--max-num-seqs 8' contains a space"),
    ({"extra_args": ["--seed", "1", "--seed", "2"]}, r"settings\.extra_args gives --seed twice"),
    ({"extra_args": "--max-num-seqs 8"}, r"settings\.extra_args must be a list of strings"),
    ({"extra_args": ["--max-num-seqs", "8"], "remove_args": ["--max-num-seqs"]},
     r"--max-num-seqs is in both settings\.extra_args and settings\.remove_args"),
    ({"remove_args": ["--node-rank"]}, r"settings\.remove_args must not remove --node-rank"),
    ({"remove_args": ["--headless"]}, r"settings\.remove_args must not remove --headless"),
    ({"remove_args": ["--master-addr"]}, r"settings\.remove_args must not remove --master-addr"),
    ({"remove_args": ["max-num-seqs"]}, r"settings\.remove_args\[0\] must be a flag name"),
    ({"extra_env": {"VLLM_HOST_IP": "10.0.0.1"}}, r"settings\.extra_env must not set VLLM_HOST_IP: set nodes\[\]\.cx7_ip"),
    ({"extra_env": {"NCCL_IB_HCA": "mlx5_0"}}, r"must not set NCCL_IB_HCA: set nodes\[\]\.ib_hca or settings\.ib_hca"),
    ({"extra_env": {"VLLM_API_KEY": "x"}}, r"settings\.extra_env must not set VLLM_API_KEY: use the api_key option"),
    ({"extra_env": {"1BAD": "x"}}, r"settings\.extra_env key '1BAD' is not a valid environment variable name"),
    ({"extra_env": {"NCCL_DEBUG": True}}, r"settings\.extra_env\.NCCL_DEBUG must be a string"),
    ({"remove_env": ["VLLM_HOST_IP"]}, r"settings\.remove_env must not remove VLLM_HOST_IP"),
    ({"api_key": ""}, r"api_key must be a non-empty string"),
])
def test_validation_errors(kwargs: dict[str, Any], message: str) -> None:
    kwargs = copy.deepcopy(kwargs)
    with pytest.raises(SpecError, match=message):
        render(**kwargs)


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


def test_a_misconfigured_worker_fails_the_head_render_too() -> None:
    nodes = _nodes((0, {"cx7_iface": IFACE}))
    with pytest.raises(SpecError, match=r"needs cx7_iface for NCCL_SOCKET_IFNAME on node spark2"):
        render_spec("glm53_flash_nvfp4", nodes, "spark1", {"cx7_subnet": SUBNET, "ib_hca": HCA})


@pytest.mark.parametrize("settings", [None, {}])
def test_settings_may_be_empty_when_the_profile_needs_nothing_more(settings: dict[str, Any] | None) -> None:
    nodes = _nodes((0, {"cx7_iface": "eth0"}), (1, {"cx7_iface": "eth1"}))
    spec = render_spec("lab_cpu", nodes, "spark2", settings)
    assert spec.container["env"]["GLOO_SOCKET_IFNAME"] == "eth1"


def test_settings_null_keeps_the_profile_default() -> None:
    command = render(max_model_len=None, port=None).container["command"]
    assert flag_value(command, "--max-model-len") == "262144" and flag_value(command, "--port") == "8000"


# --------------------------------------------------------------------------- overrides


def test_extra_args_replace_in_place_and_append_before_headless() -> None:
    base = render("spark2").container["command"]
    command = render("spark2", extra_args=["--max-num-seqs", "8", "--enable-prefix-caching"]).container["command"]
    assert command.count("--max-num-seqs") == 1
    assert command.index("--max-num-seqs") == base.index("--max-num-seqs")
    assert flag_value(command, "--max-num-seqs") == "8"
    assert command[-2:] == ["--enable-prefix-caching", "--headless"]
    assert len(command) == len(base) + 1


@pytest.mark.parametrize("extra, expected, growth", [
    (["--max-num-seqs=8"], ["--max-num-seqs=8"], -1),   # replaces "--max-num-seqs 6" in place
    (["--seed", "-1"], ["--seed", "-1"], 2),             # a negative number is a value, not a flag
])
def test_extra_args_forms(extra: list[str], expected: list[str], growth: int) -> None:
    base = render().container["command"]
    command = render(extra_args=extra).container["command"]
    at = command.index(expected[0])
    assert command[at:at + len(expected)] == expected
    assert len(command) == len(base) + growth
    assert not ("--max-num-seqs" in command and "--max-num-seqs=8" in command)


def test_extra_args_cannot_bypass_a_setting() -> None:
    with pytest.raises(SpecError, match=r"must not contain --speculative-config: set settings\.speculative_config"):
        render(extra_args=["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'])


def test_parse_args_groups() -> None:
    assert parse_args(["--a", "1", "--b", "--c=3", "-tp", "2", "--d", "-0.5"]) == [
        ("--a", ["--a", "1"]), ("--b", ["--b"]), ("--c", ["--c=3"]),
        ("--tensor-parallel-size", ["--tensor-parallel-size", "2"]), ("--d", ["--d", "-0.5"]),
    ]


@pytest.mark.parametrize("remove, gone", [
    (["--speculative-config"], ["--speculative-config", '{"method":"mtp","num_speculative_tokens":4}']),
    (["--enforce-eager"], ["--enforce-eager"]),
    (["--kv-cache-memory"], ["--kv-cache-memory-bytes", str(KV_BYTES)]),
])
def test_remove_args(remove: list[str], gone: list[str]) -> None:
    base = render().container["command"]
    command = render(remove_args=remove).container["command"]
    at = base.index(gone[0])
    assert base[at:at + len(gone)] == gone
    assert command == base[:at] + base[at + len(gone):]


def test_remove_args_absent_flag_warns() -> None:
    spec = render(remove_args=["--no-such-flag"])
    assert spec.warnings == ("settings.remove_args: --no-such-flag is not rendered by profile glm53_flash_nvfp4; "
                             "nothing removed",)
    assert spec.container["command"] == render().container["command"]


def test_extra_env_overrides_in_place_and_appends() -> None:
    base = render().container["env"]
    env = render(extra_env={"NCCL_DEBUG": "INFO", "VLLM_LOGGING_LEVEL": "DEBUG", "NCCL_TIMEOUT": 1800}).container["env"]
    assert list(env)[:len(base)] == list(base)
    assert env["NCCL_DEBUG"] == "INFO"
    assert list(env.items())[len(base):] == [("VLLM_LOGGING_LEVEL", "DEBUG"), ("NCCL_TIMEOUT", "1800")]


def test_remove_env() -> None:
    spec = render(remove_env=["NCCL_DEBUG", "NOT_THERE"])
    assert "NCCL_DEBUG" not in spec.container["env"]
    assert "-e NCCL_DEBUG=" not in spec.command_line
    assert spec.warnings == ("settings.remove_env: NOT_THERE is not set by profile glm53_flash_nvfp4; nothing removed",)


def test_remove_env_frees_its_value() -> None:
    spec = render(remove_env=["NCCL_IB_HCA"], ib_hca=None)
    assert "NCCL_IB_HCA" not in spec.container["env"]


@pytest.mark.parametrize("setting, value, flag, rendered", [
    ("speculative_config", {"method": "mtp", "num_speculative_tokens": 2}, "--speculative-config",
     '{"method":"mtp","num_speculative_tokens":2}'),
    ("default_chat_template_kwargs", '{"enable_thinking": true}', "--default-chat-template-kwargs",
     '{"enable_thinking": true}'),
    ("gpu_memory_utilization", 0.8, "--gpu-memory-utilization", "0.8"),
    ("served_model_name", "glm", "--served-model-name", "glm"),
    ("max_model_len", 131072, "--max-model-len", "131072"),
    ("master_port", 29600, "--master-port", "29600"),
])
def test_settings_render(setting: str, value: Any, flag: str, rendered: str) -> None:
    assert flag_value(render(**{setting: value}).container["command"], flag) == rendered


def test_high_gpu_memory_utilization_when_allowed() -> None:
    command = render(gpu_memory_utilization=0.9, allow_high_gpu_memory_utilization=True).container["command"]
    assert flag_value(command, "--gpu-memory-utilization") == "0.9"


def test_distributed_timeout_goes_after_master_port_before_headless() -> None:
    command = render("spark2", distributed_timeout_seconds=600).container["command"]
    assert command[-5:] == ["--master-port", "29521", "--distributed-timeout-seconds", "600", "--headless"]


def test_image_model_and_cache_paths() -> None:
    spec = render(image="registry.local/vllm:1", model_path="/models/glm", cache_path="/srv/cache",
                  container_name="vllm_a", shm_size="16g")
    container = spec.container
    assert container["image"] == "registry.local/vllm:1" and container["name"] == "vllm_a"
    assert container["command"][0] == "/models/glm"
    assert container["volumes"] == ["/models/glm:/models/glm:ro", "/srv/cache:/cache"]
    assert " --shm-size 16g " in spec.command_line


# --------------------------------------------------------------------------- api key, hash


def test_api_key_only_in_container_env() -> None:
    spec = render("spark1", api_key="s3cr3t-key")
    assert spec.container["env"]["VLLM_API_KEY"] == "s3cr3t-key"
    assert "s3cr3t-key" not in spec.command_line
    assert " -e VLLM_API_KEY ghcr.io/" in spec.command_line
    assert "s3cr3t-key" not in repr(spec.container["labels"]) and "s3cr3t-key" not in spec.config_hash


def test_only_the_head_gets_the_api_key() -> None:
    # the worker's ranks serve no API: the key would only be one more place to read it from
    worker = render("spark2", api_key="s3cr3t-key")
    assert "VLLM_API_KEY" not in worker.container["env"]
    assert "VLLM_API_KEY" not in worker.command_line and "s3cr3t-key" not in worker.command_line
    assert worker.as_result()["secret_env"] == []
    assert worker.config_hash == render("spark2").config_hash


def test_the_result_names_the_api_key_env_without_its_value() -> None:
    result = render("spark1", api_key="s3cr3t-key").as_result()
    assert "s3cr3t-key" not in json.dumps(result)
    assert "VLLM_API_KEY" not in result["container"]["env"]
    assert result["secret_env"] == ["VLLM_API_KEY"]
    assert result["container"]["env"] == render("spark1").container["env"]
    assert render("spark1").as_result()["secret_env"] == []


def test_api_key_changes_the_hash() -> None:
    hashes = {render(api_key=key).config_hash for key in (None, "key-one", "key-two")}
    assert len(hashes) == 3


def test_config_hash_is_stable_and_ignores_labels() -> None:
    spec = render()
    assert spec.config_hash == render().config_hash
    assert re.fullmatch(r"[0-9a-f]{16}", spec.config_hash)
    assert spec.container["labels"][HASH_LABEL] == spec.config_hash
    relabelled = dict(spec.container, labels={"other": "x"})
    assert config_hash(relabelled) == spec.config_hash


@pytest.mark.parametrize("change", [
    {"kv_cache_memory_bytes": KV_BYTES + 1},
    {"image": "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v9"},
    {"extra_env": {"NCCL_DEBUG": "INFO"}},
    {"shm_size": "16g"},
    {"extra_args": ["--max-num-seqs", "8"]},
])
def test_config_hash_changes_with_the_spec(change: dict[str, Any]) -> None:
    assert render(**change).config_hash != render().config_hash


def test_head_and_worker_hashes_differ() -> None:
    assert render("spark1").config_hash != render("spark2").config_hash


def test_docker_run_argv_roundtrip() -> None:
    spec = render("spark2", api_key="k")
    assert shlex.join(docker_run_argv(spec.container)) == spec.command_line


# --------------------------------------------------------------------------- lab profile


def lab(node: str = "spark2", **settings: Any):
    nodes = _nodes((0, {"cx7_ip": "10.91.0.11"}), (1, {"cx7_ip": "10.91.0.12"}))
    base: dict[str, Any] = {"cx7_iface": "eth0", "cx7_subnet": "10.91.0.0/24"}
    base.update(settings)
    return render_spec("lab_cpu", nodes, node, base)


def test_lab_profile_turns_off_what_the_lab_cannot_have() -> None:
    spec = lab()
    container = spec.container
    env, command = container["env"], container["command"]
    assert container["device_requests"] == [] and container["devices"] == [] and container["ulimits"] == []
    assert "--gpus" not in spec.command_line and "/dev/infiniband" not in spec.command_line
    assert container["shm_size"] == "1g"
    # IB off; of the IB env only the detected per-node facts stay (the HCA only when known)
    assert [name for name in env if name.startswith("NCCL_IB_") or name == "NCCL_NET"] == \
        ["NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX"]
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_IB_GID_INDEX"] == "3"
    for name in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST"):
        assert name not in env
    for flag in ("--speculative-config", "--moe-backend", "--kv-cache-dtype", "--block-size"):
        assert flag not in command
    assert flag_value(command, "--max-model-len") == "4096"
    assert [env[name] for name in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "TMPDIR")] == ["1", "1", "/tmp"]
    # the inductor cache of the first request's compile is kept in the node's cache volume (mounted at /cache)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/cache/torchinductor"
    assert "/var/tmp/cache:/cache" in container["volumes"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # the KV size comes from calibration (or vLLM's auto-sizing)
    assert flag_value(command, "--gpu-memory-utilization") == "0.1"
    assert env["VLLM_HOST_IP"] == "10.91.0.12" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["HF_HUB_OFFLINE"] == "1"
    for flag in ("--enforce-eager", "--enable-auto-tool-choice"):
        assert flag in command
    assert "--trust-remote-code" not in command   # the tiny model is transformers' Glm4MoeForCausalLM: native in vLLM
    assert flag_value(command, "--tool-call-parser") == "glm47"
    assert flag_value(command, "--reasoning-parser") == "glm45"
    assert flag_value(command, "--default-chat-template-kwargs") == '{"enable_thinking": false}'
    assert flag_value(command, "--distributed-executor-backend") == "mp"
    assert flag_value(command, "--tensor-parallel-size") == "2"
    assert flag_value(command, "--master-addr") == "10.91.0.11"
    assert command[-1] == "--headless"
    assert container["image"] == "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0"
    assert command[0] == "/var/tmp/models/tiny-glm53"
    assert container["labels"]["dgxspark.vllm.profile"] == "lab_cpu"


def test_lab_head_has_no_headless() -> None:
    assert "--headless" not in lab("spark1").container["command"]


def test_lab_is_the_recipe_path_with_parts_left_out() -> None:
    """Same code path: the lab's flags and env are the recipe's in the same order, minus what it cannot have."""
    nvfp4_flags = [flag for flag, _value in PROFILES['glm53_flash_nvfp4'].args]
    lab_flags = [flag for flag, _value in PROFILES['lab_cpu'].args]
    assert lab_flags == [flag for flag in nvfp4_flags if flag in lab_flags]
    removed = {"--speculative-config", "--moe-backend", "--kv-cache-dtype", "--block-size"}
    assert set(nvfp4_flags) - set(lab_flags) == removed
    nvfp4_env = [name for name, _value in PROFILES['glm53_flash_nvfp4'].env]
    lab_env = [name for name, _value in PROFILES['lab_cpu'].env]
    added = ["VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR"]
    assert lab_env == [name for name in nvfp4_env if name in lab_env] + added


@pytest.mark.parametrize("settings, kv_env, kv_flag", [
    ({}, None, None),
    ({"kv_cache_memory_bytes": 1073741824}, None, "1073741824"),
    ({"kv_cache_memory_bytes": 1073741824, "remove_args": ["--kv-cache-memory-bytes"]}, None, None),
    ({"kv_cache_memory_bytes": 1073741824, "extra_env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}, "2", "1073741824"),
])
def test_lab_kv_bytes_only_when_known(settings: dict[str, Any], kv_env: str | None, kv_flag: str | None) -> None:
    container = lab(**settings).container
    assert container["env"].get("VLLM_CPU_KVCACHE_SPACE") == kv_env
    command = container["command"]
    assert (flag_value(command, "--kv-cache-memory-bytes") if "--kv-cache-memory-bytes" in command else None) == kv_flag


def test_lab_needs_no_rdma_settings_and_warns_on_unused_ones() -> None:
    assert lab().warnings == ()
    assert "NCCL_IB_HCA" not in lab().container["env"]
    spec = lab(speculative_config='{"method":"mtp"}')
    assert spec.warnings == ("settings.speculative_config is ignored: profile lab_cpu does not use it",)


def test_lab_shows_the_detected_rdma_facts_per_node() -> None:
    """The lab renders what preflight detected from the recorded sysfs trees (issue: facts visible in the env)."""
    nodes = _nodes((0, {"cx7_ip": "10.91.0.11", "ib_hca": "rocep1s0f1,roceP2p1s0f1", "gid_index": 3}),
                   (1, {"cx7_ip": "10.91.0.12", "ib_hca": "roceP2p1s0f1", "gid_index": 4}))
    base: dict[str, Any] = {"cx7_iface": "eth0", "cx7_subnet": "10.91.0.0/24"}
    head = render_spec("lab_cpu", nodes, "spark1", base).container["env"]
    worker = render_spec("lab_cpu", nodes, "spark2", base).container["env"]
    assert (head["NCCL_IB_HCA"], head["NCCL_IB_GID_INDEX"]) == ("rocep1s0f1,roceP2p1s0f1", "3")
    assert (worker["NCCL_IB_HCA"], worker["NCCL_IB_GID_INDEX"]) == ("roceP2p1s0f1", "4")
    # the NVFP4 profile still requires the HCA: optional env is a per-profile choice
    with pytest.raises(SpecError, match="needs ib_hca"):
        render_spec("glm53_flash_nvfp4", _nodes((0, {"cx7_ip": "10.91.0.11"}), (1, {"cx7_ip": "10.91.0.12"})),
                    "spark1", {**base, "model_path": "/m", "image": "i"})


def test_lab_may_add_flags_it_does_not_bind() -> None:
    command = lab(extra_args=["--speculative-config", '{"method":"ngram"}']).container["command"]
    assert command[-3:] == ["--speculative-config", '{"method":"ngram"}', "--headless"]


def test_lab_four_nodes() -> None:
    nodes = [{"name": f"n{i}", "cx7_ip": f"10.91.0.{11 + i}", "head": i == 0, "cx7_iface": "eth0"} for i in range(4)]
    specs = [render_spec("lab_cpu", nodes, f"n{i}", {}) for i in range(4)]
    assert [spec.rank for spec in specs] == [0, 1, 2, 3]
    assert [spec.role for spec in specs] == ["head", "worker", "worker", "worker"]
    assert all(flag_value(spec.container["command"], "--nnodes") == "4" for spec in specs)
    assert all(flag_value(spec.container["command"], "--tensor-parallel-size") == "4" for spec in specs)


def test_every_profile_renders() -> None:
    for name in [name for name, item in PROFILES.items() if item.launcher == 'docker_run']:
        spec = render_spec(name, _nodes((0, {"cx7_iface": IFACE}), (1, {"cx7_iface": IFACE})), "spark2",
                           {"cx7_subnet": SUBNET, "ib_hca": HCA})
        assert spec.container["labels"]["dgxspark.vllm.profile"] == name


@pytest.mark.parametrize("settings, options", [
    ({}, {"max-size": "100m", "max-file": "5"}),
    ({"log_max_size": "1g", "log_max_file": 2}, {"max-size": "1g", "max-file": "2"}),
])
def test_the_serve_log_rotates(settings: dict[str, Any], options: dict[str, str]) -> None:
    spec = render(**settings)
    assert spec.container["log_driver"] == "json-file" and spec.container["log_options"] == options
    line = shlex.split(spec.command_line)
    assert line[line.index("--log-driver") + 1] == "json-file"
    assert [line[i + 1] for i, token in enumerate(line) if token == "--log-opt"] == \
        [f"max-size={options['max-size']}", f"max-file={options['max-file']}"]


@pytest.mark.parametrize("settings, message", [
    ({"log_max_size": "100"}, r"settings\.log_max_size must be a size with its unit, k, m or g"),
    ({"log_max_size": "0m"}, r"settings\.log_max_size must be a size"),
    ({"log_max_file": 0}, r"settings\.log_max_file must be >= 1"),
    ({"log_max_file": 101}, r"settings\.log_max_file must be <= 100"),
])
def test_bad_log_rotation_is_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        render(**settings)
