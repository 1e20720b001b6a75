#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rolling_plan
short_description: Decide a rolling change over the clusters behind the router
version_added: 0.4.0
description:
  - The decisions of the role C(dgxspark.vllm.rolling) in one place. Resolves every cluster of the inventory as its
    own runs do and returns each cluster to change, in order, with the command line of its run (O(playbook) with
    C(--limit) the cluster and the router's play skipped, the rolling run's inventory sources, extra variables, vault
    and connection options as given), its log file and the message its failure ends the change with.
  - Fails before any cluster is drained, listing every problem with its fix - no router host in O(router_group), a
    router host whose C(router_drain_timeout) is shorter than its C(router_request_timeout), a name in O(clusters) that
    is not a cluster, two clusters serving one model name with different settings (the profile, the image, or any
    setting but where the cluster runs - names, addresses, ports, paths, the memory split), a changed cluster whose
    model no other cluster serves (unless O(allow_downtime)), a rolling run given C(--limit), C(--tags) or an option
    that asks for a password.
  - With O(router_states) (each router host's servers, M(dgxspark.vllm.router_info)), also fails when a router host
    has no server for a cluster, or when the clusters that keep a changed cluster's model served are not up there.
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  clusters:
    description: The clusters to change, in this order; empty changes every cluster in the inventory's order.
    type: list
    elements: str
    default: []
  allow_downtime:
    description: Change a cluster whose model no other cluster serves (the router refuses that model's requests while
      the cluster is drained).
    type: bool
    default: false
  playbook:
    description: The playbook each cluster's run runs (the collection's C(site.yml)).
    type: path
    required: true
  log_dir:
    description: The folder of each run's log (C(<cluster>.log)), on the controller.
    type: path
    required: true
  router_states:
    description: Per router host, its servers as M(dgxspark.vllm.router_info) returns them.
    type: dict
  head_group:
    description: The inventory group of the clusters' heads.
    type: str
    default: spark_head
  workers_group:
    description: The inventory group of the clusters' workers.
    type: str
    default: spark_workers
  router_group:
    description: The inventory group of the router's hosts.
    type: str
    default: spark_router
"""

EXAMPLES = r"""
- name: Plan a rolling change of every cluster
  dgxspark.vllm.rolling_plan:
    playbook: "{{ playbook_dir }}/site.yml"
    log_dir: "{{ lookup('ansible.builtin.env', 'HOME') }}/.dgxspark/rolling"
  register: rolling
"""

RETURN = r"""
steps:
  description: One entry per cluster to change, in order - C(name), C(model), C(head), C(api_url) (its API as the router reaches it), C(argv) (its run's
    command line), C(log) (its run's log file), C(failed) (the message a failed change ends with).
  returned: success
  type: list
  elements: dict
routers:
  description: Each router host - C(host), C(socket), C(map_file), C(drain_timeout), C(request_timeout).
  returned: success
  type: list
  elements: dict
drain_timeout:
  description: The longest drain of the router hosts, in seconds.
  returned: success
  type: int
changed_names:
  description: The names of the clusters to change, in order.
  returned: success
  type: list
  elements: str
chdir:
  description: The folder each run starts in (the rolling run's own, where relative paths of its options point).
  returned: success
  type: str
summary:
  description: Lines for a person.
  returned: success
  type: list
  elements: str
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._rolling import ARGUMENT_SPEC


def main() -> None:
    refuse("rolling_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
