#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: launch_plan
short_description: Decide the launch's next step and every node's container
version_added: 0.3.0
description:
  - The launch's decisions in one place. Takes the nodes' states (one M(dgxspark.vllm.vllm_node_state) read per node),
    the resolved configuration, the KV record and, after a start, what every rank showed; returns every node's
    container (as M(dgxspark.vllm.vllm_serve_spec) renders it) and one next step.
  - "Steps: C(nothing) (every rank runs the render), C(start) (start the group; the KV budget is known),
    C(calibrate) (start without a KV budget, then read every rank's estimate), C(refit) (start with the max-model-len
    the engine estimated, when O(calibration.accept_estimated_max_model_len)), C(fail) (stop every rank and fail
    with RV(message)), C(done) (the group serves; RV(message) is the KV report)."
  - A launch is at most three starts. The first call passes no O(previous); each later call passes the last
    result's RV(state) and what its step observed (O(observed) after a start, O(metrics) after C(nothing)).
  - Records the KV budget a calibration measured, and the maximum model length an engine estimated, in the KV record
    (C(calibration.path)) on the controller. Runs on the controller only (an action plugin); it never connects to a
    node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Decides the same way; the KV record is not written.
  diff_mode:
    support: none
    details: The record's change is reported as changed only.
  idempotent:
    support: partial
    details: The same inputs give the same step; a calibration or a failed fit records its measurement once.
options:
  config:
    description: The resolved configuration (C(dgxspark_vllm_config)).
    type: dict
    required: true
  nodes:
    description:
      - Per inventory name, that node's M(dgxspark.vllm.vllm_node_state) result, read with its C(name) (for
        C(node) and C(identity)), the serve container and image, the GPU and (on the head) the checkpoint stamp.
    type: dict
    required: true
  api_key:
    description: The API key, when one is set (the render names it in C(secret_env); its value is never returned).
    type: str
  calibration:
    description: The KV calibration settings (the launch role's C(launch_kv_*) variables).
    type: dict
    default: {}
    suboptions:
      enabled:
        description: Look up (and record) the KV budget of the cluster's key; false leaves the size to vLLM.
        type: bool
        default: true
      path:
        description: The KV record (JSON, on the controller). Required when O(calibration.enabled).
        type: path
      policy:
        description: Which of vLLM's suggestions to take.
        type: str
        choices: [requested, full]
        default: requested
      margin_bytes:
        description: Bytes taken off the chosen budget.
        type: int
        default: 0
      default_block_size:
        description: The KV block size when the render sets no C(--block-size) (to round a max-model-len fit).
        type: int
        default: 16
      accept_estimated_max_model_len:
        description: Start with the engine's estimated max-model-len (rounded down to the block size) instead of failing.
        type: bool
        default: false
      head_record:
        description:
          - The cluster's copy of the KV record as read on its head (its text, or null when it has none). Its entries
            join the controller's record (of an entry in both, the one recorded later), which is written with them;
            RV(kv_record) then says whether the head's copy must be written.
        type: raw
      head_path:
        description: Where O(calibration.head_record) was read, for messages.
        type: str
        default: the head's KV record
  previous:
    description: The last call's RV(state); omitted on the first call of a launch.
    type: dict
  observed:
    description:
      - After a start, per inventory name, what that rank showed - C(flush) (the flush service's start result),
        C(rendezvous), C(load), C(serve), C(alive) (the registered M(dgxspark.vllm.vllm_startup_wait) results,
        skipped ones included).
    type: dict
  metrics:
    description: After C(nothing), the head's M(dgxspark.vllm.vllm_metrics_info) result (for the KV report).
    type: dict
  diagnosis_lines:
    description: How many log lines of every rank a failure shows (as its waits kept them).
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Plan the launch
  dgxspark.vllm.launch_plan:
    config: "{{ dgxspark_vllm_config }}"
    nodes: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'launch_node'))) }}"
    calibration:
      path: "{{ inventory_dir }}/dgxspark-kv-calibration.json"
  register: launch_plan
  run_once: true
