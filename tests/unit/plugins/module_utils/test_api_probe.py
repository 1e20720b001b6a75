# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the collection asks the head's API: one try (with /metrics), and tries until it answers."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._api_probe import probe, probe_until

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


MODELS = '{"object": "list", "data": [{"id": "tiny-glm53", "max_model_len": 4096}]}'


def test_the_models_answer_is_returned_parsed() -> None:
    found = probe(Server({URL + "/v1/models": (200, MODELS)}), URL, None, False)
    assert found["ok"] and found["json"]["data"][0]["id"] == "tiny-glm53"


@pytest.mark.parametrize(("body", "why"), [
    ("<html>proxy</html>", "but not with JSON"),
    ("[1, 2]", "but not with a JSON object"),
])
def test_a_200_that_is_not_the_api_is_not_an_answer(body: str, why: str) -> None:
    found = probe(Server({URL + "/v1/models": (200, body)}), URL, None, True)
    assert (found["ok"], found["json"], found["metrics"]) == (False, None, None)
    assert why in found["msg"]


class Sequence:
    """Answers /v1/models with the statuses given, one per GET (then the last again)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses, self.asked = list(statuses), 0

    def __call__(self, url: str, headers: dict[str, str]) -> tuple[int, str, str]:
        status = self.statuses[min(self.asked, len(self.statuses) - 1)]
        self.asked += 1
        return status, MODELS if status == 200 else "", "" if status == 200 else f"GET {url} answered HTTP {status}"


def test_tries_until_it_answers_delay_apart() -> None:
    slept: list[float] = []
    ticks = iter([0.0, 1.0, 3.5, 4.0, 6.5, 6.75])
    found = probe_until(Sequence(-1, 503, 200), URL, None, retries=5, delay=2.5, sleep=slept.append,
                        clock=lambda: next(ticks))
    assert (found["ok"], found["attempts"], slept, found["elapsed"]) == (True, 3, [2.5, 2.5], 0.25)


def test_gives_up_after_one_try_and_the_retries_saying_the_last_answer() -> None:
    slept: list[float] = []
    server = Sequence(503)
    found = probe_until(server, URL, None, retries=2, delay=1, sleep=slept.append)
    assert (found["ok"], found["status"], found["attempts"], server.asked, slept) == (False, 503, 3, 3, [1, 1])
    assert found["msg"] == f"GET {URL}/v1/models answered HTTP 503"


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_ends_the_tries_at_once(status: int) -> None:
    slept: list[float] = []
    found = probe_until(Sequence(status, 200), URL, "wrong", retries=9, delay=1, sleep=slept.append)
    assert (found["ok"], found["attempts"], slept) == (False, 1, [])
    assert found["msg"] == f"{URL}/v1/models refused the API key (HTTP {status}): check dgxspark_vllm_api_key (a retry cannot change that)"


def test_negative_retries_or_delay_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        probe_until(Sequence(200), URL, None, retries=-1, delay=1)
