#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_plan
short_description: Decide the router's files (HAProxy's configuration, the model map, the model list)
version_added: 0.4.0
description:
  - The decisions of the role C(dgxspark.vllm.router) in one place; the role passes the clusters
    (M(dgxspark.vllm.router_clusters)), their keys and what the router's hosts saw, and writes the result.
  - One HAProxy backend per served model, whose servers are the clusters serving it, each checked on C(/health); a
    frontend for O(allowed_cidrs) only that takes requests carrying the router's key and sends each to a cluster of
    its C(model) with that cluster's key; C(GET /v1/models) answered with every model; HAProxy's Prometheus exporter
    on O(metrics_port); the runtime API on O(socket), root's only.
  - Fails before anything is installed or started, listing every problem with its fix - a cluster whose C(/health) did
    not answer from a router host (O(probes)), a drain timeout shorter than the request timeout, two clusters serving
    one model with different keys, a cluster without a key, ports that collide, networks that do not parse.
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  clusters:
    description: The clusters, as M(dgxspark.vllm.router_clusters) returns them.
    type: list
    elements: dict
    required: true
  keys:
    description: The inventory's API keys by cluster name.
    type: dict
    default: {}
  generated:
    description: The results of the loop of M(dgxspark.vllm.api_key) over the clusters with a generated key (each with
      the cluster as C(item) and the C(key)).
    type: list
    elements: dict
    default: []
  probes:
    description: Per router host, the results of its M(ansible.builtin.uri) loop over the clusters' C(health_url) (each
      with the cluster as C(item)); a cluster that did not answer 200 fails the plan.
    type: dict
    default: {}
  stage:
    description:
      - V(reach) checks O(probes) only (every cluster answered every router host), before the keys are read on the
        heads; V(full) plans the router.
    type: str
    choices: [reach, full]
    default: full
  router_key:
    description: The key clients send to the router (an C(Authorization) header C(Bearer <key>)); required with
      O(stage=full) (an empty key is refused).
    type: str
    default: ""
  bind_address:
    description: The address the router listens on.
    type: str
    default: 0.0.0.0
  port:
    description: The router's port.
    type: int
    default: 8080
  metrics_port:
    description: The port of the router's Prometheus C(/metrics).
    type: int
    default: 8404
  allowed_cidrs:
    description: The networks that may use the router and read its metrics; required with O(stage=full) (empty is
      refused).
    type: list
    elements: str
    default: []
  request_timeout:
    description: The longest a request may take through the router, in seconds.
    type: int
    default: 600
  drain_timeout:
    description: The longest a drain waits for a cluster's running requests, in seconds; at least O(request_timeout).
    type: int
    default: 660
  check_interval:
    description: Seconds between two health checks of a cluster.
    type: int
    default: 2
  fall:
    description: Failed checks in a row that take a cluster out.
    type: int
    default: 2
  rise:
    description: Answered checks in a row that put it back.
    type: int
    default: 2
  buffer_bytes:
    description: The part of a request's body read for its C(model) when several models are served.
    type: int
    default: 1048576
  socket:
    description: HAProxy's runtime socket.
    type: path
    default: /run/dgxspark-router/admin.sock
  models_file:
    description: The file C(GET /v1/models) answers with; the model map is written next to it (C(models.map)).
    type: path
    default: /etc/dgxspark/router/models.json
  host_ports:
    description: Per router host, the API port of the cluster it is a node of.
    type: dict
    default: {}
notes:
  - Run it with C(no_log=true) - RV(config) holds every key.
"""

EXAMPLES = r"""
- name: Plan the router
  dgxspark.vllm.router_plan:
    clusters: "{{ clusters.clusters }}"
    keys: "{{ clusters.keys }}"
    router_key: "{{ router_api_key }}"
    allowed_cidrs: [192.168.1.0/24]
  run_once: true
  no_log: true
  register: router_plan
"""

RETURN = r"""
config:
  description: HAProxy's configuration (it holds the keys).
  returned: success
  type: str
map:
  description: The model map, C(<model> <backend>) per line.
  returned: success
  type: str
map_file:
  description: Where the model map goes.
  returned: success
  type: str
models:
  description: The answer to C(GET /v1/models), as JSON text.
  returned: success
  type: str
backends:
  description: Per cluster - C(cluster), C(head), C(address), C(port), C(model), C(backend), C(health_url).
  returned: success
  type: list
  elements: dict
drain_timeout:
  description: O(drain_timeout), checked.
  returned: success
  type: int
summary:
  description: One line per cluster and model, for the log.
  returned: success
  type: list
  elements: str
  sample: ["pair_a (192.0.2.10:8000) serves glm-5.3-flash"]
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import ARGUMENT_SPEC


def main() -> None:
    refuse("router_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
