#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: guard_config
short_description: Build and check the group guard's configuration from the resolved cluster configuration
version_added: 0.2.0
description:
  - Builds the JSON document the group guard (role C(dgxspark.vllm.guard)) runs with - the ranks in rank order
    (the head, then the workers with their Host aliases in the guard's own ssh_config), the serve container, the
    head's API, the state and maintenance files and the timing tunables - and checks it with the guard's own parser.
  - Plans what the guard's SSH key may do on each worker (RV(access)) - its forced command (the guard's worker program,
    run as root through one sudoers rule), its C(authorized_keys) options (C(restrict), C(from=) the head's
    addresses) - and, given what the nodes hold (O(access_read)), whether that is installed as planned.
  - Each worker's management address is its C(ansible_host) (the inventory name when unset); the head's is resolved
    on the controller, as the SSH client would resolve it.
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
    details: The same inputs always give the same document, and nothing is ever changed.
options:
  config:
    description: The resolved cluster configuration, C(dgxspark_vllm_config) (set by M(dgxspark.vllm.cluster_config)).
    type: dict
    required: true
  tunables:
    description:
      - Timing and limits (C(interval_seconds), C(probe_interval_seconds), C(probe_timeout_seconds), C(grace_seconds),
        C(stop_seconds), C(poll_seconds), C(peer_grace_seconds), C(node_wait_seconds), C(backoff_seconds),
        C(backoff_max_seconds), C(max_failed_restores), C(window_seconds), C(log_lines), C(budgets)); unset ones take
        the guard's defaults.
    type: dict
    default: {}
  state_path:
    description: The guard's state file on the head.
    type: path
    default: /var/lib/dgxspark-guard/state.json
  maintenance_path:
    description: The maintenance lock on the head (under /run, so a reboot clears it).
    type: path
    default: /run/dgxspark/guard-maintenance.json
  payload:
    description:
      - The files the guard's install copies to the head (its program, the module_utils it imports, its unit's
        template); their bytes count in the fingerprint the document carries as C(_install).
    type: list
    elements: path
    default: []
  module_utils:
    description:
      - The collection's module_utils the guard imports (file names in C(plugins/module_utils)); their bytes count in
        the fingerprint too.
    type: list
    elements: str
    default: []
  install:
    description:
      - The settings that shape the install besides the document (paths, the Python, the unit's name); they count in
        the fingerprint too.
    type: dict
    default: {}
  installed:
    description:
      - The text of the configuration installed on the head now (absent when there is none). RV(current) says whether
        it is the document, fingerprint included.
    type: str
  serving:
    description:
      - Each rank's serve container start (Docker's C(State.StartedAt)), keyed by inventory name, as read in this run
        by a caller that started nothing since (the launch's node read when the group already served). With it,
        RV(arm) is false when the guard is installed as planned and keeps this group already.
      - Empty (the caller started the group, or read nothing), RV(arm) is true.
    type: dict
    default: {}
  armed_state:
    description: The text of the guard's state file on the head as read in this run (absent when there is none).
    type: str
  maintenance_held:
    description:
      - Whether a maintenance lock of another run is held on the head, as read in this run (the lock file exists and
        this run did not take it). A lock the caller took itself (the guard role's C(guard_maintenance_holder)) is no
        reason to arm, since the caller gives it back either way.
    type: bool
    default: false
  state_exists:
    description:
      - Whether the guard's state file exists on the head, as read in this run (a guard armed or disarmed before). A
        guard with no state file is started by its first arm (RV(arm_steps)), one with a state file by C(prepare)
        (RV(prepare_steps)).
    type: bool
    default: false
  install_only:
    description:
      - The guard role's C(guard_install_only) - its C(prepare) installs what differs and starts nothing (RV(prepare_steps)
        never holds C(start) then).
    type: bool
    default: false
  lock_mine:
    description:
      - Whether this run holds the maintenance lock (the guard role's C(guard_maintenance_holder)). When the arm is left
        out (RV(arm) false), the run gives it back itself (RV(arm_steps) holds C(release)).
    type: bool
    default: false
  ssh_config:
    description: The guard's own ssh_config on the head (its key, the workers' aliases), written into the document.
    type: path
    default: /etc/dgxspark/guard/ssh_config
  access:
    description: The settings of the guard's SSH access to the workers.
    type: dict
    suboptions:
      user:
        description: The account on each worker the guard's key logs in as (in no docker group).
        type: str
        default: dgxspark-guard
      python:
        description: The workers' Python 3, which runs the worker program.
        type: path
        default: /usr/bin/python3
      program:
        description: The worker program's path on each worker (its file name that of the O(payload) file it installs).
        type: path
        default: /usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py
      home:
        description: The account's home on each worker (root's; its C(.ssh/authorized_keys) holds the guard's key).
        type: path
        default: /var/lib/dgxspark-guard
      sudoers_path:
        description: The sudoers drop-in on each worker that lets the account run the forced command as root.
        type: path
        default: /etc/sudoers.d/dgxspark-guard
      ssh_from:
        description:
          - More addresses or networks the workers accept the guard's key from, besides the head's management address
            (its C(ansible_host), resolved) and its CX7 address.
        type: list
        elements: str
        default: []
  webhook_url:
    description:
      - The URL the guard notifies (the guard role's C(guard_webhook_url)); empty, none. Checked (C(http://) or
        C(https://) with a host; the error never repeats it), then left out of the document, which names O(webhook_path)
        instead, and out of the result.
    type: str
    default: ""
  webhook_path:
    description: The root-only file on the head the guard role writes O(webhook_url) to, named in the document.
    type: path
    default: /etc/dgxspark/guard/webhook_url
  webhook_read:
    description:
      - That file as read in this run (C(exists), C(sha256), as M(dgxspark.vllm.service_files_info) returns it). Given,
        RV(current) is also false unless it holds O(webhook_url) (or is absent when that is empty).
    type: dict
  unit_read:
    description:
      - The guard's unit on the head as read in this run (C(running), C(started_at), as
        M(dgxspark.vllm.service_files_info) returns a unit). With O(installed_read), RV(restart) tells whether the
        running guard is older than the files it runs from.
    type: dict
  installed_read:
    description:
      - The guard's files on the head that each install writes last, as read in this run (each with C(path), C(exists)
        and C(mtime), as M(dgxspark.vllm.service_files_info) returns a file) - its configuration, which names the
        fingerprint of the program, the module_utils and the unit, and the webhook URL's file.
    type: list
    elements: dict
    default: []
  access_read:
    description:
      - What the nodes hold of the guard's access, as read in this run - C(head_public_key) (the text of the head's
        public key, null when absent) and C(workers), per worker the files M(dgxspark.vllm.service_files_info) read
        there (each with C(path), C(exists), C(sha256) and C(content)) - its C(authorized_keys) and the sudoers
        drop-in read, the worker program with its SHA-256; other files are ignored.
      - Given, RV(current) is also false unless they hold the access as planned (a teardown removed it).
    type: dict
