# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_metrics_info module: main() with open_url, the sleep and the clock faked."""
from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterator
from typing import Any
from unittest import mock
from urllib.error import HTTPError, URLError

import pytest
import yaml
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.module_utils import _http
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import SUMMARY_KEYS
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_metrics_info
from helpers.module_runner import ModuleFail, run_module

FIXTURE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "metrics")
URL = "http://10.0.0.1:8000"


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURE_DIR, name), encoding="utf-8") as handle:
        return handle.read()


SCRAPES = [fixture("vllm-0.12-v1-assembled.1.txt"), fixture("vllm-0.12-v1-assembled.2.txt")]


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-core 2.19 refuses module args without a serialization profile."""
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


class Answered(io.BytesIO):
    """An HTTP 200 response: the body, and its status."""

    def getcode(self) -> int:
        return 200


class FakeServer:
    """Stands in for _http._open (open_url's arguments): answers each call with the next body (or raises the next exception)."""

    def __init__(self, answers: list[str | Exception]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, url: str, **kwargs: Any) -> Answered:
        self.calls.append((url, kwargs))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Answered(answer.encode("utf-8"))


class FakeClock:
    """time.monotonic and time.sleep: sleeping moves the clock."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    with mock.patch.object(vllm_metrics_info, "_clock", fake.monotonic), \
            mock.patch.object(vllm_metrics_info, "_sleep", fake.sleep):
        yield fake


def _run(args: dict[str, Any], server: FakeServer, check_mode: bool = False) -> dict[str, Any]:
    with mock.patch.object(_http, "_open", server):
        return run_module(vllm_metrics_info.main, args, check_mode=check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
def test_two_reads_with_key(clock: FakeClock, check_mode: bool) -> None:
    server = FakeServer(list(SCRAPES))
    result = _run({"api_url": URL + "/", "api_key": "s3cret", "timeout": 5}, server, check_mode=check_mode)
    assert result["changed"] is False
    assert result["url"] == URL + "/metrics"
    assert [url for url, _kw in server.calls] == [URL + "/metrics"] * 2
    for _url, kwargs in server.calls:
        assert kwargs["headers"]["Authorization"] == "Bearer s3cret"
        assert (kwargs["method"], kwargs["timeout"], kwargs["use_proxy"], kwargs["validate_certs"]) == (
            "GET", 5.0, False, True)
    assert clock.sleeps == [2.0]
    assert result["interval_seconds"] == 2.0
    assert (result["prompt_tokens_per_s"], result["generation_tokens_per_s"]) == (153.0, 60.0)
    assert (result["kv_cache_usage"], result["requests_running"], result["requests_waiting"]) == (0.1337, 2, 0)
    assert result["ttft_seconds"] == {"p50": pytest.approx(0.23125), "p90": pytest.approx(0.9166667),
                                      "p99": pytest.approx(4.0), "count": 40}
    assert result["itl_seconds"]["count"] == 2405
    assert result["model_names"] == ["glm-5.3-flash"]
    assert result["summary"].startswith("KV cache 13.4% used, 2 running, 0 waiting, prompt 153.0 tok/s")
    assert "s3cret" not in repr(result)


def test_no_key_no_header_and_one_read(clock: FakeClock) -> None:
    server = FakeServer([SCRAPES[0]])
    result = _run({"api_url": URL, "api_key": "", "interval": 0}, server)
    assert "Authorization" not in server.calls[0][1]["headers"]
    assert clock.sleeps == []
    assert (result["interval_seconds"], result["prompt_tokens_per_s"], result["generation_tokens_per_s"]) == (
        0.0, None, None)
    assert result["kv_cache_usage"] == 0.125


def test_url_already_naming_metrics(clock: FakeClock) -> None:
    server = FakeServer([SCRAPES[0]])
    result = _run({"api_url": URL + "/metrics", "interval": 0}, server)
    assert server.calls[0][0] == URL + "/metrics" == result["url"]


def test_every_documented_return_key_is_returned(clock: FakeClock) -> None:
    documented = set(yaml.safe_load(vllm_metrics_info.RETURN))
    result = _run({"api_url": URL}, FakeServer(list(SCRAPES)))
    assert documented == set(result) - {"changed"}
    assert set(SUMMARY_KEYS) <= documented


def test_model_name_mismatch_warns(clock: FakeClock) -> None:
    with mock.patch.object(basic.AnsibleModule, "warn") as warn:
        result = _run({"api_url": URL, "model_name": "other"}, FakeServer(list(SCRAPES)))
    assert result["kv_cache_usage"] is None and result["ttft_seconds"] is None
    assert result["model_names"] == ["glm-5.3-flash"]
    warn.assert_called_once()
    assert "model_name='other'" in warn.call_args[0][0] and "glm-5.3-flash" in warn.call_args[0][0]


def test_model_name_match(clock: FakeClock) -> None:
    with mock.patch.object(basic.AnsibleModule, "warn") as warn:
        result = _run({"api_url": URL, "model_name": "glm-5.3-flash"}, FakeServer(list(SCRAPES)))
    assert result["kv_cache_usage"] == 0.1337
    warn.assert_not_called()


def _http_error(code: int, reason: str) -> HTTPError:
    return HTTPError(URL + "/metrics", code, reason, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("answers, status, message", [
    ([_http_error(401, "Unauthorized")], 401,
     "GET http://10.0.0.1:8000/metrics answered HTTP 401 Unauthorized (the API key is missing or wrong: api_key)"),
    ([_http_error(503, "Service Unavailable")], 503,
     "GET http://10.0.0.1:8000/metrics answered HTTP 503 Service Unavailable"),
    ([URLError(ConnectionRefusedError(111, "Connection refused"))], -1,
     "GET http://10.0.0.1:8000/metrics got no HTTP answer (status -1): [Errno 111] Connection refused; "
     "is the vLLM API up?"),
    ([socket.timeout("timed out")], -1,
     "GET http://10.0.0.1:8000/metrics got no HTTP answer (status -1): timed out; is the vLLM API up?"),
    # the second read fails: the engine died between the two
    ([SCRAPES[0], URLError("[Errno 111] Connection refused")], -1,
     "GET http://10.0.0.1:8000/metrics got no HTTP answer (status -1): [Errno 111] Connection refused; "
     "is the vLLM API up?"),
    (["<html>not metrics</html>", SCRAPES[1]], 200,
     "GET http://10.0.0.1:8000/metrics answered HTTP 200, but not in Prometheus text format: line 1: "),
])
def test_failures_name_url_and_status(clock: FakeClock, answers: list[Any], status: int, message: str) -> None:
    with pytest.raises(ModuleFail) as failed:
        _run({"api_url": URL, "api_key": "s3cret"}, FakeServer(answers))
    result = failed.value.result
    assert result["msg"].startswith(message)
    assert (result["status"], result["url"]) == (status, URL + "/metrics")
    assert "s3cret" not in result["msg"]


@pytest.mark.parametrize("args, message", [
    ({"api_url": " "}, "api_url must be the server's base URL"),
    ({"api_url": URL, "interval": -1}, "interval must be >= 0 seconds, got -1.0"),
    ({"api_url": URL, "timeout": 0}, "timeout must be > 0 seconds, got 0.0"),
])
def test_bad_arguments(clock: FakeClock, args: dict[str, Any], message: str) -> None:
    server = FakeServer([])
    with pytest.raises(ModuleFail, match=message):
        _run(args, server)
    assert server.calls == []


def test_api_key_is_no_log_and_check_mode_supported() -> None:
    with mock.patch.object(vllm_metrics_info, "AnsibleModule", side_effect=RuntimeError("stop")) as module:
        with pytest.raises(RuntimeError):
            vllm_metrics_info.main()
    assert module.call_args.kwargs["argument_spec"]["api_key"]["no_log"] is True
    assert module.call_args.kwargs["supports_check_mode"] is True
