# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_kv_estimate_info module and its docker logs adapter (run_command is faked)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import (
    ContainerNotFoundError,
    DockerLogsError,
    DockerUnreachableError,
    docker_logs_argv,
    merge_streams,
    read_container_logs,
)
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_kv_estimate_info
from helpers.fixtures import read_log
from helpers.module_runner import ModuleFail, run_module

DOCKER = "/usr/bin/docker"


def _read(name: str) -> str:
    return read_log(name)


class FakeRun:
    """Stands in for AnsibleModule.run_command: records argv and kwargs, returns a fixed answer."""

    def __init__(self, rc: int = 0, out: str = "", err: str = "", raises: Exception | None = None) -> None:
        self.answer = (rc, out, err)
        self.raises = raises
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        self.calls.append((list(argv), kwargs))
        if self.raises is not None:
            raise self.raises
        return self.answer


def _run(args: dict[str, Any], fake: FakeRun | None = None, docker: str | None = DOCKER,
         check_mode: bool = False) -> dict[str, Any]:
    fake = fake or FakeRun()

    def run_command(_self: Any, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        return fake(argv, **kwargs)

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", return_value=docker):
        return run_module(vllm_kv_estimate_info.main, args, check_mode=check_mode)


# ---------------------------------------------------------------------------------------------------------
# log_text

@pytest.mark.parametrize("check_mode", [False, True])
def test_log_text(check_mode: bool) -> None:
    fake = FakeRun()
    result = _run({"log_text": _read("fmt_gpu_single_node_tp2_ready.log")}, fake, check_mode=check_mode)
    assert result["changed"] is False
    assert result["kv_cache_memory_bytes"] == 56132132454
    assert result["suggestions"] == [
        {"requested_limit_bytes": 56132132454, "gpu_limit_bytes": 74700000000, "rank": 1},
        {"requested_limit_bytes": 56400000000, "gpu_limit_bytes": 74500000000, "rank": 0},
    ]
    assert (result["kv_cache_tokens"], result["max_concurrency"], result["available_kv_cache_gib"]) == (
        2097152, 8.0, 46.25)
    assert (result["phase"], result["engine_error"], result["estimated_max_model_len"]) == ("api_up", None, None)
    assert fake.calls == []  # log_text never touches docker


def test_log_text_failure() -> None:
    result = _run({"log_text": _read("fmt_cpu_estimated_max_len.log")})
    assert result["changed"] is False
    assert result["estimated_max_model_len"] == 1920
    assert result["kv_cache_memory_bytes"] is None
    assert result["engine_error"] == (
        "max-model-len does not fit the KV cache: the estimated maximum model length is 1920")


def test_empty_log_text() -> None:
    result = _run({"log_text": ""})
    assert (result["phase"], result["phase_line"], result["starts_seen"]) == ("container_started", None, 0)


def test_every_documented_return_key_is_returned() -> None:
    documented = set(yaml.safe_load(vllm_kv_estimate_info.RETURN))
    result = _run({"log_text": _read("fmt_cpu_head_ready.log")})
    assert documented == set(result) - {"changed"}


def test_documented_phase_choices_match() -> None:
    from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import PHASES
    assert tuple(yaml.safe_load(vllm_kv_estimate_info.RETURN)["phase"]["choices"]) == PHASES


# ---------------------------------------------------------------------------------------------------------
# container

STDOUT = (
    "2026-11-30T20:00:01.5Z (APIServer pid=1) INFO 11-30 20:00:01 [api_server.py:1885] vLLM API server version 0.32.0\n"
    "2026-11-30T20:00:02Z (Worker_TP0 pid=101) INFO 11-30 20:00:02 [parallel_state.py:1208] world_size=2 rank=0 "
    "local_rank=0 distributed_init_method=tcp://10.0.0.1:29521 backend=nccl\n"
    "2026-11-30T20:00:09.25Z (Worker_TP0 pid=101) INFO 11-30 20:00:09 [default_loader.py:267] Loading weights took "
    "8.1 seconds\n"
)
STDERR = (
    "2026-11-30T20:00:03.000000001Z (Worker_TP1 pid=102) Traceback (most recent call last):\n"
    "2026-11-30T20:00:03.1Z (Worker_TP1 pid=102)   File \"x.py\", line 1, in f\n"
    "2026-11-30T20:00:03.2Z (Worker_TP1 pid=102) AssertionError: collective_rpc should not be called on follower node\n"
)


@pytest.mark.parametrize("check_mode", [False, True])
def test_container_logs_returned(check_mode: bool) -> None:
    fake = FakeRun(0, STDOUT, STDERR)
    result = _run({"container": "vllm_glm53", "since": "10m"}, fake, check_mode=check_mode)
    assert [argv for argv, _kw in fake.calls] == [
        [DOCKER, "logs", "--timestamps", "--since", "10m", "vllm_glm53"]]
    assert result["changed"] is False
    assert result["phase"] == "weights_loaded"
    # the traceback came on stderr: it is parsed too
    assert result["engine_error"] == "worker started without --headless (follower assertion)"


def test_container_without_since() -> None:
    fake = FakeRun(0, _read("fmt_gpu_worker_headless_kv.log"), "")
    result = _run({"container": "vllm_glm53"}, fake)
    assert [argv for argv, _kw in fake.calls] == [[DOCKER, "logs", "--timestamps", "vllm_glm53"]]
    assert result["kv_cache_memory_bytes"] == 10200547328
    assert result["suggestions"] == [
        {"requested_limit_bytes": 10200547328, "gpu_limit_bytes": 26600000000, "rank": 1}]


def test_container_missing() -> None:
    fake = FakeRun(1, "", "Error response from daemon: No such container: vllm_glm53\n")
    with pytest.raises(ModuleFail) as failed:
        _run({"container": "vllm_glm53"}, fake)
    assert "container 'vllm_glm53' does not exist on this node" in failed.value.result["msg"]
    assert "docker ps -a" in failed.value.result["msg"]


@pytest.mark.parametrize("stderr", [
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n",
    "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
    "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/containers/x/logs\": dial unix /var/run/docker.sock: "
    "connect: permission denied\n",
])
def test_docker_unreachable(stderr: str) -> None:
    with pytest.raises(ModuleFail) as failed:
        _run({"container": "vllm_glm53"}, FakeRun(1, "", stderr))
    assert failed.value.result["msg"].startswith("docker is not reachable on this node")


def test_docker_not_installed() -> None:
    fake = FakeRun()
    with pytest.raises(ModuleFail) as failed:
        _run({"container": "vllm_glm53"}, fake, docker=None)
    assert "docker CLI is not installed" in failed.value.result["msg"]
    assert fake.calls == []


def test_other_docker_failure() -> None:
    fake = FakeRun(125, "", 'invalid value for "since": bad\n')
    with pytest.raises(ModuleFail) as failed:
        _run({"container": "vllm_glm53", "since": "bad"}, fake)
    assert "failed with rc=125" in failed.value.result["msg"]
    assert 'invalid value for "since"' in failed.value.result["msg"]


# ---------------------------------------------------------------------------------------------------------
# options

@pytest.mark.parametrize("args, match", [
    ({}, "one of the following is required: container, log_text"),
    ({"container": "a", "log_text": "b"}, "parameters are mutually exclusive: container|log_text"),
    ({"log_text": "b", "since": "10m"}, "missing parameter(s) required by 'since': container"),
    ({"container": "  "}, "container must be a container name or ID"),
    ({"container": "a", "tail": 5}, "Unsupported parameters"),
])
def test_bad_options(args: dict[str, Any], match: str) -> None:
    fake = FakeRun()
    with pytest.raises(ModuleFail) as failed:
        _run(args, fake)
    assert match in failed.value.result["msg"]
    assert fake.calls == []


# ---------------------------------------------------------------------------------------------------------
# the adapter on its own

@pytest.mark.parametrize("name, since, expected", [
    ("c", None, ["docker", "logs", "--timestamps", "c"]),
    ("c", "", ["docker", "logs", "--timestamps", "c"]),
    ("c", "2026-11-30T20:00:00Z", ["docker", "logs", "--timestamps", "--since", "2026-11-30T20:00:00Z", "c"]),
])
def test_docker_logs_argv(name: str, since: str | None, expected: list[str]) -> None:
    assert docker_logs_argv(name, since) == expected


@pytest.mark.parametrize("stdout, stderr, expected", [
    ("", "", ""),
    ("2026-11-30T20:00:01Z a\n", "", "2026-11-30T20:00:01Z a\n"),
    # fractions of different length compare as numbers, not as text
    ("2026-11-30T20:00:01.5Z a\n2026-11-30T20:00:02Z c\n", "2026-11-30T20:00:01.123456789Z b\n",
     "2026-11-30T20:00:01.123456789Z b\n2026-11-30T20:00:01.5Z a\n2026-11-30T20:00:02Z c\n"),
    # a tie keeps stdout first; a line without a timestamp follows its predecessor; missing newline added
    ("2026-11-30T20:00:01Z a\nno stamp\n", "2026-11-30T20:00:01Z b", "2026-11-30T20:00:01Z a\nno stamp\n"
     "2026-11-30T20:00:01Z b\n"),
])
def test_merge_streams(stdout: str, stderr: str, expected: str) -> None:
    assert merge_streams(stdout, stderr) == expected


@pytest.mark.parametrize("fake, error, match", [
    (FakeRun(1, "", "Error: No such container: c"), ContainerNotFoundError, "does not exist on this node"),
    (FakeRun(1, "", "error during connect: Get http://x: open //./pipe/docker_engine"), DockerUnreachableError,
     "not reachable"),
    (FakeRun(raises=FileNotFoundError(2, "No such file or directory")), DockerUnreachableError,
     "install the docker CLI"),
    (FakeRun(1, "", ""), DockerLogsError, "failed with rc=1: exit code 1"),
])
def test_read_container_logs_errors(fake: FakeRun, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        read_container_logs(fake, "c")


def test_read_container_logs_merges() -> None:
    fake = FakeRun(0, "2026-11-30T20:00:02Z out\n", "2026-11-30T20:00:01Z err\n")
    assert read_container_logs(fake, "c", "5m", "/bin/docker") == "2026-11-30T20:00:01Z err\n2026-11-30T20:00:02Z out\n"
    assert fake.calls == [(["/bin/docker", "logs", "--timestamps", "--since", "5m", "c"], {})]
