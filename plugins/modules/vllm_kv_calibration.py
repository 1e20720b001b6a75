#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_kv_calibration
short_description: Look up or record a cluster's measured KV-cache budget in a JSON file
version_added: 0.1.0
description:
  - Computes the calibration key of a cluster - the image ID on every node, the model path and staged commit,
    the memory-relevant serve flags of the rendered command (C(--max-model-len), C(--gpu-memory-utilization),
    C(--kv-cache-dtype), C(--block-size), parallel sizes, batch limits, speculative config, C(--enforce-eager),
    MoE backend, quantization, dtype) and each node's hardware identity (GPU name, driver, GPU memory,
    MemTotal).
  - With O(state=lookup), returns the entry recorded for that key in O(path), if any.
  - With O(state=record) and O(reports), chooses the KV budget from the engines' own estimates (the smallest
    C(--kv-cache-memory=) suggestion across all ranks for GPU engines, or the smallest C(Auto set) KV size for
    CPU engines, per O(policy) minus O(margin_bytes)) and records it for that key.
  - With O(state=record) and O(estimated_max_model_len), records the estimated maximum model length the engine
    reported when the key's C(--max-model-len) did not fit.
  - Runs where the file lives, on the controller - an action plugin of the same name runs the task in the
    controller's own process (no module run on a node); O(path) is a path on the controller. The launch role
    calls it with C(run_once).
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  path:
    description:
      - The calibration cache file (JSON). Its directory must exist; the file is created on the first record.
    type: path
    required: true
  state:
    description:
      - V(lookup) reads only; V(record) writes the key's entry (atomically).
    type: str
    choices: [lookup, record]
    default: lookup
  command:
    description: The serve command as rendered for the head (the C(container.command) of P(dgxspark.vllm.vllm_serve_spec#module)).
    type: list
    elements: str
    required: true
  model_path:
    description: The served model path.
    type: str
    required: true
  model_revision:
    description: The commit the checkpoint was staged and verified at (from its stamp), or the configured revision.
    type: str
    required: true
  nodes:
    description: Every node in rank order.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name.
        type: str
        required: true
      image_id:
        description: ID of the serve image on that node (empty when the image is absent).
        type: str
        required: true
      hardware:
        description: "C(gpu_name), C(driver), C(gpu_memory) (nvidia-smi's text, null without a GPU) and C(mem_total_bytes)."
        type: dict
        required: true
  reports:
    description:
      - With O(state=record), node name -> the result of P(dgxspark.vllm.vllm_kv_estimate_info#module) on that
        node's engine, read after a launch without C(--kv-cache-memory-bytes).
    type: dict
  estimated_max_model_len:
    description: With O(state=record), the estimated maximum model length to record instead of a KV budget.
    type: int
  policy:
    description:
      - V(requested) takes the suggestion that fits the requested C(gpu_memory_utilization); V(full) the one
        that fills the GPU's free memory. CPU engines have one value only.
    type: str
    choices: [requested, full]
    default: requested
  margin_bytes:
    description: Bytes taken off the chosen value, as a safety margin.
    type: int
    default: 0
  default_block_size:
    description: The KV block size when O(command) sets no C(--block-size) (vLLM's default for the backend).
    type: int
    default: 16
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: O(state=record) reports whether it would change the file and what it would record, without writing.
  diff_mode:
    support: full
    details: Shows the key's entry before and after.
  idempotent:
    support: full
    details: Recording the same value for the same key again changes nothing.
notes:
  - The file holds no secret. Delete it, or an entry, to force a new calibration.
seealso:
  - module: dgxspark.vllm.vllm_kv_estimate_info
  - module: dgxspark.vllm.vllm_serve_spec
"""

EXAMPLES = r"""
- name: Look up the KV budget measured earlier for this exact cluster
  dgxspark.vllm.vllm_kv_calibration:
    path: "{{ inventory_dir }}/dgxspark-kv-calibration.json"
    command: "{{ spec.container.command }}"
    model_path: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    model_revision: 0123456789abcdef0123456789abcdef01234567
    nodes:
      - {name: spark-a, image_id: "sha256:3f1c...", hardware: {gpu_name: NVIDIA GB10, driver: "580.95.05", gpu_memory: "[N/A]", mem_total_bytes: 128526278656}}
      - {name: spark-b, image_id: "sha256:3f1c...", hardware: {gpu_name: NVIDIA GB10, driver: "580.95.05", gpu_memory: "[N/A]", mem_total_bytes: 128526278656}}
  delegate_to: localhost
  run_once: true
  register: kv_cal

- name: Record the budget read back from both engines
  dgxspark.vllm.vllm_kv_calibration:
    path: "{{ inventory_dir }}/dgxspark-kv-calibration.json"
    state: record
    command: "{{ spec.container.command }}"
    model_path: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    model_revision: 0123456789abcdef0123456789abcdef01234567
    nodes: "{{ kv_nodes }}"
    reports: {spark-a: "{{ hostvars['spark-a'].kv }}", spark-b: "{{ hostvars['spark-b'].kv }}"}
    policy: requested
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
key:
  description: The calibration key (a digest of RV(parts)).
  returned: always
  type: str
  sample: 3b1f0c9e2a7d44e1c0aa
parts:
  description: What the key is made of.
  returned: always
  type: dict
found:
  description: Whether the file held an entry for the key before this call.
  returned: always
  type: bool
entry:
  description: The key's entry after this call (null when there is none).
  returned: always
  type: dict
kv_cache_memory_bytes:
  description: The KV budget of the key's entry after this call, or null.
  returned: always
  type: int
  sample: 45175492096
estimated_max_model_len:
  description: The estimated maximum model length recorded for the key, or null.
  returned: always
  type: int
block_size:
  description: The KV block size of O(command) (its C(--block-size), else O(default_block_size)).
  returned: always
  type: int
  sample: 2304
max_model_len_fit:
  description: RV(estimated_max_model_len) rounded down to a multiple of RV(block_size), or null.
  returned: always
  type: int
  sample: 129024
chosen:
  description: With O(reports), the choice made (value, source V(suggestion) or V(cpu_auto), policy, margin, per node).
  returned: when O(state=record) with O(reports)
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration_task import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_IF,
    CalibrationTaskError,
    run,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=MUTUALLY_EXCLUSIVE,
        required_if=REQUIRED_IF,
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode, module._diff)
    except CalibrationTaskError as exc:
        module.fail_json(msg=exc.msg, **exc.extra)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
