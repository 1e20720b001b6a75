# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import shlex
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes
from helpers.module_runner import ModuleFail, run_module
from helpers.profiles import PROFILES

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import as_data
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_serve_spec

NODES = [
    {"name": "spark1", "cx7_ip": "192.168.100.11", "head": True},
    {"name": "spark2", "cx7_ip": "192.168.100.12", "cx7_iface": "enP2p1s0f1np1", "gid_index": 4},
]
SETTINGS = {"cx7_subnet": "192.168.100.0/24", "cx7_iface": "enp1s0f1np1", "ib_hca": "rocep1s0f1,roceP2p1s0f1"}
RESULT_KEYS = {"changed", "container", "command_line", "config_hash", "rank", "role", "headless"}


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-core 2.19 refuses module args without a serialization profile; helpers.module_runner sets none."""
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


def args(**extra: Any) -> dict[str, Any]:
    """The task's arguments as the launch role passes them: the profile by name and as data (the config fact's)."""
    base: dict[str, Any] = {"nodes": NODES, "node": "spark1", "settings": SETTINGS}
    base.update(extra)
    name = base.setdefault("profile", "glm53_flash_nvfp4")
    if name in PROFILES:
        base.setdefault("profile_data", as_data(PROFILES[name]))
    return base


@pytest.mark.parametrize("node, rank, role, headless", [
    ("spark1", 0, "head", False),
    ("spark2", 1, "worker", True),
])
def test_render(node: str, rank: int, role: str, headless: bool) -> None:
    result = run_module(vllm_serve_spec.main, args(node=node))
    assert RESULT_KEYS <= set(result)
    assert result["changed"] is False
    assert (result["rank"], result["role"], result["headless"]) == (rank, role, headless)
    command = result["container"]["command"]
    assert command[command.index("--node-rank") + 1] == str(rank)
    assert (command[-1] == "--headless") is headless
    assert result["container"]["labels"]["dgxspark.vllm.config_hash"] == result["config_hash"]
    assert shlex.split(result["command_line"])[-len(command):] == command


def test_default_profile_is_the_recipe() -> None:
    result = run_module(vllm_serve_spec.main, args())
    assert result["container"]["labels"]["dgxspark.vllm.profile"] == "glm53_flash_nvfp4"
    assert result["container"]["image"] == "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"


def test_node_options_reach_the_render() -> None:
    env = run_module(vllm_serve_spec.main, args(node="spark2"))["container"]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1" and env["NCCL_IB_GID_INDEX"] == "4"


def test_check_mode_renders_the_same() -> None:
    normal = run_module(vllm_serve_spec.main, args())
    checked = run_module(vllm_serve_spec.main, args(), check_mode=True)
    assert checked == normal
    assert checked["changed"] is False


def test_settings_types_are_converted_by_the_argument_spec() -> None:
    result = run_module(vllm_serve_spec.main, args(settings=dict(SETTINGS, kv_cache_memory_bytes="1000",
                                                                 port="8001", extra_args=["--max-num-seqs", 8])))
    command = result["container"]["command"]
    assert command[command.index("--kv-cache-memory-bytes") + 1] == "1000"
    assert command[command.index("--port") + 1] == "8001"
    assert command[command.index("--max-num-seqs") + 1] == "8"


def test_lab_profile() -> None:
    result = run_module(vllm_serve_spec.main, args(profile="lab_cpu", node="spark2", settings={"cx7_iface": "eth0"}))
    assert result["container"]["device_requests"] == []
    assert "VLLM_CPU_KVCACHE_SPACE" not in result["container"]["env"]
    command = result["container"]["command"]
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.1"
    assert result["headless"] is True


def test_unused_setting_is_a_warning() -> None:
    with mock.patch.object(basic.AnsibleModule, "warn") as warn:
        run_module(vllm_serve_spec.main, args(profile="lab_cpu", settings={"cx7_iface": "eth0", "speculative_config": "{}"}))
    warn.assert_called_once_with("settings.speculative_config is ignored: profile lab_cpu does not use it")


@pytest.mark.parametrize("extra, message", [
    ({"node": "spark3"}, r"node 'spark3' is not in nodes"),
    ({"settings": dict(SETTINGS, gpu_memory_utilization=0.87)}, r"above 0\.85"),
    ({"settings": dict(SETTINGS, tensor_parallel_size=4)}, r"must equal nodes x gpus_per_node"),
    ({"settings": dict(SETTINGS, speculative_config="{not json")}, r"settings\.speculative_config is not valid JSON"),
    ({"nodes": [dict(NODES[0]), dict(NODES[1], head=True)]}, r"2 nodes have head: true"),
])
def test_spec_errors_fail(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ModuleFail, match=message) as failure:
        run_module(vllm_serve_spec.main, args(**extra))
    assert failure.value.result["failed"] is True


@pytest.mark.parametrize("extra, message", [
    ({"profile": "glm53_flash_exl3"}, r"profile glm53_flash_exl3 is started by its exl3_kit launcher, not rendered"),
    ({"profile": "mine", "profile_data": {"name": "mine", "extends": "glm53_flash_nvfp4"}},
     r"extends 'glm53_flash_nvfp4', which is not a profile"),
    ({"profile": "mine", "profile_data": {"name": "mine", "launcher": "docker_run", "args": ["--x"], "env": {"A": True}}},
     r"env\.A must be a string"),
    ({"settings": dict(SETTINGS, bogus=1)}, r"Unsupported parameters.*bogus"),
    ({"nodes": [dict(NODES[0], extra=1), NODES[1]]}, r"Unsupported parameters.*extra"),
    ({"nodes": [{"name": "spark1", "head": True}, NODES[1]]}, r"missing required arguments: cx7_ip"),
    ({"settings": dict(SETTINGS, port="http")}, r"port.*int"),
])
def test_argument_spec_errors(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ModuleFail, match=message):
        run_module(vllm_serve_spec.main, args(**extra))


def test_a_node_run_needs_the_profile_as_data() -> None:
    with pytest.raises(ModuleFail, match=r"profile_data is required when the module runs on a node"):
        run_module(vllm_serve_spec.main, {"nodes": NODES, "node": "spark1", "settings": SETTINGS})


def test_api_key_stays_out_of_the_command_line() -> None:
    result = run_module(vllm_serve_spec.main, args(api_key="s3cr3t-api-key"))
    assert "s3cr3t-api-key" not in result["command_line"]
    assert "-e VLLM_API_KEY " in result["command_line"]
    # the value stays with the caller (no_log): a value masked in the result would reach the container as the mask
    assert "VLLM_API_KEY" not in result["container"]["env"]
    assert result["secret_env"] == ["VLLM_API_KEY"]
    assert result["config_hash"] != run_module(vllm_serve_spec.main, args())["config_hash"]


def test_api_key_never_leaves_the_real_module_output(capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real exit_json (no_log): the key never leaves the module in clear."""
    payload = args(api_key="s3cr3t-api-key", _ansible_remote_tmp="/tmp", _ansible_keep_remote_files=False)
    with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))):
        with pytest.raises(SystemExit) as done:
            vllm_serve_spec.main()
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "s3cr3t-api-key" not in out
    result = json.loads(out)
    # nothing in the render was there to mask (only the invocation's own api_key argument is)
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" not in json.dumps({k: v for k, v in result.items() if k != "invocation"})
    assert result["secret_env"] == ["VLLM_API_KEY"] and "VLLM_API_KEY" not in result["container"]["env"]
