#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_kv_estimate_info
short_description: Read vLLM's KV-cache estimate, startup phase and engine error from an engine log
version_added: 0.1.0
description:
  - Parses the log of a vLLM engine (a container on the node, or log text passed in) and returns what the
    engine reported about its KV cache and how far its startup got.
  - Only the latest engine start in the log counts. A restarted container keeps its earlier lines; the start
    is found from the lines vLLM prints at the top of every start (C(vLLM API server version),
    C(non-default args:), C(Launching vLLM ... headless multiproc executor)).
  - When C(--kv-cache-memory-bytes) is unset, every GPU worker logs a C(--kv-cache-memory=N) suggestion. Run
    the module on every node; the smallest RV(kv_cache_memory_bytes) across the nodes is the value to render
    into the next launch.
  - The startup phase (V(container_started) < V(rendezvous) < V(weights_loaded) < V(kv_allocated) <
    V(api_up)) and the line that proved it tell a hung start where it stopped.
  - Reads only. It never changes the node.
author:
  - dgxspark.vllm maintainers (!UNKNOWN)
options:
  container:
    description:
      - Name or ID of the engine container on the target node; its log is read with
        C(docker logs --timestamps).
      - Mutually exclusive with O(log_text); one of the two is required.
    type: str
  log_text:
    description:
      - Log text to parse instead of reading a container, for example a log fetched earlier.
      - Mutually exclusive with O(container); one of the two is required.
    type: str
  since:
    description:
      - Passed to C(docker logs --since) (a timestamp such as V(2026-11-30T20:00:00Z), or a relative time such
        as V(30m)). Only with O(container).
    type: str
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
    details: Never changes anything; the result depends only on the log.
notes:
  - The suggestion line exists on GPU workers only. The CPU backend reports RV(cpu_kv_cache) instead.
  - A headless worker never reaches V(api_up); V(kv_allocated) is its last phase.
seealso:
  - name: vLLM engine arguments
    description: The C(--kv-cache-memory-bytes) flag the suggestion is meant for.
    link: https://docs.vllm.ai/en/latest/configuration/engine_args.html
"""

EXAMPLES = r"""
- name: Read the KV suggestion from the engine on each node
  dgxspark.vllm.vllm_kv_estimate_info:
    container: vllm_glm53
  register: kv

- name: Show where a hung start stopped
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} reached {{ kv.phase }} ({{ kv.phase_line }}), error: {{ kv.engine_error }}"

- name: Parse only what the engine logged since the launch
  dgxspark.vllm.vllm_kv_estimate_info:
    container: vllm_glm53
    since: "{{ launch_started_at }}"
  register: kv_since

- name: Parse log text fetched earlier
  dgxspark.vllm.vllm_kv_estimate_info:
    log_text: "{{ saved_log.content | b64decode }}"
  delegate_to: localhost
  register: kv_offline
"""

RETURN = r"""
suggestions:
  description:
    - One entry per GPU worker C(--kv-cache-memory=) suggestion in the latest start, in log order.
    - Empty when C(--kv-cache-memory-bytes) was set, on CPU, or before memory profiling finished.
  returned: always
  type: list
  elements: dict
  sample: [{"requested_limit_bytes": 45175492096, "gpu_limit_bytes": 59540753920, "rank": 0}]
  contains:
    requested_limit_bytes:
      description: KV bytes that fit into the requested gpu_memory_utilization.
      type: int
      returned: always
      sample: 45175492096
    gpu_limit_bytes:
      description: KV bytes that fill the GPU's free memory.
      type: int
      returned: always
      sample: 59540753920
    rank:
      description:
        - Tensor-parallel rank from the C(Worker_TP<k>) log prefix; without a prefix, the line's position
          among this log's suggestions.
      type: int
      returned: always
      sample: 0
kv_cache_memory_bytes:
  description: Smallest RV(suggestions[].requested_limit_bytes) across ranks, or null without suggestions.
  returned: always
  type: int
  sample: 45175492096
estimated_max_model_len:
  description:
    - N from C(Based on the available memory, the estimated maximum model length is N.), logged when
      C(--max-model-len) does not fit the KV cache; null otherwise.
  returned: always
  type: int
  sample: 131072
