# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_startup_wait module (docker inspect / docker logs answered by a fake run_command)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from unittest import mock
from urllib.error import HTTPError, URLError

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import parse_log
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_startup_wait
from helpers.fixtures import read_log
from helpers.module_runner import run_module


class FakeDocker:
    """`docker inspect` answers a state, `docker logs` a captured log; every call is recorded."""

    def __init__(self, log: str, running: bool = True, exists: bool = True) -> None:
        self.log, self.running, self.exists = log, running, exists
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **_kwargs: Any) -> tuple[int, str, str]:
        argv = list(argv)
        self.calls.append(argv)
        if not self.exists:
            return 1, "", "Error: No such container: %s" % argv[-1]
        if "inspect" in argv:
            return 0, json.dumps({"Running": self.running, "ExitCode": 0 if self.running else 1}), ""
        if "logs" in argv:
            return 0, self.log, ""
        raise AssertionError("unexpected command %r" % argv)


def _run(args: dict[str, Any], fake: FakeDocker, check_mode: bool = False, may_poll: bool = False) -> dict[str, Any]:
    def run_command(_self: Any, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        return fake(argv, **kwargs)

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(vllm_startup_wait.time, "sleep",
                              side_effect=None if may_poll else AssertionError("polled again")):
        return run_module(vllm_startup_wait.main, args, check_mode=check_mode)


@pytest.mark.parametrize("log_name", ["lab_cpu_tp2_head_ready.log.gz", "fmt_gpu_single_node_tp2_ready.log"])
def test_a_serving_head_returns_the_log_report_of_the_same_read(log_name: str) -> None:
    text = read_log(log_name)
    fake = FakeDocker(text)
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, fake)
    assert result["ok"] is True and result["status"] == "done"
    # the KV cache the head reports comes with the wait: the same values vllm_kv_estimate_info reads
    assert result["log_report"] == parse_log(text).as_dict()
    assert result["log_report"]["kv_cache_tokens"] is not None
    assert result["log_report"]["phase"] == "api_up"
    # one inspect and one read of the log: the report costs no second docker call
    assert [argv[1] for argv in fake.calls] == ["inspect", "logs"]


def test_the_cpu_head_reports_its_pool_and_concurrency() -> None:
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, FakeDocker(read_log("lab_cpu_tp2_head_ready.log.gz")))
    assert result["log_report"]["kv_cache_tokens"] == 4194304
    assert result["log_report"]["kv_cache_pool"] == "CPU"
    assert result["log_report"]["max_concurrency"] == 1024.0


def test_a_missing_container_has_no_log_report() -> None:
    fake = FakeDocker("", exists=False)
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous",
                   "budgets": {"container_started": 0.01}, "poll_interval": 0.001}, fake, may_poll=True)
    assert result["ok"] is False
    assert result["log_report"] is None


def test_check_mode_waits_for_nothing() -> None:
    fake = FakeDocker("")
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, fake, check_mode=True)
    assert result["status"] == "check_mode" and result["log_report"] is None
    assert fake.calls == []


class FakeResponse:
    def __init__(self, code: int) -> None:
        self.code = code

    def getcode(self) -> int:
        return self.code


def _run_api(fake: FakeDocker, answers: list[Any], **extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A worker at the rendezvous checking the head's API; answers: FakeResponse or exceptions, in order."""
    calls: list[dict[str, Any]] = []

    def open_url(url: str, **kwargs: Any) -> FakeResponse:
        calls.append({"url": url, **kwargs})
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    args = {"container": "vllm_glm53", "target_phase": "rendezvous",
            "api_url": "http://198.51.100.1:8000/v1/models", "poll_interval": 0.001, **extra}
    with mock.patch.object(vllm_startup_wait, "open_url", open_url):
        return _run(args, fake, may_poll=True), calls


def test_a_worker_proves_it_runs_and_the_api_answers_from_it_in_one_call() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    result, calls = _run_api(fake, [URLError("connection refused"), FakeResponse(200)], api_key="sk-test")
    assert result["ok"] is True and result["status"] == "done"
    assert result["api"]["status"] == 200 and result["api"]["error"] is None
    assert len(calls) == 2
    assert calls[0]["headers"] == {"Authorization": "Bearer sk-test"}
    assert calls[0]["use_proxy"] is False
    assert "sk-test" not in json.dumps(result)


def test_a_worker_that_stops_while_the_head_comes_up_fails_the_check() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))

    def stop_after_first_inspect(argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        inspects = sum(1 for call in fake.calls if "inspect" in call)
        if "inspect" in argv and inspects >= 2:
            fake.running = False
        return FakeDocker.__call__(fake, argv, **kwargs)

    fake_call = mock.Mock(side_effect=stop_after_first_inspect)
    result, _calls = _run_api(fake_call, [URLError("connection refused")])  # type: ignore[arg-type]
    assert result["ok"] is False and result["status"] == "failed"
    assert "container stopped while waiting for the API" in result["reason"]
    assert result["api"]["status"] is None


def test_an_api_that_never_answers_fails_within_its_timeout_naming_the_url() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    result, calls = _run_api(fake, [URLError("connection refused")], api_timeout=0.02)
    assert result["ok"] is False
    assert "http://198.51.100.1:8000/v1/models did not answer HTTP 200 from this node within 0.02 s" in result["reason"]
    assert "connection refused" in result["reason"]
    assert len(calls) >= 2


def test_a_refused_key_fails_at_once() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    refused = HTTPError("http://198.51.100.1:8000/v1/models", 401, "Unauthorized", {}, None)  # type: ignore[arg-type]
    result, calls = _run_api(fake, [refused], api_key="wrong", api_timeout=60)
    assert result["ok"] is False and "refused the API key (HTTP 401)" in result["reason"]
    assert len(calls) == 1


def test_no_api_url_no_api_check() -> None:
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous"},
                  FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz")))
    assert result["ok"] is True and result["api"] is None
