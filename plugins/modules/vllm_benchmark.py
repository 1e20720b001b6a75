#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_benchmark
short_description: Report a run of vLLM's own C(vllm bench serve) - JSON, CSV and a matplotlib chart
version_added: 0.1.0
description:
  - Reads what the benchmark driver printed in the head's serve container (the registered result of
    C(community.docker.docker_container_exec), O(run)) - the result file vLLM saved for each case planned by
    M(dgxspark.vllm.vllm_benchmark_plan) - and summarises it - per case, output tokens/s, requests/s,
    per-stream decode tokens/s (1000 / mean TPOT), and p50/p90/p99 of TTFT, ITL, TPOT and end-to-end latency, in
    milliseconds.
  - The decode case's per-stream rate is the recipe's single-stream decode tokens/s; the ttft case's TTFT is its
    big-prompt time to first token.
  - Fails, naming the case and vLLM's first errors, when a case failed any request, did not finish, or its result
    lacks a figure.
  - Writes C(benchmark-<time>.json) (vLLM's raw results, the cases with their argv, the summary and the
    reference), C(benchmark-<time>.csv) (one row per case) and C(benchmark-<time>.png) into O(output_dir).
  - The chart (matplotlib, Agg) has three panels - output tokens/s over the concurrency sweep, TTFT and ITL
    percentiles over the sweep, and the large prompt's TTFT - with the recipe's single-stream decode tokens/s
    and big-prompt TTFT range drawn as labelled marks when O(profile) is V(glm53_flash_nvfp4) or
    V(glm53_flash_exl3).
  - Run it on the controller (C(delegate_to=localhost), C(run_once)).
  - Before 0.2.0 this module measured the server with its own streaming client; it now only reports what vLLM's
    tool measured.
author:
  - dgxspark.vllm contributors (@dgxspark)
requirements:
  - matplotlib >= 3.8 on the controller (C(pip install matplotlib); C(requirements/controller.txt) lists it)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is read or written (the benchmark did not run); the module reports that it
      would write the files.
  diff_mode:
    support: none
    details: New result files are written; there is nothing to diff.
  idempotent:
    support: none
    details: Every run writes new files.
options:
  run:
    description:
      - The registered result of the C(community.docker.docker_container_exec) task that ran the driver
        (C(stdout), C(stderr), C(rc); C(msg) when the task itself failed).
    type: dict
    required: true
    version_added: 0.2.0
  cases:
    description: The C(cases) returned by M(dgxspark.vllm.vllm_benchmark_plan); every one must have a result.
    type: list
    elements: dict
    required: true
    version_added: 0.2.0
  model:
    description: The served model name, for the chart's title and the JSON.
    type: str
    required: true
  profile:
    description:
      - The serving profile's name (C(dgxspark_vllm_config.profile_name)), for the title and the reference marks.
      - Only V(glm53_flash_nvfp4) and V(glm53_flash_exl3) have the recipe's reference numbers.
    type: str
    default: ""
    version_added: 0.2.0
  output_dir:
    description: Directory the JSON, CSV and PNG are written to (created when missing).
    type: path
    required: true
notes:
  - Numbers from the CPU lab mean nothing for a Spark; the lab only proves the benchmark runs end to end.
  - vLLM's ITL is the gap between streamed chunks; with speculative decoding (MTP, DFlash) a chunk can carry
    several tokens, so TPOT and the per-stream decode rate are the per-token figures.
  - The prompts are vLLM's random dataset. With speculative decoding the acceptance rate, and with it the decode
    rate, depends on the text, so the decode case can differ from the recipe's short code prompt; the JSON keeps
    vLLM's C(spec_decode_acceptance_*) figures when the server reports them.
seealso:
  - module: dgxspark.vllm.vllm_benchmark_plan
"""

EXAMPLES = r"""
- name: Write the report on the controller
  dgxspark.vllm.vllm_benchmark:
    run: "{{ bench_run }}"
    cases: "{{ bench_plan.cases }}"
    model: "{{ dgxspark_vllm_config.served_model_name }}"
    profile: "{{ dgxspark_vllm_config.profile_name }}"
    output_dir: "{{ lookup('ansible.builtin.env', 'HOME') }}/dgxspark-vllm/benchmark"
  delegate_to: localhost
  run_once: true
  register: bench
"""

RETURN = r"""
rows:
  description: One summary row per case (as in the CSV); throughputs per second, latencies in milliseconds.
  returned: success, not in check mode
  type: list
  elements: dict
  sample: [{"case": "decode", "concurrency": 1, "num_prompts": 3, "completed": 3, "failed": 0, "input_tokens": 128,
            "output_tokens": 256, "duration_s": 33.8, "request_throughput": 0.0888, "output_throughput": 22.73,
            "decode_tok_s": 23.1, "ttft_ms_p50": 180.2, "ttft_ms_p90": 190.0, "ttft_ms_p99": 191.5,
            "itl_ms_p50": 43.1, "itl_ms_p90": 45.0, "itl_ms_p99": 51.2, "tpot_ms_p50": 43.3, "tpot_ms_p90": 43.5,
            "tpot_ms_p99": 43.6, "e2el_ms_p50": 11230.0, "e2el_ms_p90": 11260.0, "e2el_ms_p99": 11270.0,
            "spec_decode_acceptance_length": 3.4}]