kv_cache_tokens:
  description: "Tokens in the KV pool from C(<pool> KV cache size: N tokens, ...); null until logged."
  returned: always
  type: int
  sample: 2097152
kv_cache_pool:
  description: The pool named on that line.
  returned: always
  type: str
  sample: GPU
max_concurrency:
  description: "C(Maximum concurrency for M tokens per request: X.XXx), as a float; null until logged."
  returned: always
  type: float
  sample: 1.2
available_kv_cache_gib:
  description: "C(Available KV cache memory: X GiB) on this node; null until logged."
  returned: always
  type: float
  sample: 46.5
cpu_kv_cache:
  description:
    - CPU backend only, from C(Explicitly set (kv/total) GiB for KV cache on node N.) or C(Auto set ...).
    - Null on GPU.
  returned: always
  type: dict
  sample: {"kv_gib": 1.0, "total_gib": 13.71, "mode": "explicit", "numa_node": 0}
  contains:
    kv_gib:
      description: GiB given to the KV cache.
      type: float
      returned: always
      sample: 1.0
    total_gib:
      description: GiB of memory the backend saw.
      type: float
      returned: always
      sample: 13.71
    mode:
      description: V(explicit) (VLLM_CPU_KVCACHE_SPACE or the byte flag) or V(auto).
      type: str
      returned: always
      sample: explicit
    numa_node:
      description: The NUMA node the line names.
      type: int
      returned: always
      sample: 0
phase:
  description: Highest startup phase the latest start reached.
  returned: always
  type: str
  choices: [container_started, rendezvous, weights_loaded, kv_allocated, api_up]
  sample: kv_allocated
phase_line:
  description: The log message that proved RV(phase); null for V(container_started).
  returned: always
  type: str
  sample: "GPU KV cache size: 315,039 tokens, Maximum concurrency for 262,144 tokens per request: 1.20x"
engine_error:
  description: Short reason for the most specific fatal error in the latest start; null when there is none.
  returned: always
  type: str
  sample: worker started without --headless (follower assertion)
error_line:
  description: The log message that proved RV(engine_error); null when there is no error.
  returned: always
  type: str
  sample: "AssertionError: collective_rpc should not be called on follower node"
starts_seen:
  description: Number of engine starts found in the log (0 for an empty log).
  returned: always
  type: int
  sample: 1
last_line:
  description: Last non-empty message of the latest start, useful when a start hangs.
  returned: always
  type: str
  sample: "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.0.0.1:29521 backend=nccl"
shards_done:
  description: Checkpoint shards loaded, from vLLM's progress bar (printed by rank 0 only); null without one.
  returned: always
  type: int
  sample: 40
shards_total:
  description: Checkpoint shards in all, from the same line; null without one.
  returned: always
  type: int
  sample: 80
progress_lines:
  description: Non-blank lines of the latest start, wait notices left out (what a stall watch sees move).
  returned: always
  type: int
  sample: 118
start_seen:
  description:
    - Whether the log still holds the latest start's first line. False when Docker's log rotation removed it (or
      the engine died before printing it); the phase and KV figures are then what the remaining lines prove.
  returned: always
  type: bool
  sample: true
"""

from functools import partial

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import (
    DockerLogsError,
    read_container_logs,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import parse_log


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str"},
            "log_text": {"type": "str"},
            "since": {"type": "str"},
        },
        mutually_exclusive=[("container", "log_text")],
        # neither option has a default, so required_one_of sees only what the user passed
        required_one_of=[("container", "log_text")],
        required_by={"since": "container"},
        supports_check_mode=True,
    )
    params = module.params
    if params["log_text"] is not None:
        text = params["log_text"]
    else:
        name = params["container"].strip()
        if not name:
            module.fail_json(msg="container must be a container name or ID, got an empty string")
        docker = module.get_bin_path("docker")
        if docker is None:
            module.fail_json(msg="the docker CLI is not installed on this node (not found on PATH)")
        try:
            text = read_container_logs(
                partial(module.run_command, errors="surrogate_then_replace"), name, params["since"], docker
            )
        except DockerLogsError as exc:
            module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **parse_log(text).as_dict())


if __name__ == "__main__":
    main()
