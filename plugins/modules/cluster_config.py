#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_config
short_description: Resolve the cluster's configuration once and check it whole before any node is touched
version_added: 0.1.0
description:
  - Reads, for every host of the head and workers groups, the C(dgxspark_vllm_*) variables the inventory and
    extra vars give it, and resolves them into one configuration - the serving profile's values, then
    C(dgxspark_vllm_settings), then the explicit variables - published as the C(dgxspark_vllm_config) fact with
    where each value came from (RV(sources), shown by the dgxspark_vllm role with C(-v)).
  - Checks the whole cluster first, and lists every problem at once, each naming the variable to change and a
    valid example - the placeholders of C(inventories/example) still in any host's variables (a C(<NAME>) such as
    C(<YOUR_USER>), an address of the ranges reserved for documentation - 192.0.2.0/24, 198.51.100.0/24,
    203.0.113.0/24, 2001:db8::/32 - in the C(dgxspark_vllm_*), connection and role variables, with the variable and
    the hosts), the groups (one head, at least one worker), every host's C(dgxspark_vllm_cx7_ip),
    cluster-wide variables identical on every host (naming the hosts that differ), unknown C(dgxspark_vllm_*)
    variables (with the nearest known name), the image reference (a tag or a digest), a non-empty served name,
    the checkpoint denylist, the non-commercial drafter's licence, every profile (built-in and
    C(dgxspark_vllm_profiles)) against the profile schema, the tensor-parallel size (set, or nodes x GPUs per node)
    against the model's attention and KV heads (the profile's C(attention_heads) and C(kv_heads), or
    C(dgxspark_vllm_attention_heads) and C(dgxspark_vllm_kv_heads)) with the node counts that fit, and every validation
    of the render for every node.
  - The built-in profiles are the YAML files in the collection's C(profiles/) folder; a profile defined in
    C(dgxspark_vllm_profiles) uses the same schema (usually C(extends) a built-in one).
  - Runs on the controller only (an action plugin); it never connects to a node. Secrets are checked but never
    copied into the fact.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads variables only; the result is the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is nothing to diff.
  idempotent:
    support: full
    details: The same inventory always resolves to the same fact, and nothing is ever changed.
options:
  head_group:
    description: The inventory group holding the head (exactly one host).
    type: str
    default: spark_head
  workers_group:
    description: The inventory group holding the workers, in rank order.
    type: str
    default: spark_workers
notes:
  - Run it once per play (C(run_once)); the fact is set on every host of the play.
"""

EXAMPLES = r"""
- name: Resolve and check the cluster's configuration
  dgxspark.vllm.cluster_config:
  run_once: true

- name: Use it
  ansible.builtin.debug:
    msg: "{{ dgxspark_vllm_config.image }} serves {{ dgxspark_vllm_config.served_model_name }}"
"""

RETURN = r"""
ansible_facts:
  description: The resolved configuration.
  returned: success
  type: dict
  contains:
    dgxspark_vllm_config:
      description:
        - Every cluster-wide setting (C(image), C(port), C(model_repo), C(served_model_name), C(hf_home), ...), the
          resolved C(profile) as data, C(settings) for M(dgxspark.vllm.vllm_serve_spec), C(nodes) (per host -
          C(cx7_ip), C(head), C(rank), C(cx7_iface), C(ib_hca), C(gid_index)), C(head), C(workers) and C(sources).
      type: dict
      sample: {"image": "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8", "port": 8000, "launcher": "docker_run"}
sources:
  description: One line per setting - its value and where it came from.
  returned: success
  type: list
  elements: str
  sample: ["port = 8000 (profile glm53_flash_nvfp4)", "image = '...:sm121-v8' (dgxspark_vllm_image)"]
problems:
  description: Every problem found, when the configuration cannot be served.
  returned: failure
  type: list
  elements: str
  sample: ["dgxspark_vllm_node_rank (on spark-a) is not a variable of dgxspark.vllm and would be ignored: ..."]
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse


def main() -> None:
    # The configuration is every host's inventory variables, which only the controller holds.
    refuse("cluster_config", {"head_group": {"type": "str", "default": "spark_head"},
                              "workers_group": {"type": "str", "default": "spark_workers"}})


if __name__ == "__main__":
    main()
