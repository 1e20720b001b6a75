#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_metrics_info
short_description: Read vLLM's Prometheus /metrics and summarise KV usage, load, throughput and latency
version_added: 0.1.0
description:
  - GETs C(<api_url>/metrics) from a vLLM OpenAI-compatible server twice, O(interval) seconds apart, and
    summarises vLLM's own metrics, the ones a person asks about a serving cluster.
  - KV-cache usage (C(vllm:kv_cache_usage_perc), or C(vllm:gpu_cache_usage_perc) on older vLLM), requests
    running and waiting, prompt and generation throughput (the increase of C(vllm:prompt_tokens_total) and
    C(vllm:generation_tokens_total) between the two reads, per second), and the p50/p90/p99 of the time to
    first token (C(vllm:time_to_first_token_seconds)) and of the inter-token latency
    (C(vllm:inter_token_latency_seconds), or C(vllm:time_per_output_token_seconds) on older vLLM).
  - Percentiles are computed from the histogram buckets as Prometheus' C(histogram_quantile) does, by linear
    interpolation inside the bucket that holds the rank. They cover every request since the engine started
    (vLLM's histograms are cumulative) and are only as fine as vLLM's bucket bounds.
  - A metric the server does not expose is returned as null. Several engine cores (data parallel) are combined,
    counts and histograms summed and KV usage taken from the fullest engine.
  - Reads only. It never changes anything.
author:
  - dgxspark.vllm maintainers (!UNKNOWN)
options:
  api_url:
    description:
      - Base URL of the vLLM server, for example V(http://10.0.0.1:8000); C(/metrics) is appended (a URL
        that already ends in C(/metrics) is used as it is).
    type: str
    required: true
  api_key:
    description:
      - "The server's API key, sent as C(Authorization: Bearer <key>). Empty or unset sends no header."
      - vLLM itself checks the key only on its C(/v1) routes; the header is sent so that a reverse proxy that
        guards every path lets the read through.
    type: str
  interval:
    description:
      - Seconds between the two reads the throughput is computed from.
      - V(0) reads once; the throughput values are then null.
    type: float
    default: 2
  timeout:
    description: Seconds to wait for each answer.
    type: float
    default: 10
  model_name:
    description:
      - Only count vLLM series whose C(model_name) label is this (vLLM's first served model name).
      - Unset counts every series. When no series matches, every figure is null and a warning names the model
        names the server reports.
    type: str
  validate_certs:
    description: Verify the server's TLS certificate (for an V(https://) URL).
    type: bool
    default: true
  use_proxy:
    description:
      - Use the proxy from the environment. Off by default, as the API is on the cluster's own network.
    type: bool
    default: false
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is nothing to diff.
  idempotent:
    support: full
    details: Never changes anything; the figures change with the server's load.
notes:
  - "Fails, naming the URL and the HTTP status, when the server does not answer C(200). Use
    C(failed_when: false) to report a dead API instead of failing on it."
  - Uses Python's standard library only (through C(ansible.module_utils.urls)); nothing to install.
seealso:
  - name: vLLM production metrics
    description: The metrics vLLM exposes on C(/metrics).
    link: https://docs.vllm.ai/en/latest/usage/metrics.html
  - name: Prometheus histogram_quantile
    description: The interpolation the percentiles follow.
    link: https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile
"""

EXAMPLES = r"""
- name: Read the head's metrics (with the API key)
  dgxspark.vllm.vllm_metrics_info:
    api_url: "http://{{ dgxspark_vllm_config.head_cx7_ip }}:{{ dgxspark_vllm_config.port }}"
    api_key: "{{ dgxspark_vllm_api_key }}"
    model_name: "{{ dgxspark_vllm_config.served_model_name }}"
  register: metrics
  failed_when: false

- name: Show them on one line
  ansible.builtin.debug:
    msg: "{{ metrics.summary | default('metrics unavailable: ' ~ metrics.msg) }}"

- name: Throughput over a longer window
  dgxspark.vllm.vllm_metrics_info:
    api_url: http://10.0.0.1:8000
    interval: 30
  register: metrics_30s
"""

RETURN = r"""
kv_cache_blocks:
  description: KV cache blocks the engine allocated (C(num_gpu_blocks) of C(vllm:cache_config_info)); null when not exposed.
  returned: always
  type: int
  sample: 32768
kv_block_size:
  description: Tokens per KV block (C(block_size) of C(vllm:cache_config_info)); null when not exposed.
  returned: always
  type: int
  sample: 128
kv_cache_tokens:
  description:
    - Tokens the KV cache holds (blocks times block size), the figure the engine logs at start, still readable
      here after those log lines were rotated away; null when not exposed.
  returned: always
  type: int
  sample: 4194304
url:
  description: The URL read.
  returned: always
  type: str
  sample: http://10.0.0.1:8000/metrics
kv_cache_usage:
  description: Fraction of the KV cache in use, 0 to 1 (the fullest engine core); null when not exposed.
  returned: always
  type: float
  sample: 0.125
requests_running:
  description: Requests in the engine's running batches (C(vllm:num_requests_running)); null when not exposed.
  returned: always
  type: int
  sample: 2
requests_waiting:
  description: Requests queued, waiting to run (C(vllm:num_requests_waiting)); null when not exposed.
  returned: always
  type: int
  sample: 1
prompt_tokens_per_s:
  description:
    - Prompt (prefill) tokens processed per second between the two reads; null with O(interval=0) or when
      not exposed.
  returned: always
  type: float
  sample: 153.0
generation_tokens_per_s:
  description: Tokens generated per second between the two reads; null with O(interval=0) or when not exposed.
  returned: always
  type: float
  sample: 60.0
ttft_seconds:
  description:
    - Time to first token since the engine started, in seconds; null when not exposed.
    - The percentiles are null while RV(ttft_seconds.count) is 0.
  returned: always
  type: dict
  sample: {"p50": 0.231, "p90": 0.917, "p99": 4.0, "count": 40}
  contains:
    p50:
      description: Median.
      type: float
      returned: always
      sample: 0.231
    p90:
      description: 90th percentile.
      type: float
      returned: always
      sample: 0.917
    p99:
      description: 99th percentile.
      type: float
      returned: always
      sample: 4.0
    count:
      description: Requests observed.
      type: int
      returned: always
      sample: 40
itl_seconds:
  description:
    - Inter-token latency (time between two output tokens of a request) since the engine started, in seconds,
      in the same shape as RV(ttft_seconds); null when not exposed.
  returned: always
  type: dict
  sample: {"p50": 0.0404, "p90": 0.0689, "p99": 0.135, "count": 2405}
  contains:
    p50:
      description: Median.
      type: float
      returned: always
      sample: 0.0404
    p90:
      description: 90th percentile.
      type: float
      returned: always
      sample: 0.0689
    p99:
      description: 99th percentile.
      type: float
      returned: always
      sample: 0.135
    count:
      description: Inter-token intervals observed.
      type: int
      returned: always
      sample: 2405
model_names:
  description: The C(model_name) label values on vLLM's series (the served model), whatever O(model_name) is.
  returned: always
  type: list
  elements: str
  sample: [glm-5.3-flash]
interval_seconds:
  description: Seconds measured between the two reads (0 with O(interval=0)).
  returned: always
  type: float
  sample: 2.004
summary:
  description: The figures on one line, for a person; C(n/a) where a figure is null.
  returned: always
  type: str
  sample: >-
    KV cache 13.4% used, 2 running, 0 waiting, prompt 153.0 tok/s, generation 60.0 tok/s,
    TTFT p50/p90/p99 0.231/0.917/4 s (n=40), ITL p50/p90/p99 0.0404/0.0689/0.135 s (n=2405)
"""

import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._http import api_headers, get
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import (
    MetricsParseError,
    format_summary,
    parse_text,
    summarise,
)

# time functions as module attributes, so the tests can stand in for them
_clock = time.monotonic
_sleep = time.sleep


class MetricsReadError(Exception):
    """A read of /metrics that gave no usable answer: the message names the URL; ``status`` is the HTTP status
    (-1 without an HTTP answer)."""

    def __init__(self, msg: str, status: int) -> None:
        super().__init__(msg)
        self.status = status


def metrics_url(api_url: str) -> str:
    """``<api_url>/metrics``, unless the URL already names it."""
    base = api_url.strip().rstrip("/")
    return base if base.endswith("/metrics") else base + "/metrics"


def fetch(url: str, headers: dict[str, str], params: dict[str, Any]) -> str:
    """The body of one GET; `MetricsReadError` for anything but an answer."""
    answer = get(url, headers, params["timeout"], validate_certs=params["validate_certs"],
                 use_proxy=params["use_proxy"])
    if answer.status in (401, 403):
        raise MetricsReadError(answer.problem + " (the API key is missing or wrong: api_key)", answer.status)
    if answer.status == -1:
        raise MetricsReadError(answer.problem + "; is the vLLM API up?", -1)
    if answer.problem:
        raise MetricsReadError(answer.problem, answer.status)
    return answer.body


def read_metrics(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """Read ``url`` once, or twice ``interval`` seconds apart, and summarise vLLM's figures."""
    headers = api_headers(params["api_key"], "text/plain")
    reads: list[tuple[str, float]] = []
    for index in range(2 if params["interval"] > 0 else 1):
        if index:
            _sleep(params["interval"])
        body = fetch(url, headers, params)
        reads.append((body, _clock()))
    try:
        scrapes = [parse_text(body) for body, _when in reads]
    except MetricsParseError as exc:
        raise MetricsReadError(f"GET {url} answered HTTP 200, but not in Prometheus text format: {exc}", 200) from None
    t_after = reads[-1][1]
    if len(reads) == 2:
        t_before = reads[0][1]
        summary = summarise(scrapes[-1], scrapes[0], t_before, t_after, params["model_name"])
        elapsed = round(t_after - t_before, 3)
    else:
        summary = summarise(scrapes[-1], model_name=params["model_name"])
        elapsed = 0.0
    return dict(summary, url=url, interval_seconds=elapsed, summary=format_summary(summary))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "api_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "interval": {"type": "float", "default": 2},
            "timeout": {"type": "float", "default": 10},
            "model_name": {"type": "str"},
            "validate_certs": {"type": "bool", "default": True},
            "use_proxy": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["api_url"].strip():
        module.fail_json(msg="api_url must be the server's base URL, such as http://10.0.0.1:8000")
    if params["interval"] < 0:
        module.fail_json(msg=f"interval must be >= 0 seconds, got {params['interval']}")
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be > 0 seconds, got {params['timeout']}")
    url = metrics_url(params["api_url"])
    try:
        result = read_metrics(url, params)
    except MetricsReadError as exc:
        module.fail_json(msg=str(exc), url=url, status=exc.status)
    else:
        model = params["model_name"]
        if model is not None and result["model_names"] and model not in result["model_names"]:
            module.warn(f"no vLLM series at {url} has model_name={model!r}; the server reports "
                        f"{', '.join(result['model_names'])}")
        module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
