#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: kit_launch_plan
short_description: Decide the EXL3 kit's launch from what the nodes showed
version_added: 0.3.0
description:
  - The decisions of the role C(dgxspark.vllm.kit_launch) (the EXL3 kit's C(./start.sh)) in one place; the role
    passes what it read on the nodes and carries out the result.
  - First (O(play_hosts) given) - whether the cluster is one the kit serves (the C(exl3_kit) launcher, a head and
    one worker, both in the play); when it is not, the result is only RV(cluster_problem).
  - Before the kit is placed (O(passwd), O(group) and O(described) given) - per node, the kit user's home and what
    is wrong with its account (it does not exist, it is not in the docker group, the worker's HF cache is not where
    the kit reads it); the one HCA the kit takes per node; the staged repositories; the C(.env)'s extra keys.
  - After the kit's state is read (O(states) and the kit's settings given) - whether the group must be (re)started
    and why, the digest of what it should run (kept in the head's record of the last start), the check-mode
    preview, the warm-up prompt, and C(./start.sh)'s argv, environment (secrets aside) and timing. The phase
    budgets, the poll interval and the API timeout are the cluster's (C(timing) of O(config)), as the launch's.
  - During and after a start (O(waits) given, the waits so far) - the next step and the rank it runs on (the
    worker's C(rendezvous), the head's C(serve), the worker C(alive), C(finish) - C(./start.sh)'s end - then
    C(record) the start or C(fail)) and the stage that failed; with O(started) and O(wanted), the record's text; with
    O(tails), the diagnosis a failed start ends with (each rank's failed wait as the launch words it, the engine's
    max-model-len estimate, the end of C(./start.sh)'s output and of both containers' logs).
  - For the report (O(decision) given) - what serves, EXL3's trade-off and the warm-up's time.
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Computes only; the result is the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is nothing to diff.
  idempotent:
    support: full
    details: The same inputs always give the same decisions, and nothing is ever changed.
options:
  config:
    description: The resolved cluster configuration, C(dgxspark_vllm_config) (set by M(dgxspark.vllm.cluster_config)).
    type: dict
    required: true
  head:
    description:
      - The head's inventory name (it runs C(./start.sh) and may keep its HF cache anywhere).
      - Not given - the head of O(config).
    type: str
  worker:
    description:
      - The worker's inventory name (C(./start.sh) drives it over ssh).
      - Not given - the first worker of O(config).
    type: str
  play_hosts:
    description: The play's hosts (C(ansible_play_hosts_all)), for the cluster check (RV(cluster_problem)).
    type: list
    elements: str
  kit_env:
    description: More kit keys by their kit name (the role's C(kit_launch_env)).
    type: dict
    default: {}
  passwd:
    description: Per inventory name, that node's C(getent_passwd) facts (M(ansible.builtin.getent) of the kit user).
    type: dict
  group:
    description: Per inventory name, that node's C(getent_group) facts (M(ansible.builtin.getent) of C(docker)).
    type: dict
  described:
    description: Per inventory name, the node as the launch role describes it (C(launch_node.node)).
    type: dict
  rdma:
    description:
      - Per inventory name, that node's M(dgxspark.vllm.rdma_link_info) result (skipped when the inventory names the
        HCA); a missing or failed read leaves the inventory's or the detected device.
    type: dict
    default: {}
  hf_staged:
    description:
      - With O(passwd), per inventory name, what that node's M(dgxspark.vllm.vllm_node_state) read of the staged
        repositories returned (its RV(dgxspark.vllm.vllm_node_state#module:hf_staged)). Given, the result says per
        node whether each repository the kit serves is staged and verified (RV(staged)) and whether the nodes hold
        the same commits (RV(commits), RV(commits_problem)).
    type: dict
  states:
    description: Per inventory name, that node's M(dgxspark.vllm.vllm_node_state) result (serve container, image ID).
    type: dict
  record:
    description: The head's M(ansible.builtin.slurp) result of the record of the last start (no C(content) - none).
    type: dict
    default: {}
  git:
    description: The head's M(ansible.builtin.git) result (its C(after) is the kit commit in place).
    type: dict
    default: {}
  rendered:
    description: The head's M(dgxspark.vllm.kit_env) result (its C(checksum) and C(unset_in_caller)).
    type: dict
    default: {}
  kit_commit:
    description: The pinned kit commit (C(kit_launch_commit)); the commit in place when O(git) has no C(after).
    type: str
  kit_dir:
    description: The kit's checkout on the head (C(kit_launch_dir)).
    type: str
  log:
    description: Where C(./start.sh)'s output goes on the head.
    type: str
  collection_staged:
    description: The collection staged the image and the weights; C(./start.sh) then neither pulls nor copies.
    type: bool
    default: true
  finish_timeout:
    description: Seconds, after the head serves, for C(./start.sh) to finish (C(kit_launch_finish_timeout)).
    type: int
  warmup_prompt_chars:
    description: The length of the warm-up request's prompt (C(kit_launch_warmup_prompt_chars)); C(0) - none.
    type: int
    default: 0
  secrets_file:
    description:
      - A file on the head, mode C(0600) and the kit user's (M(dgxspark.vllm.secret_file) with O(dgxspark.vllm.secret_file#module:env)),
        that sets the secrets C(./start.sh) needs (C(VLLM_API_KEY), C(HF_TOKEN)). The start's argv sources it with
        C(set -a) and removes it before C(./start.sh) runs, so the secrets are neither on a command line nor in
        the task's environment (which Ansible prints with C(-vvv)). Empty - no secrets.
    type: str
    default: ""
  waits:
    description:
      - During and after a start, the M(dgxspark.vllm.vllm_startup_wait) results by wait - C(rendezvous) (the
        worker's), C(serve) (the head's) and C(alive) (the worker's, once the head serves); skipped ones as
        registered, or empty before the wait ran.
    type: dict
  finished:
    description: After a start, the head's M(ansible.builtin.async_status) result of C(./start.sh).
    type: dict
    default: {}
  started:
    description:
      - With O(waits), per inventory name, the M(dgxspark.vllm.vllm_node_state) result read after the start; when
        the step is C(record), RV(record) keeps the containers that run.
    type: dict
  wanted:
    description: With O(started), the digest of what the group should run (RV(wanted) of the call with O(states)).
    type: str
  tails:
    description: With O(waits), per inventory name, the result of C(docker logs --tail) of its serve container.
    type: dict
  start_tail:
    description: With O(waits), the head's C(tail) of C(./start.sh)'s output (O(log)).
    type: dict
    default: {}
  decision:
    description: For the report, the result of the call with O(states) (its C(kit_commit) and C(outcome)).
    type: dict
  warmup:
    description: For the report, the head's M(ansible.builtin.uri) result of the warm-up request (skipped - none).
    type: dict
    default: {}
  repo_url:
    description: For the report, where the kit comes from (C(kit_launch_repo_url)).
    type: str
    default: ""
notes:
  - O(passwd) needs O(group) and O(described); O(states) needs O(kit_commit), O(kit_dir), O(log) and
    O(finish_timeout); O(started) needs O(waits) and O(wanted). At least one of O(play_hosts), O(passwd), O(states),
    O(waits) and O(decision) is given.
"""

EXAMPLES = r"""
- name: Check the cluster is one the kit serves
  dgxspark.vllm.kit_launch_plan:
    config: "{{ dgxspark_vllm_config }}"
    play_hosts: "{{ ansible_play_hosts_all }}"
  register: kit_cluster
  run_once: true

- name: Plan the kit's launch before the kit is placed
  dgxspark.vllm.kit_launch_plan:
    config: "{{ dgxspark_vllm_config }}"
    kit_env: "{{ kit_launch_env }}"
    passwd: "{{ dict(hosts | zip(hosts | map('extract', hostvars, ['ansible_facts', 'getent_passwd']))) }}"
    group: "{{ dict(hosts | zip(hosts | map('extract', hostvars, ['ansible_facts', 'getent_group']))) }}"
    described: "{{ dict(hosts | zip(hosts | map('extract', hostvars, ['launch_node', 'node']))) }}"
  vars:
    hosts: "{{ ansible_play_hosts }}"
  register: kit_plan
  run_once: true

- name: Decide whether the group must be (re)started
  dgxspark.vllm.kit_launch_plan:
    config: "{{ dgxspark_vllm_config }}"
    states: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'node_state'))) }}"
    record: "{{ hostvars[dgxspark_vllm_config.head].kit_record }}"
    kit_commit: "{{ kit_launch_commit }}"
    kit_dir: "{{ kit_launch_dir }}"
    log: "{{ kit_launch_dir }}/logs/dgxspark-start.log"
    finish_timeout: 900
  register: kit_decision
  run_once: true