"""

RETURN = r"""
step:
  description: The next step (nothing, start, calibrate, refit, fail, done).
  returned: success
  type: str
  sample: calibrate
specs:
  description: Per inventory name, the node's container as M(dgxspark.vllm.vllm_serve_spec) returns it.
  returned: success
  type: dict
  sample: {"spark-a": {"config_hash": "0123abcd", "rank": 0, "role": "head", "command_line": "docker run ..."}}
message:
  description: The diagnosis of a C(fail), the KV report of C(done); empty otherwise.
  returned: success
  type: str
  sample: "KV cache: 45175492096 bytes (recorded ...); 368000 tokens ... at max-model-len 131072."
stop_first:
  description: The last start failed; stop every rank (head first) before anything else.
  returned: success
  type: bool
any_exists:
  description: Some node has a serve container (a start stops it first).
  returned: success
  type: bool
attempts:
  description:
    - The starts a launch may make, when this step starts the group (C(start), C(calibrate), C(refit)); empty
      otherwise. C([1]) for a start with a known KV budget, C([1, 2]) for a calibration (then the start with its
      budget), C([1, 2, 3]) when C(accept_estimated_max_model_len) may add a refit start. The launch role's one start
      loop runs over the first plan's list; each start is planned by the one before it, and once a start serves or
      the plan fails the remaining turns do nothing.
  returned: success
  type: list
  elements: int
  sample: [1, 2, 3]
attempt:
  description: How many starts this launch has planned so far (0 when nothing starts).
  returned: success
  type: int
kv_record:
  description:
    - The KV record after this call (C(text), JSON) and whether the head's copy lacks any of it (C(head_differs)); null
      when O(calibration.head_record) was not given or calibration is off.
  returned: success
  type: dict
carry_out:
  description:
    - Whether the launch role's entry point C(run_plan) has anything to do after this plan (the first one), that is
      a start, the check of a group found serving that did not answer everywhere yet (C(nothing)), a refusal
      (C(fail)), a KV record the head's copy lacks (C(kv_record.head_differs)), or in check mode each node's docker
      run line.
    - False only for a first plan (no O(previous)) that finds the group serving its render and answering everywhere
      (RV(step=done)) with the head's copy of the KV record complete; the caller (playbooks/launch.yml) then reports
      RV(message) and does not run the entry point. Every later plan (a start's, the API check's, made inside the
      entry point) is true.
  returned: success
  type: bool
kv:
  description: The KV budget (C(bytes)), its C(source) (inventory, off, cache, calibrate, calibrated), C(key) and C(text).
  returned: success
  type: dict
max_model_len:
  description: The max-model-len the render gives the engine.
  returned: success
  type: str
notes:
  description: What this launch changed on its own (a max-model-len fit).
  returned: success
  type: list
  elements: str
serving:
  description:
    - Each rank's serve container start (Docker's C(State.StartedAt)) when this launch found the group serving its
      render and starts nothing (steps C(nothing) and C(done) after it); empty once a start is planned. The guard
      role takes it as C(guard_serving), to leave a guard that keeps this group as it is.
  returned: success
  type: dict
  sample: {"spark-a": "2026-12-01T07:05:12.123456789Z", "spark-b": "2026-12-01T07:04:40.987654321Z"}
steps:
  description:
    - Every step this launch planned so far, in order, this one last - the launch's path in one list. A group found
      serving and answering is C([done]); one found serving that had to be checked first is C([nothing, done]); a
      cold start C([start, done]), with a KV calibration C([calibrate, start, done]).
  returned: success
  type: list
  elements: str
  sample: ["calibrate", "start", "done"]
state:
  description: What the next call continues from (pass it as O(previous)).
  returned: success
  type: dict
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import ARGUMENT_SPEC


def main() -> None:
    refuse("launch_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
