#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_verify_judge
short_description: Judge what the verify role collected from a vLLM cluster, and build its report
version_added: 0.1.0
description:
  - Takes the raw results the verify role collected (the serve container of every node, C(/v1/models) fetched
    from every node and from the controller, a chat completion, a forced tool call, a non-English completion,
    and CPU-time or nvidia-smi samples of every node around a long completion) and returns one judged check
    per item and node, each with a result (V(pass), V(fail), V(skipped)), the evidence, and on failure the
    likely cause and the fix.
  - Also returns the report (JSON-ready), a readable table, and a message listing every failed check.
  - Never fails because a check failed; RV(ok) says whether all passed. The caller decides (the verify role
    fails the play).
  - Run it on the controller (C(delegate_to=localhost), C(run_once)); it never touches the target.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  served_model_name:
    description: The model name C(/v1/models) must list.
    type: str
    required: true
  api_url:
    description: Base URL of the API (for the evidence and messages), e.g. V(http://10.0.0.1:8000).
    type: str
    required: true
  max_model_len:
    description: Expected C(max_model_len) of the served model; compared only when given.
    type: int
  containers:
    description:
      - The serve container of every node - C(node), C(role) (head or worker), and C(info), the result of
        M(community.docker.docker_container_info).
    type: list
    elements: dict
    default: []
  models:
    description:
      - C(/v1/models) as fetched from each place - C(node) (a node name or V(controller)) and C(response), the
        result of M(ansible.builtin.uri) (with C(status), C(json) or C(content), C(msg), C(elapsed)).
    type: list
    elements: dict
    default: []
  chat:
    description: The uri result of the short chat completion; omitted means skipped.
    type: dict
  tool_call:
    description: The uri result of the forced tool call; omitted means skipped.
    type: dict
  tool_name:
    description: Name of the forced tool.
    type: str
    default: ""
  utf8:
    description: The uri result of the non-English completion; omitted means skipped.
    type: dict
  busy:
    description:
      - Busy-rank samples. C(mode) V(cpu) (the lab; C(nodes[].samples) holds three M(ansible.builtin.command)
        results of C(/proc/<pid>/stat) of the serve container - idle start, before, after the long completion),
        V(gpu) (C(nodes[].sample) holds one command result of C(nvidia-smi --format=csv) sampled during the
        long completion) or V(skip) (C(reason) says why).
      - C(completion) is the uri result of the long completion; C(min_cpu_seconds) and C(min_utilization) the
        thresholds.
    type: dict
  meta:
    description: Anything to store in the report's C(meta) (cluster, URL, times).
    type: dict
    default: {}
  not_sent_reason:
    description:
      - Why a request given as omitted or as a skipped task result was not sent; shown in its skipped check.
    type: str
    default: not requested
seealso:
  - module: dgxspark.vllm.vllm_verify_plan
"""

EXAMPLES = r"""
- name: Judge what was collected
  dgxspark.vllm.vllm_verify_judge:
    served_model_name: glm-5.3-flash
    api_url: http://198.51.100.11:8000
    max_model_len: 262144
    models:
      - {node: spark-2, response: "{{ hostvars['spark-2'].models_answer }}"}
      - {node: controller, response: "{{ models_from_controller }}"}
    chat: "{{ chat_answer }}"
    tool_call: "{{ tool_answer }}"
    tool_name: get_weather
    utf8: "{{ utf8_answer }}"
    busy:
      mode: gpu
      completion: "{{ long_answer }}"
      nodes: [{node: spark-1, sample: "{{ hostvars['spark-1'].smi }}"}, {node: spark-2, sample: "{{ hostvars['spark-2'].smi }}"}]
  delegate_to: localhost
  run_once: true
  register: verdict

- name: Fail with every failed check
  ansible.builtin.fail:
    msg: "{{ verdict.message }}"
  when: not verdict.ok
"""

RETURN = r"""
ok:
  description: True when no check failed.
  returned: always
  type: bool
  sample: false
checks:
  description: Every check, in order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Check name (rank_container, api_models, chat_completion, reasoning_parser, tool_call,
        token_integrity, long_completion, rank_busy).
      type: str
      returned: always
      sample: rank_busy
    node:
      description: Node the check is about, or V(controller) for a request the controller made.
      type: str
      returned: always
      sample: spark-2
    result:
      description: V(pass), V(fail) or V(skipped).
      type: str
      returned: always
      sample: fail
    evidence:
      description: What was seen.
      type: str
      returned: always
      sample: "spark-2: 0.01 CPU s during the completion (0.00 cores over 6.2 s; idle 0.00 cores)"
    cause:
      description: Likely cause (failures only, else null).
      type: str
      returned: always
      sample: the rank on spark-2 stayed idle while the cluster generated
    fix:
      description: What to do (failures only, else null).
      type: str
      returned: always
      sample: run playbooks/status.yml and playbooks/logs.yml; relaunch the whole group
    seconds:
      description: Duration of the request or sampling window, when known.
      type: float
      returned: always
      sample: 6.2
    data:
      description: Figures behind the verdict.
      type: dict
      returned: always
      sample: {"busy_cpu_seconds": 0.01}
failed_checks:
  description:
    - The failed checks (same shape as RV(checks)). Not named C(failed), which Ansible reads as the task's own
      failure.
  returned: always
  type: list
  elements: dict
  sample: []
counts:
  description: Number of checks per result.
  returned: always
  type: dict
  sample: {"pass": 9, "fail": 0, "skipped": 1}
table:
  description: Readable fixed-width table of every check.
  returned: always
  type: str
  sample: "CHECK  NODE  RESULT  SECONDS  EVIDENCE"
message:
  description: Every failed check with evidence, cause and fix; empty when all passed.
  returned: always
  type: str
  sample: ""
report:
  description: The whole report (ok, counts, checks, failed, meta, table, message), to be written as JSON.
  returned: always
  type: dict
  sample: {"ok": true, "counts": {"pass": 10, "fail": 0, "skipped": 0}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._verify import VerifyError, judge_all


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "served_model_name": {"type": "str", "required": True},
            "api_url": {"type": "str", "required": True},
            "max_model_len": {"type": "int"},
            "containers": {"type": "list", "elements": "dict", "default": []},
            "models": {"type": "list", "elements": "dict", "default": []},
            "chat": {"type": "dict"},
            "tool_call": {"type": "dict"},
            "tool_name": {"type": "str", "default": ""},
            "utf8": {"type": "dict"},
            "busy": {"type": "dict"},
            "meta": {"type": "dict", "default": {}},
            "not_sent_reason": {"type": "str", "default": "not requested"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        report = judge_all(served_model_name=p["served_model_name"], url=p["api_url"],
                           max_model_len=p["max_model_len"], containers=p["containers"], models=p["models"],
                           chat=p["chat"], tool_call=p["tool_call"], tool_name=p["tool_name"], utf8=p["utf8"],
                           busy=p["busy"], meta=p["meta"],
                           not_sent_reason=p["not_sent_reason"])
    except VerifyError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ok=report["ok"], checks=report["checks"], failed_checks=report["failed"],
                     counts=report["counts"], table=report["table"], message=report["message"], report=report)


if __name__ == "__main__":
    main()
