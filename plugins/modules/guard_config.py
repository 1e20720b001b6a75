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
    (the head, then the workers with their C(ssh://) Docker hosts), the serve container, the head's API, the
    state and maintenance files and the timing tunables - and checks it with the guard's own parser.
  - Each worker's management address is its C(ansible_host) (the inventory name when unset).
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
    description: Whether the maintenance lock file exists on the head, as read in this run.
    type: bool
    default: false
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
      module_utils, unit and settings are on the head already.
  returned: success
  type: bool
  sample: true
arm:
  description:
    - Whether the run must arm the guard now. False only when the guard is installed as planned (RV(current)), its
      state file says it is armed with the containers in O(serving), no maintenance lock is held and no restore is
      left to forget (arming would change nothing).
  returned: success
  type: bool
  sample: false
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._guard import CONFIG_ARGUMENT_SPEC


def main() -> None:
    module = AnsibleModule(
        argument_spec=CONFIG_ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    module.fail_json(msg="dgxspark.vllm.guard_config runs on the controller through its action plugin; "
                         "call it as a task (not through ansible.builtin.command or a module runner)")


if __name__ == "__main__":
    main()
