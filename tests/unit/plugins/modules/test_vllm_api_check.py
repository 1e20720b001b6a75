# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_api_check module against a real HTTP server on loopback that answers like vLLM's API."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_api_check
from helpers.module_runner import ModuleFail, run_module

MODELS = {"object": "list", "data": [{"id": "tiny-glm53", "max_model_len": 4096}]}


@pytest.fixture(autouse=True)
def _serialization_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-core 2.19 refuses module args without a serialization profile."""
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")


class Api:
    """vLLM's /v1/models behind --api-key sk-lab: 503 for the first `starting` requests (still loading)."""

    def __init__(self, starting: int = 0) -> None:
        self.starting, self.asked = starting, []


@pytest.fixture
def api() -> Iterator[tuple[Api, str]]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            state.asked.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "Bearer sk-lab":
                status, body = 401, b'{"error": "Unauthorized"}'
            elif len(state.asked) <= state.starting:
                status, body = 503, b""
            elif self.path == "/v1/models":
                status, body = 200, json.dumps(MODELS).encode()
            else:
                status, body = 404, b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_served_models_with_the_key(api) -> None:
    state, url = api
    result = run_module(vllm_api_check.main, {"url": url + "/", "api_key": "sk-lab"}, check_mode=True)
    assert (result["ok"], result["status"], result["attempts"], result["changed"]) == (True, 200, 1, False)
    assert result["json"] == MODELS and result["url"] == url + "/v1/models"
    assert state.asked == [("/v1/models", "Bearer sk-lab")]


def test_tries_until_the_api_answers(api) -> None:
    state, url = api
    state.starting = 2
    result = run_module(vllm_api_check.main, {"url": url, "api_key": "sk-lab", "retries": 5, "delay": 0.05})
    assert (result["ok"], result["attempts"]) == (True, 3)


def test_a_wrong_key_ends_the_tries_and_is_named(api) -> None:
    state, url = api
    result = run_module(vllm_api_check.main, {"url": url, "api_key": "wrong", "retries": 5, "delay": 0.05})
    assert (result["ok"], result["status"], result["attempts"], result["json"]) == (False, 401, 1, None)
    assert "refused the API key (HTTP 401): check dgxspark_vllm_api_key" in result["msg"]
    assert len(state.asked) == 1


def test_no_server_is_an_answer_not_a_failure() -> None:
    result = run_module(vllm_api_check.main, {"url": "http://127.0.0.1:9", "retries": 1, "delay": 0})
    assert (result["ok"], result["status"], result["attempts"]) == (False, -1, 2)
    assert "got no HTTP answer" in result["msg"]


def test_bad_options_fail_naming_each() -> None:
    with pytest.raises(ModuleFail) as err:
        run_module(vllm_api_check.main, {"url": "10.0.0.1:8000", "timeout": 0, "retries": -1})
    msg = err.value.result["msg"]
    assert "url must be the server's base URL" in msg and "timeout must be > 0" in msg and "must not be negative" in msg
