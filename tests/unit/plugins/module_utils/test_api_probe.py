# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node read's one try at the head's API and its /metrics."""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._api_probe import probe

URL = "http://10.77.1.11:8000"
# vLLM's /metrics as the lab's engine serves it (the lines the KV report reads)
METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",num_gpu_blocks="32768"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-glm53"} 0.0
"""


class Server:
    """Answers each GET from a table (url -> status, body), and remembers what it was asked."""

    def __init__(self, table: dict[str, tuple[int, str]]) -> None:
        self.table, self.asked = table, []

    def __call__(self, url: str, headers: dict[str, str]) -> tuple[int, str, str]:
        self.asked.append((url, dict(headers)))
        status, body = self.table.get(url, (-1, ""))
        return status, body, "" if status != -1 else f"GET {url} got no HTTP answer: [Errno 111] Connection refused"


def test_an_answer_with_metrics_reads_both_with_the_key() -> None:
    server = Server({URL + "/v1/models": (200, '{"data": []}'), URL + "/metrics": (200, METRICS)})
    found: dict[str, Any] = probe(server, URL + "/", "sk-lab", True)
    assert (found["status"], found["ok"], found["url"]) == (200, True, URL + "/v1/models")
    assert found["metrics"]["kv_cache_tokens"] == 32768 * 128
    assert [asked[0] for asked in server.asked] == [URL + "/v1/models", URL + "/metrics"]
    assert all(asked[1]["Authorization"] == "Bearer sk-lab" for asked in server.asked)


def test_no_answer_reads_no_metrics_and_says_why() -> None:
    server = Server({})
    found = probe(server, URL, None, True)
    assert (found["ok"], found["status"], found["metrics"]) == (False, -1, None)
    assert "Connection refused" in found["msg"]
    assert len(server.asked) == 1 and "Authorization" not in server.asked[0][1]


def test_a_refused_key_is_not_an_answer() -> None:
    found = probe(Server({URL + "/v1/models": (401, "")}), URL, "wrong", True)
    assert (found["ok"], found["status"], found["msg"], found["metrics"]) == (False, 401, "HTTP 401", None)


def test_unreadable_metrics_keep_the_answer_and_say_why() -> None:
    found = probe(Server({URL + "/v1/models": (200, "{}"), URL + "/metrics": (200, "not { prometheus")}), URL, None, True)
    assert found["ok"] and found["metrics"] is None
    assert found["metrics_msg"].startswith(f"GET {URL}/metrics answered HTTP 200, but not in Prometheus text format")
    found = probe(Server({URL + "/v1/models": (200, "{}"), URL + "/metrics": (500, "")}), URL, None, True)
    assert found["metrics"] is None and found["metrics_msg"] == f"GET {URL}/metrics answered HTTP 500"


def test_without_metrics_only_the_models_are_asked() -> None:
    server = Server({URL + "/v1/models": (200, "{}")})
    assert probe(server, URL, None, False)["metrics"] is None and len(server.asked) == 1