- name: Judge the start from the waits of both ranks and the end of ./start.sh (the next step, or the record)
  dgxspark.vllm.kit_launch_plan:
    config: "{{ dgxspark_vllm_config }}"
    waits:
      rendezvous: "{{ hostvars[dgxspark_vllm_config.workers[0]].worker_wait | default({}) }}"
      serve: "{{ hostvars[dgxspark_vllm_config.head].head_wait | default({}) }}"
      alive: "{{ hostvars[dgxspark_vllm_config.workers[0]].worker_alive | default({}) }}"
    finished: "{{ hostvars[dgxspark_vllm_config.head].start_done }}"
    wanted: "{{ kit_decision.wanted }}"
    started: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'after_state'))) }}"
  register: kit_judged
  run_once: true
"""

RETURN = r"""
cluster_problem:
  description: What makes the cluster one the kit cannot serve (empty when nothing does).
  returned: when O(play_hosts) is given
  type: str
accounts:
  description: Per inventory name, the kit user's C(home) there and the C(problem) with its account (empty when none).
  returned: when O(passwd) is given
  type: dict
  sample: {"spark-b": {"home": "/home/spark", "problem": ""}}
nodes:
  description: Per inventory name, the node as M(dgxspark.vllm.kit_env) takes it (with the one HCA the kit takes).
  returned: when O(passwd) is given
  type: dict
  sample: {"spark-a": {"name": "spark-a", "cx7_ip": "10.77.1.11", "ib_hca": "rocep1s0f1"}}
