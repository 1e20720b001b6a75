# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One try at the head's OpenAI API from a node, and the head's /metrics (pure but for the injected GET).

The launch's node read carries it (dgxspark.vllm.vllm_node_state, api_url): a re-run that finds the group
serving its render, answering on every node and reporting its KV cache has nothing left to do after one read
per node. Anything short of that leaves the decision to the launch's own API check, with its retries.
"""
from __future__ import annotations

from typing import Any, Callable

from ansible_collections.dgxspark.vllm.plugins.module_utils._http import api_headers
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import MetricsParseError, parse_text, summarise

Get = Callable[[str, "dict[str, str]"], "tuple[int, str, str]"]
"""url, headers -> (HTTP status or -1 without an answer, body, what went wrong)."""


def probe(get: Get, api_url: str, api_key: str | None, metrics: bool) -> dict[str, Any]:
    """``{url, status, ok, msg, metrics}``: GET <api_url>/v1/models once; with ``metrics`` and a 200, GET
    <api_url>/metrics once and summarise it (vllm_metrics_info's figures; None when unreadable, with the reason in
    ``metrics_msg``)."""
    base = api_url.strip().rstrip("/")
    url = base + "/v1/models"
    status, _body, problem = get(url, api_headers(api_key, "application/json"))
    result: dict[str, Any] = {"url": url, "status": status, "ok": status == 200,
                              "msg": problem or f"HTTP {status}", "metrics": None, "metrics_msg": None}
    if not (metrics and status == 200):
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
