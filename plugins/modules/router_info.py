#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_info
short_description: The clusters behind the router and the state of each
version_added: 0.4.0
description:
  - Reads C(show stat) on the router's runtime socket (HAProxy, role C(dgxspark.vllm.router)) and returns, per cluster
    and model, the state the router has it in - C(up), C(down) (its health check failed), C(draining) (no new
    request), C(maintenance) - with the requests it is working on now, the requests it had and its last check.
  - Reads only. It never changes anything.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads only.
  diff_mode:
    support: none
    details: Nothing changes.
  idempotent:
    support: full
    details: Never changes anything.
options:
  socket:
    description: The router's runtime socket.
    type: path
    default: /run/dgxspark-router/admin.sock
  map_file:
    description: The router's model map (names each backend's model); a missing file leaves the models empty.
    type: path
    default: /etc/dgxspark/router/models.map
"""

EXAMPLES = r"""
- name: Read the router's clusters
  dgxspark.vllm.router_info:
  register: router
"""

RETURN = r"""
servers:
  description: One entry per cluster and model - C(cluster), C(backend), C(model), C(state), C(status) (HAProxy's
    word), C(current) (running requests), C(total), C(check), C(check_ms), C(last_change_s).
  returned: success
  type: list
  elements: dict
  sample: [{"cluster": "pair_a", "backend": "model_0", "model": "glm-5.3-flash", "state": "up", "status": "UP",
            "current": 1, "total": 42, "check": "L7OK", "check_ms": 2, "last_change_s": 310}]
summary:
  description: One line per entry of RV(servers), for a person.
  returned: success
  type: list
  elements: str
  sample: ["pair_a (glm-5.3-flash): up, 1 running, 42 answered, last check L7OK"]
held:
  description: Each cluster drained or in maintenance (as M(dgxspark.vllm.router_backend) set it), for a person.
  returned: success
  type: list
  elements: str
  sample: ["pair_b (glm-5.3-flash): maintenance, as router_backend set it (kept across reloads; state=ready puts it back)"]
waiting:
  description: Each cluster neither up nor held (down, or HAProxy's own word), as in RV(summary).
  returned: success
  type: list
  elements: str
  sample: ["pair_a (glm-5.3-flash): down, 0 running, 42 answered, last check L4CON"]
settled:
  description: Whether the router has clusters and each is up or held (what a wait until the router is up waits for).
  returned: success
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._haproxy_socket import SocketError, command
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import (
    describe,
    held_and_waiting,
    map_models,
    server_states,
)


def main() -> None:
    module = AnsibleModule(argument_spec={"socket": {"type": "path", "default": "/run/dgxspark-router/admin.sock"},
                                          "map_file": {"type": "path", "default": "/etc/dgxspark/router/models.map"}},
                           supports_check_mode=True)
    try:
        with open(module.params["map_file"], encoding="utf-8") as handle:
            served = map_models(handle.read())
    except OSError:
        served = []
    try:
        text = command(module.params["socket"], "show stat")
    except SocketError as exc:
        module.fail_json(msg=str(exc))
    servers = server_states(text, served)
    module.exit_json(changed=False, servers=servers, summary=describe(servers), **held_and_waiting(servers))


if __name__ == "__main__":
    main()