repos:
  description: The staged repositories the kit serves (C(repo), C(revision)) - the checkpoint, then the drafter.
  returned: when O(passwd) is given
  type: list
  elements: dict
  sample: [{"repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "revision": "main"}]
env:
  description:
    - The C(.env)'s extra keys (O(kit_env), the cluster's GPU memory share and max-model-len, MTP without a drafter).
  returned: when O(passwd) is given
  type: dict
  sample: {"GPU_MEM_UTIL": 0.85, "MAX_MODEL_LEN": 850000}
staged:
  description: Per inventory name, the C(problem) with its staged repositories (empty when each is staged and verified).
  returned: when O(passwd) and O(hf_staged) are given
  type: dict
  sample: {"spark-b": {"problem": ""}}
commits:
  description: The commit of each staged repository on the head (repo to commit id); what the kit serves.
  returned: when O(passwd) and O(hf_staged) are given
  type: dict
  sample: {"brandonmusic/GLM-5.3-Flash-tr3-4bpw": "5d3f..."}
commits_problem:
  description: Empty when every node holds the same commits; else names each node's.
  returned: when O(passwd) and O(hf_staged) are given
  type: str
wanted:
  description: The digest of what the group should run (the C(.env), the kit commit, each node's image ID, the user).
  returned: when O(states) is given
  type: str
restart:
  description: Whether the group must be (re)started.
  returned: when O(states) is given
  type: bool
refusal:
  description:
    - Why the group may not start now (staging runs on a node - its staging lock, as O(states) read it), or null.
      Only a restart is refused; a group left as it is keeps serving.
  returned: when O(states) is given
  type: str
why:
  description: Why it is (re)started, or C(unchanged).
  returned: when O(states) is given
  type: str
  sample: a rank is not running
running:
  description: Per inventory name whose serve container runs, that container's ID.
  returned: when O(states) is given
  type: dict
kit_commit:
  description: The kit commit in place (O(git)'s C(after), else O(kit_commit)).
  returned: when O(states) is given
  type: str
preview:
  description: What a check-mode run would do.
  returned: when O(states) is given
  type: str
  sample: "nothing to start: both ranks run the rendered .env"
outcome:
  description: The report's word on the start (C(started (why)) or C(already running, unchanged)).
  returned: when O(states) is given
  type: str
start:
  description:
    - C(./start.sh)'s C(argv), its C(env) (secrets aside), the background job's bound C(async_seconds) and the polls
      of its end C(finish_retries).
    - C(secrets_file) is O(secrets_file) as given (the argv sources it; empty - none).
  returned: when O(states) is given
  type: dict
launcher:
  description: The profile's launcher (C(exl3_kit)).
  returned: when O(states) is given
  type: str
poll_seconds:
  description: The delay of the polls of C(./start.sh)'s end and of the API - the cluster's poll interval rounded up to whole seconds.
  returned: when O(states) is given
  type: int
api_retries:
  description: The polls of the head's API (the cluster's API timeout over RV(poll_seconds)).
  returned: when O(states) is given
  type: int
warmup_prompt:
  description: The warm-up request's prompt, about O(warmup_prompt_chars) characters (empty - none).
  returned: when O(states) is given
  type: str
warmup:
  description: Whether the warm-up request is sent (the group is started and there is a prompt).
  returned: when O(states) is given
  type: bool
step:
  description:
    - The next step of a start - the first wait that has not run (C(rendezvous), C(serve), C(alive)), then C(finish)
      (C(./start.sh)'s end); then C(record) (both ranks reached their phases and C(./start.sh) exited 0); C(fail) as
      soon as a wait failed, or when C(./start.sh) did not end well.
  returned: when O(waits) is given
  type: str
  sample: serve
host:
  description: The inventory name the step runs on (empty for C(fail)).
  returned: when O(waits) is given
  type: str
peers:
  description: For the step C(serve), the CX7 IPs the head watches while it starts to serve (the worker's).
  returned: when RV(step) is C(serve)
  type: list
  elements: str
record:
  description: The record of the start the head keeps (JSON - C(wanted), the running C(containers) per node, C(started)).
  returned: when O(started) is given and RV(step) is C(record)
  type: str
stage:
  description: The stage that failed (the first failed wait, else C(./start.sh)'s end); empty when none did.
  returned: when O(waits) is given
  type: str
  sample: the worker reaching the rendezvous
failures:
  description: Each rank's failed wait, as the launch words it.
  returned: when O(waits) is given
  type: list
  elements: str
message:
  description: The diagnosis a failed start ends with.
  returned: when O(waits) and O(tails) are given
  type: str
report:
  description: What serves (the kit and its commit, the outcome, port, max-model-len, drafter), EXL3's trade-off and the warm-up.
  returned: when O(decision) is given
  type: str
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._kit_plan import ARGUMENT_SPEC


def main() -> None:
    refuse("kit_launch_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
