#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_clusters
short_description: Every cluster of the inventory, resolved as its own runs resolve it, for the router
version_added: 0.4.0
description:
  - Resolves each cluster of the inventory (the groups C(dgxspark_vllm_clusters) names, or the one cluster of
    O(head_group) and O(workers_group)) with the code M(dgxspark.vllm.cluster_config) runs, checking each the same way,
    and returns what the router needs of it.
  - Per cluster - its name, its head and nodes, the address the router reaches the head's API on (the head's
    C(ansible_host)), the API port, the served model name, the longest context, the generated key's file on the head
    and whether the key is the generated one.
  - Per host of the play that is a node of a cluster, that cluster's API port (the router's ports must differ).
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  head_group:
    description: The inventory group of the clusters' heads.
    type: str
    default: spark_head
  workers_group:
    description: The inventory group of the clusters' workers.
    type: str
    default: spark_workers
notes:
  - Run it with C(no_log=true) - RV(keys) holds the keys the inventory sets.
"""

EXAMPLES = r"""
- name: Resolve every cluster behind the router
  dgxspark.vllm.router_clusters:
  run_once: true
  no_log: true
  register: clusters
"""

RETURN = r"""
clusters:
  description: One entry per cluster, in the order of C(dgxspark_vllm_clusters) - C(name), C(head), C(nodes),
    C(address), C(port), C(model), C(max_model_len), C(api_key_file), C(key_generated), C(health_url).
  returned: success
  type: list
  elements: dict
keys:
  description: The API key the inventory sets for a cluster (C(dgxspark_vllm_api_key)), by cluster name; a cluster
    with the generated key is not in it.
  returned: success
  type: dict
host_ports:
  description: Per host of the play that is a node of a cluster, that cluster's API port.
  returned: success
  type: dict
summary:
  description: One line per cluster, for the log.
  returned: success
  type: list
  elements: str
  sample: ["pair_a: glm-5.3-flash at 192.0.2.10:8000 (head spark-a1)"]
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import CLUSTERS_ARGUMENT_SPEC


def main() -> None:
    refuse("router_clusters", CLUSTERS_ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
