# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One try at the head's OpenAI API from a node, and the head's /metrics (pure but for the injected GET).

Every caller that asks whether the API answers asks it here: the launch's node read (dgxspark.vllm.vllm_node_state,
api_url: a re-run that finds the group serving its render, answering on every node and reporting its KV cache has
nothing left to do after one read per node), the startup wait's API phase (dgxspark.vllm.vllm_startup_wait, one
``probe`` per poll while the head's container runs), and the cluster role's ``api_check`` for status, verify and the
scenarios (dgxspark.vllm.vllm_api_check: ``probe_until``, its tries a fixed number apart).
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

from ansible_collections.dgxspark.vllm.plugins.module_utils._http import api_headers
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import MetricsParseError, parse_text, summarise

Get = Callable[[str, "dict[str, str]"], "tuple[int, str, str]"]
"""url, headers -> (HTTP status or -1 without an answer, body, what went wrong)."""


def probe(get: Get, api_url: str, api_key: str | None, metrics: bool) -> dict[str, Any]:
    """``{url, status, ok, msg, json, metrics}``: GET <api_url>/v1/models once (``json``: its answer parsed, with
    the served models in ``data``; None unless a 200 with a JSON object); with ``metrics`` and a 200, GET
    <api_url>/metrics once and summarise it (vllm_metrics_info's figures; None when unreadable, with the reason in
    ``metrics_msg``)."""
    base = api_url.strip().rstrip("/")
    url = base + "/v1/models"
    status, body, problem = get(url, api_headers(api_key, "application/json"))
    models = None
    if status == 200:
        try:
            models = json.loads(body)
        except ValueError:
            problem = f"GET {url} answered HTTP 200, but not with JSON: {body[:120]!r}"
        if models is not None and not isinstance(models, dict):
            models, problem = None, f"GET {url} answered HTTP 200, but not with a JSON object: {body[:120]!r}"
    result: dict[str, Any] = {"url": url, "status": status, "ok": status == 200 and models is not None,
                              "msg": problem or f"HTTP {status}", "json": models, "metrics": None,
                              "metrics_msg": None}
    if not (metrics and result["ok"]):
        return result
    m_status, body, m_problem = get(base + "/metrics", api_headers(api_key, "text/plain"))
    if m_status != 200:
        result["metrics_msg"] = m_problem or f"GET {base}/metrics answered HTTP {m_status}"
        return result
    try:
        summary = summarise(parse_text(body))
    except MetricsParseError as exc:
        result["metrics_msg"] = f"GET {base}/metrics answered HTTP 200, but not in Prometheus text format: {exc}"
        return result
    result["metrics"] = dict(summary, url=base + "/metrics", interval_seconds=0.0)
    return result


REFUSED = (401, 403)
"""Statuses a retry cannot change: the API refused the key."""


def probe_until(get: Get, api_url: str, api_key: str | None, retries: int, delay: float,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """``probe`` (without metrics) until it answers ``ok``, at most ``1 + retries`` tries ``delay`` seconds apart; a
    refused key (401/403) ends the tries at once. The last probe's result, with ``attempts``, ``elapsed`` (the last
    try's seconds) and, for a refused key, a ``msg`` that says it is the key's fault."""
    if retries < 0 or delay < 0:
        raise ValueError(f"retries and delay must not be negative (retries {retries}, delay {delay})")
    attempt = 0
    while True:
        attempt += 1
        started = clock()
        result = probe(get, api_url, api_key, False)
        result["elapsed"] = round(clock() - started, 3)
        if result["ok"]:
            break
        if result["status"] in REFUSED:
            result["msg"] = (f"{result['url']} refused the API key (HTTP {result['status']}): check "
                             "dgxspark_vllm_api_key (a retry cannot change that)")
            break
        if attempt > retries:
            break
        sleep(delay)
    result["attempts"] = attempt
    return result