"""

EXAMPLES = r"""
- name: Build the guard's configuration
  dgxspark.vllm.guard_config:
    config: "{{ dgxspark_vllm_config }}"
    tunables:
      grace_seconds: 60
  register: guard_plan
  run_once: true
"""

RETURN = r"""
document:
  description: The guard's configuration (written to /etc/dgxspark/guard.json by the guard role).
  returned: success
  type: dict
  sample: {"container": "vllm_glm53", "api_url": "http://127.0.0.1:8000", "ranks": [{"name": "spark-a", "role": "head"}]}
workers:
  description: Per worker - C(name), its SSH C(alias) in the guard's ssh_config, and its management C(address).
  returned: success
  type: list
  elements: dict
  sample: [{"name": "spark-b", "alias": "dgxspark-guard-spark-b", "address": "192.168.1.12"}]
current:
  description:
    - Whether O(installed) is this document, C(_install) fingerprint included - the same configuration, program,
      module_utils, unit, settings and SSH access are on the head already - and, with O(access_read), whether the nodes
      hold the access as planned.
  returned: success
  type: bool
  sample: true
access:
  description:
    - The guard's SSH access to the workers - C(user), C(program) (the worker program's path on the workers), C(from)
      (the addresses its key is accepted from), C(command) (the forced command, as a list), C(key_options) (the
      C(authorized_keys) options), C(sudoers) (the sudoers drop-in's text), and with O(access_read) C(drift) (why what
      the nodes hold is not that; empty when it is).
  returned: success
  type: dict
  sample: {"user": "dgxspark-guard", "from": ["192.168.1.11", "192.168.100.1"], "drift": []}
webhook:
  description:
    - The webhook URL's file - C(path), C(present) (whether the role writes it; false - it removes it) and C(current)
      (whether O(webhook_read) holds what it must). Never the URL.
  returned: success
  type: dict
  sample: {"path": "/etc/dgxspark/guard/webhook_url", "present": true, "current": true}
arm:
  description:
    - Whether the run must arm the guard now. False only when the guard is installed as planned (RV(current)), its
      state file says it is armed with the containers in O(serving), no maintenance lock is held and no restore is
      left to forget (arming would change nothing).
  returned: success
  type: bool
  sample: false
prepare_steps:
  description:
    - What the guard role's C(prepare) carries out after this plan on the head, in order - C(install) (RV(current) is
      false), C(restart) (RV(restart)), C(start) (a guard with a state file that is not installed, running and enabled
      at boot as planned; never with O(install_only)). Empty, C(prepare) skips its steps whole.
    - In check mode only C(install) (which shows its differences); nothing is restarted or started.
  returned: success
  type: list
  elements: str
  sample: []
arm_steps:
  description:
    - What the guard role's C(arm) (after C(prepare), in the same run) carries out on the head, in order - C(start) (a
      guard with no state file, never armed, that does not run as planned), C(arm) (RV(arm)), or instead C(release) (the
      lock this run holds, O(lock_mine), when the arm is left out). Empty, C(arm) skips its steps whole and only reports
      (the guard keeps this group already and the run holds no lock).
    - Empty in check mode.
  returned: success
  type: list
  elements: str
  sample: ["arm"]
restart:
  description:
    - Whether the guard runs a process that started before one of O(installed_read) was written (an install whose
      restart did not happen - the run failed before its handlers, or was stopped); the role restarts it. False when
      it does not run, or O(unit_read) is not given.
  returned: success
  type: bool
  sample: false
restart_reason:
  description: The files the running guard is older than (one phrase), or an empty string.
  returned: success
  type: str
  sample: ""
arm_reason:
  description: Why the guard is armed now, or why it is not (one phrase).
  returned: success
  type: str
  sample: "the group was started in this run (or its containers were not read)"
problems:
  description: Every problem found, when the document cannot be used.
  returned: failure
  type: list
  elements: str
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._guard import CONFIG_ARGUMENT_SPEC


def main() -> None:
    refuse("guard_config", CONFIG_ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
