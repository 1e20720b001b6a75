#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_python_report
short_description: Decide whether each node's Python has what the collection's modules need there
version_added: 0.1.0
description:
  - A pure decision step. It reads nothing and changes nothing where it runs. The preflight role runs a read-only
    C(python3 -c) probe with each node's module interpreter (it prints the Python version and whether the
    libraries import) and hands every node's registered result here.
  - Checks, per node, C(python) (the probe ran and the version is at least 3.10, which huggingface_hub 2.4.0 on
    the downloading nodes requires) and C(python.requests) (community.docker's modules talk to the Docker API
    through C(requests)); each failure names the package that fixes it (C(python3-requests) on Ubuntu and
    DGX OS).
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  nodes:
    description:
      - One dict per node, with C(name) (the inventory name), C(interpreter) (the Python the probe ran with) and
        C(result) (the probe's result as the command module registers it, with C(rc), C(stdout), C(stderr)).
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Computes from its arguments only; runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    details: Never changes anything; always reports no change.
notes:
  - The module fails only on unusable input (a node without a name, a probe that printed no report). Failed
    checks are returned in RV(failures), with RV(ok) false; the caller decides to fail.
seealso:
  - module: dgxspark.vllm.preflight_report
"""

EXAMPLES = r"""
- name: Decide every node's Python, on the controller
  dgxspark.vllm.node_python_report:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'python_probe') | list }}"
  delegate_to: localhost
  run_once: true
  become: false
  register: node_python

- name: Fail with every missing piece and the package that provides it
  ansible.builtin.fail:
    msg: "{{ node_python.message }}"
  when: not node_python.ok
"""

RETURN = r"""
ok:
  description: Whether every node passed.
  returned: always
  type: bool
  sample: true
reports:
  description: Per node, the interpreter, its Python version, each library's version (null when it does not
    import) and the node's failures.
  returned: always
  type: dict
  sample:
    lab-head: {node: lab-head, interpreter: /usr/bin/python3, ok: true, python: "3.11.2",
               executable: /usr/bin/python3, libraries: {requests: "2.28.1"}, failures: []}
failures:
  description: Every failed check on every node, with its evidence and fix.
  returned: always
  type: list
  elements: dict
  sample:
    - node: lab-worker
      name: python.requests
      evidence: "/usr/bin/python3 cannot import requests (ModuleNotFoundError: No module named 'requests'); ..."
      fix: "On lab-worker (Ubuntu / DGX OS): sudo apt-get install -y python3-requests. ..."
message:
  description: Every failure with its fix, for a failure message; empty when RV(ok).
  returned: always
  type: str
  sample: "The Python that runs modules on 1 node(s) (lab-worker) lacks what the collection's modules need:\n- ..."
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._node_python import NodePythonError, evaluate


def main() -> None:
    module = AnsibleModule(
        argument_spec={"nodes": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    try:
        result = evaluate(module.params["nodes"])
    except NodePythonError as exc:
        module.fail_json(msg="node_python_report: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
