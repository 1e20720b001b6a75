# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one GET, against a real HTTP server on the loopback interface."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._http import Answer, api_headers, get


class Handler(BaseHTTPRequestHandler):
    """/ok: 200 with the request's Authorization and Accept in the body; /code/N: status N; /slow: no answer;
    /moved: 307 to /ok (vLLM answers /metrics so in some versions)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/moved":
            self.send_response(307)
            self.send_header("Location", "/ok")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/slow":
            self.server.release.wait(5)  # type: ignore[attr-defined]
            return
        status = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/code/") else 200
        body = f"auth={self.headers.get('Authorization')} accept={self.headers.get('Accept')} é".encode(
            "utf-8") + b"\xff" if status == 200 else b"nope"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def test_headers_carry_the_key_only_when_set() -> None:
    assert api_headers("sk-1", "text/plain") == {"Accept": "text/plain", "Authorization": "Bearer sk-1"}
    assert api_headers("", "application/json") == {"Accept": "application/json"}
    assert api_headers(None) == {}


def test_an_answer_with_its_body_and_the_headers_sent(base: str) -> None:
    answer = get(base + "/ok", api_headers("sk-1", "text/plain"), timeout=5)
    assert answer == Answer(200, "auth=Bearer sk-1 accept=text/plain \u00e9\ufffd", "")


@pytest.mark.parametrize("code, reason", [(401, "Unauthorized"), (503, "Service Unavailable")])
def test_an_error_status_is_an_answer_naming_the_url(base: str, code: int, reason: str) -> None:
    answer = get(base + f"/code/{code}", {}, timeout=5)
    assert (answer.status, answer.body) == (code, "")
    assert answer.problem == f"GET {base}/code/{code} answered HTTP {code} {reason}"


def test_no_server_is_status_minus_one() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/models"
    answer = get(url, {}, timeout=5)
    assert answer.status == -1 and answer.body == ""
    assert answer.problem.startswith(f"GET {url} got no HTTP answer (status -1): ")
    assert "refused" in answer.problem


def test_a_server_that_does_not_answer_in_time(base: str) -> None:
    answer = get(base + "/slow", {}, timeout=0.3)
    assert answer.status == -1
    assert answer.problem.startswith(f"GET {base}/slow got no HTTP answer (status -1): ")
    assert "timed out" in answer.problem


def test_a_url_that_is_not_one() -> None:
    answer = get("10.0.0.1:8000/metrics", {}, timeout=1)
    assert answer.status == -1
    assert answer.problem.startswith("GET 10.0.0.1:8000/metrics got no HTTP answer (status -1): ")


def test_plain_http_builds_no_tls_context_and_follows_a_redirect(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the plain path never touches TLS (open_url loads the CA certificates for every request, http:// or not)
    import ssl

    def no_tls(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a TLS context was built for a plain http:// GET")

    monkeypatch.setattr(ssl, "create_default_context", no_tls)
    monkeypatch.setattr(ssl, "SSLContext", no_tls)
    assert get(base + "/moved", {}, timeout=5) == Answer(200, "auth=None accept=None \u00e9\ufffd", "")


def test_a_proxy_when_asked_goes_through_open_url(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible_collections.dgxspark.vllm.plugins.module_utils import _http
    seen: list[str] = []

    def fake_open_url(url: str, **kwargs: object) -> object:
        seen.append(url)
        raise _http.URLError("no proxy here")

    monkeypatch.setattr(_http, "open_url", fake_open_url)
    answer = get(base + "/ok", {}, timeout=5, use_proxy=True)
    assert seen == [base + "/ok"] and answer.status == -1 and "no proxy here" in answer.problem