decode_tok_s:
  description: Single-stream decode tokens/s of the decode case (1000 / its mean TPOT in ms).
  returned: success, not in check mode
  type: float
  sample: 23.1
ttft_ms:
  description: p50, p90 and p99 time to first token of the ttft case (the large prompt), in milliseconds.
  returned: success, not in check mode
  type: dict
  sample: {"p50": 3412.0, "p90": 3412.0, "p99": 3412.0}
ttft_prompt_tokens:
  description: Prompt tokens of the ttft case, as the server counted them.
  returned: success, not in check mode
  type: float
  sample: 32768
reference:
  description: The recipe's numbers for O(profile) (null for any other profile).
  returned: success, not in check mode
  type: dict
  sample: {"profile": "glm53_flash_nvfp4", "label": "NVFP4", "decode_tok_s": 23.3, "ttft_s": [3.0, 12.0],
           "source": "the recipe's 'Measured performance (2-node cluster)'"}
lines:
  description: One line per case for a person - throughput, decode rate, TTFT and ITL p50/p90/p99 - and a last line
    naming the files written; in check mode, one line saying that nothing ran.
  returned: success
  type: list
  elements: str
  sample: ["decode (1 stream, 128-token prompts, 256 tokens out): decode 23.1 tok/s single stream (recipe NVFP4:
           23.3 tok/s); TTFT p50/p90/p99 180.2/190.0/191.5 ms; ITL p50/p90/p99 43.1/45.0/51.2 ms"]
vllm_version:
  description: The vLLM version that measured (the serve container's).
  returned: success, not in check mode
  type: str
  sample: 0.32.0
tokenizer:
  description: The tokenizer the driver read from the server (null when the plan named one).
  returned: success, not in check mode
  type: str
  sample: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
msg:
  description: What check mode would have done.
  returned: check mode
  type: str
  sample: "check mode: the benchmark did not run; the report would be written to /home/me/dgxspark-vllm/benchmark"
files:
  description: Paths of the files written.
  returned: success, not in check mode
  type: dict
  sample: {"csv": "/home/me/dgxspark-vllm/benchmark/benchmark-20261130T210000Z.csv",
           "json": "/home/me/dgxspark-vllm/benchmark/benchmark-20261130T210000Z.json",
           "png": "/home/me/dgxspark-vllm/benchmark/benchmark-20261130T210000Z.png"}
"""

import json
import os
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.dgxspark.vllm.plugins.module_utils._bench import (
    BenchError,
    chart_title,
    check_complete,
    parse_driver_output,
    reference_for,
    run_output,
    summarize,
    summary_lines,
    to_csv,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._bench_chart import (
    HAS_MATPLOTLIB,
    MATPLOTLIB_IMPORT_ERROR,
    ChartError,
    build_figure,
    write_png,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run": {"type": "dict", "required": True},
            "cases": {"type": "list", "elements": "dict", "required": True},
            "model": {"type": "str", "required": True},
            "profile": {"type": "str", "default": ""},
            "output_dir": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not HAS_MATPLOTLIB:
        module.fail_json(msg=missing_required_lib("matplotlib", reason="to draw the benchmark chart")
                         + " On the controller: pip install matplotlib"
                         + " (or pip install -r requirements/controller.txt).",
                         exception=MATPLOTLIB_IMPORT_ERROR)
    if module.check_mode:
        msg = f"check mode: the benchmark did not run; the report would be written to {p['output_dir']}"
        module.exit_json(changed=True, msg=msg, lines=[msg])
    reference = reference_for(p["profile"])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        doc = parse_driver_output(*run_output(p["run"]))
        check_complete(p["cases"], doc["results"])
        summary = summarize(doc["results"])
        figure = build_figure(summary, chart_title(p["model"], p["profile"], stamp, doc.get("vllm_version")),
                              reference)
    except (BenchError, ChartError) as exc:
        module.fail_json(msg=str(exc))
    base = os.path.join(p["output_dir"], f"benchmark-{stamp}")
    files = {"json": base + ".json", "csv": base + ".csv", "png": base + ".png"}
    report = {"time": stamp, "model": p["model"], "profile": p["profile"], "vllm_version": doc.get("vllm_version"),
              "tokenizer": doc.get("tokenizer"), "tool": "vllm bench serve", "cases": p["cases"],
              "summary": summary, "reference": reference, "results": doc["results"]}
    try:
        os.makedirs(p["output_dir"], exist_ok=True)
        with open(files["json"], "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        with open(files["csv"], "w", encoding="utf-8") as fh:
            fh.write(to_csv(summary["rows"]))
        write_png(figure, files["png"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot write the benchmark files in {p['output_dir']}: {exc}")
    module.exit_json(changed=True, rows=summary["rows"], decode_tok_s=summary["decode_tok_s"],
                     ttft_ms=summary["ttft_ms"], ttft_prompt_tokens=summary["ttft_prompt_tokens"],
                     reference=reference,
                     lines=summary_lines(summary, reference) + ["written: " + ", ".join(files.values())],
                     vllm_version=doc.get("vllm_version"), tokenizer=doc.get("tokenizer"), files=files)


if __name__ == "__main__":
    main()
