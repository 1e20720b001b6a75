#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: firewall_plan
short_description: Decide every node's nftables ruleset (who may reach the API, the master port and the CX7 link)
version_added: 0.3.0
description:
  - The decisions of the role C(dgxspark.vllm.firewall) in one place; the role passes what it read on the nodes and
    writes the result.
  - Per node - the CX7 port (the interface that carries its C(dgxspark_vllm_cx7_ip)), the other nodes' CX7 IPs (the
    only sources allowed on that port) and the ruleset, one C(inet dgxspark) table replaced in one transaction.
  - The API's networks - C(dgxspark_vllm_api_allowed_cidrs) and the controller's own address (the client address of
    Ansible's SSH session on the nodes, O(controller)); the nodes' own management addresses are always added. With
    neither a list nor a known controller address the plan fails, naming the variable.
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
    details: The same inputs always give the same rulesets, and nothing is ever changed.
options:
  config:
    description: The resolved cluster configuration, C(dgxspark_vllm_config) (set by M(dgxspark.vllm.cluster_config)).
    type: dict
    required: true
  addresses:
    description: Per inventory name, that node's C(ip -j addr show) output (its text, or parsed).
    type: dict
    required: true
  reached:
    description: Per inventory name, the address Ansible reaches the node on (C(ansible_host)); a name is resolved on
      the controller.
    type: dict
    required: true
  controller:
    description: Per inventory name, the C(SSH_CONNECTION) of Ansible's session on that node (C(client_ip client_port
      server_ip server_port)); empty when it was not reached over SSH. Its client address is the controller's.
    type: dict
    default: {}
  routers:
    description: The hosts of the group C(spark_router) (role C(dgxspark.vllm.router)); the API answers each one's
      C(ansible_host) (a name is resolved on the controller), where the router's health checks and requests come from.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Plan every node's ruleset
  dgxspark.vllm.firewall_plan:
    config: "{{ dgxspark_vllm_config }}"
    addresses: "{{ dict(hosts | zip(hosts | map('extract', hostvars, ['node_ip', 'stdout']))) }}"
    reached: "{{ dict(hosts | zip(hosts | map('extract', hostvars, 'node_reached'))) }}"
    controller: "{{ dict(hosts | zip(hosts | map('extract', hostvars, ['node_session', 'stdout']))) }}"
  vars:
    hosts: "{{ ansible_play_hosts_all }}"
  run_once: true
  register: firewall_plan
"""

RETURN = r"""
nodes:
  description: Per inventory name, C(ruleset) (the nftables file), C(cx7_iface) and C(peers) (the other CX7 IPs).
  returned: success
  type: dict
api_cidrs:
  description: The networks the API answers (besides the node itself).
  returned: success
  type: list
  elements: str
controller:
  description: The controller's addresses the API answers (as the nodes saw Ansible's SSH sessions come from).
  returned: success
  type: list
  elements: str
routers:
  description: The router hosts' addresses the API answers.
  returned: success
  type: list
  elements: str
source:
  description: Where the API's networks came from.
  returned: success
  type: str
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import ARGUMENT_SPEC


def main() -> None:
    refuse("firewall_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
