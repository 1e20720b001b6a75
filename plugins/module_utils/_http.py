# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one GET from a module, and the one place the API key becomes a header there.

Every module that asks vLLM's API something (the launch's node read, its startup wait, vllm_metrics_info) calls
``get``: one request, never through a proxy unless asked, and an answer instead of an exception, so that each
caller only words what the answer means for its own user.
"""
from __future__ import annotations

import socket
from typing import Any, NamedTuple
from urllib.error import HTTPError, URLError
from urllib.request import (HTTPDefaultErrorHandler, HTTPErrorProcessor, HTTPHandler, HTTPRedirectHandler,
                            OpenerDirector, ProxyHandler, Request, UnknownHandler)

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url


class Answer(NamedTuple):
    """One GET's outcome: ``status`` is the HTTP status, or -1 without an HTTP answer; ``problem`` is empty for
    a 2xx and otherwise says what happened, naming the URL."""
    status: int
    body: str
    problem: str


def api_headers(api_key: str | None, accept: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer <key>`` when a key is set (none for an empty or unset key), and ``Accept``."""
    found = {"Accept": accept} if accept else {}
    if api_key:
        found["Authorization"] = "Bearer " + api_key
    return found


def _plain_http() -> OpenerDirector:
    """An opener for plain http:// without a proxy: urllib's HTTP handlers (redirects, error statuses as
    HTTPError) and no TLS. open_url builds a TLS context with the system's CA certificates for every request, an
    https:// one or not (about 50 ms each on a node); the API the modules ask is plain HTTP on the CX7 link."""
    opener = OpenerDirector()
    for handler in (ProxyHandler({}), UnknownHandler(), HTTPHandler(), HTTPDefaultErrorHandler(),
                    HTTPRedirectHandler(), HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _open(url: str, method: str, headers: dict[str, str], timeout: float, validate_certs: bool,
          use_proxy: bool) -> Any:
    """One request, as open_url takes it (the tests' seam)."""
    if url.lower().startswith("http://") and not use_proxy:
        return _plain_http().open(Request(url, headers=headers, method=method), timeout=timeout)
    return open_url(url, method=method, headers=headers, timeout=timeout, validate_certs=validate_certs,
                    use_proxy=use_proxy)


def get(url: str, headers: dict[str, str], timeout: float, validate_certs: bool = True,
        use_proxy: bool = False) -> Answer:
    """GET ``url`` once and read the body (UTF-8, undecodable bytes replaced). A plain http:// URL without a
    proxy goes through urllib's HTTP handlers; anything else through open_url (TLS, proxies)."""
    try:
        response = _open(url, method="GET", headers=headers, timeout=timeout, validate_certs=validate_certs,
                         use_proxy=use_proxy)
        status = response.getcode()
        body = response.read().decode("utf-8", errors="replace")
    except HTTPError as exc:
        return Answer(exc.code, "", f"GET {url} answered HTTP {exc.code} {exc.reason}")
    except URLError as exc:
        return Answer(-1, "", f"GET {url} got no HTTP answer (status -1): {exc.reason}")
    except (UrlsConnectionError, socket.timeout, OSError, ValueError) as exc:
        return Answer(-1, "", f"GET {url} got no HTTP answer (status -1): {exc}")
    return Answer(status, body, "" if 200 <= status < 300 else f"GET {url} answered HTTP {status}")
