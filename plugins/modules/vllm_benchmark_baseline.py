#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_benchmark_baseline
short_description: Read verify's short benchmark into a release's baseline
version_added: 0.2.0
description:
  - Reads what the benchmark driver printed after running the cases of
    M(dgxspark.vllm.vllm_benchmark_plan) with O(dgxspark.vllm.vllm_benchmark_plan#module:kind=baseline) in the head's
    serve container - the result files vLLM's C(vllm bench serve --save-result) wrote, one per case - and returns the
    baseline a release is recorded with - decode tokens/s at concurrency 1, TTFT p50 and output tokens/s at the
    configured concurrency, the parameters, when, and how long the whole run took.
  - Fails with the reason when the benchmark could not run, a case failed requests, a result lacks a key, or a
    figure is not positive.
  - Pure computation on the controller; it never touches the target.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  run:
    description: The registered result of the C(community.docker.docker_container_exec) that ran the driver.
    type: dict
    required: true
  cases:
    description: The plan's RV(dgxspark.vllm.vllm_benchmark_plan#module:cases).
    type: list
    elements: dict
    required: true
  params:
    description: The plan's RV(dgxspark.vllm.vllm_benchmark_plan#module:params).
    type: dict
    required: true
seealso:
  - module: dgxspark.vllm.vllm_benchmark_plan
  - module: dgxspark.vllm.release_history
"""

EXAMPLES = r"""
- name: Read the short benchmark into a baseline
  dgxspark.vllm.vllm_benchmark_baseline:
    run: "{{ bench_run }}"
    cases: "{{ bench_plan.cases }}"
    params: "{{ bench_plan.params }}"
  delegate_to: localhost
  run_once: true
  register: bench_baseline
"""

RETURN = r"""
baseline:
  description: The baseline (stored in the release's entry of the history by M(dgxspark.vllm.release_history)).
  returned: always
  type: dict
  contains:
    decode_tok_s:
      description: Decode tokens/s of one stream (1000 / mean TPOT of the decode case).
      type: float
      returned: always
      sample: 21.4
    ttft_ms_p50:
      description: Median time to first token, in ms, at the configured concurrency.
      type: float
      returned: always
      sample: 180.5
    output_throughput:
      description: Output tokens/s of all streams at the configured concurrency.
      type: float
      returned: always
      sample: 64.2
    concurrency:
      description: The configured concurrency.
      type: int
      returned: always
      sample: 4
    params:
      description: The parameters it was measured with; baselines compare only when these are equal.
      type: dict
      returned: always
      sample: {input_tokens: 64, output_tokens: 32, decode_prompts: 2, concurrency: 4, prompts: 8}
    measured_at:
      description: When (UTC).
      type: str
      returned: always
      sample: "2026-12-05T08:00:00Z"
    duration_s:
      description: Seconds the whole run took in the container, vLLM's import included.
      type: float
      returned: always
      sample: 41.2
    bench_s:
      description: Seconds the cases themselves took (vLLM's C(duration) of each, added up).
      type: float
      returned: always
      sample: 9.8
    vllm_version:
      description: The vLLM that measured.
      type: str
      returned: always
      sample: 0.32.0
rows:
  description: One row per case, as M(dgxspark.vllm.vllm_benchmark) reports them.
  returned: always
  type: list
  elements: dict
line:
  description: The baseline in one line.
  returned: always
  type: str
  sample: "decode 21.4 tok/s at concurrency 1; at concurrency 4: TTFT p50 180.5 ms, 64.2 output tok/s"
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._bench import (
    BenchError,
    baseline_from,
    baseline_line,
    check_complete,
    parse_driver_output,
    run_output,
    summarize,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run": {"type": "dict", "required": True},
            "cases": {"type": "list", "elements": "dict", "required": True},
            "params": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        doc = parse_driver_output(*run_output(p["run"]))
        check_complete(p["cases"], doc["results"])
        summary = summarize(doc["results"])
        baseline = baseline_from(summary, p["params"], measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 elapsed_s=doc.get("elapsed_s"), vllm_version=doc.get("vllm_version"))
    except BenchError as exc:
        module.fail_json(msg=f"the short benchmark (vllm bench serve) failed: {exc}")
    module.exit_json(changed=False, baseline=baseline, rows=summary["rows"], line=baseline_line(baseline))


if __name__ == "__main__":
    main()
