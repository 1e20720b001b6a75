#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_backend
short_description: Drain a cluster behind the router, or put it back
version_added: 0.4.0
description:
  - Sets every server of the cluster O(cluster) (one per model it serves) to O(state) through the router's runtime
    socket (HAProxy, role C(dgxspark.vllm.router)).
  - V(drain) - the router sends the cluster no new request; the running ones finish. With O(wait), waits until the
    cluster has no running request, at most O(timeout) seconds, and fails naming how many still run.
  - V(ready) - the cluster takes requests again once its health check passes. V(maint) - out, as with a drain, and
    its health check stops.
  - After a change, the router's state is written to O(state_file) (as M(dgxspark.vllm.router_state) does), which the
    router loads at every start and reload - the state set here outlives a changed configuration, a restart and a
    reboot of the router's host.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Nothing is sent; changed tells whether it would be.
  diff_mode:
    support: none
    details: The states are in the result.
  idempotent:
    support: full
    details: A cluster already in O(state) is left alone (changed is false).
options:
  cluster:
    description: The cluster's name (its inventory group; C(spark_cluster) for an inventory of one cluster).
    type: str
    required: true
  state:
    description: What the router does with the cluster.
    type: str
    choices: [drain, ready, maint]
    required: true
  wait:
    description: With V(drain), wait until the cluster has no running request.
    type: bool
    default: true
  timeout:
    description: The longest the wait lasts, in seconds (the role's C(router_drain_timeout)).
    type: float
    default: 660
  poll:
    description: Seconds between two reads while waiting.
    type: float
    default: 0.5
  socket:
    description: The router's runtime socket.
    type: path
    default: /run/dgxspark-router/admin.sock
  state_file:
    description: The router's server-state file (C(server-state) in its folder); V("") keeps nothing (the state set
      here is lost at the router's next reload or restart).
    type: path
    default: /etc/dgxspark/router/server-state
"""

EXAMPLES = r"""
- name: Drain pair_a
  dgxspark.vllm.router_backend:
    cluster: pair_a
    state: drain
    timeout: "{{ router_drain_timeout }}"

- name: Put pair_a back
  dgxspark.vllm.router_backend:
    cluster: pair_a
    state: ready
"""

RETURN = r"""
servers:
  description: The cluster's servers after the change (as M(dgxspark.vllm.router_info) returns them).
  returned: success
  type: list
  elements: dict
elapsed:
  description: Seconds from the command to the end of the wait.
  returned: success
  type: float
running_at_start:
  description: The cluster's running requests when the state was set.
  returned: success
  type: int
started:
  description: When the state was set (seconds since the epoch, the router host's clock).
  returned: success
  type: float
ended:
  description: When the wait ended (seconds since the epoch, the router host's clock).
  returned: success
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._haproxy_socket import SocketError, command
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import (
    RouterError,
    drain_step,
    find_server,
    normalized_server_state,
    server_states,
    state_commands,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._secret_file import write_secret

_WANTED = {"drain": "draining", "ready": "", "maint": "maintenance"}


def keep(module: AnsibleModule, state_file: str, dump: str) -> None:
    """Write the router's state (``show servers state``) to its server-state file, loaded at its next start or
    reload."""
    try:
        write_secret(state_file, normalized_server_state(dump))
    except (RouterError, OSError) as exc:
        module.fail_json(msg=f"the cluster's state was set, but the router's server-state file {state_file} was not "
                             f"written ({exc}): the state is lost at the router's next reload or restart")


def main() -> None:
    module = AnsibleModule(argument_spec={
        "cluster": {"type": "str", "required": True},
        "state": {"type": "str", "choices": ["drain", "ready", "maint"], "required": True},
        "wait": {"type": "bool", "default": True},
        "timeout": {"type": "float", "default": 660},
        "poll": {"type": "float", "default": 0.5},
        "socket": {"type": "path", "default": "/run/dgxspark-router/admin.sock"},
        "state_file": {"type": "path", "default": "/etc/dgxspark/router/server-state"},
    }, supports_check_mode=True)
    params = module.params
    cluster, state, path = params["cluster"], params["state"], params["socket"]
    try:
        states = server_states(command(path, "show stat"))
        mine = find_server(states, cluster)
        if not mine:
            module.fail_json(msg=drain_step(states, cluster, 0, 0)["msg"])
        wanted = _WANTED[state]
        # ready: anything that is not draining or in maintenance already takes requests (up, or down until it answers)
        changed = any((s["state"] != wanted) if wanted else (s["state"] in ("draining", "maintenance")) for s in mine)
        running = sum(int(s["current"]) for s in mine)
        if module.check_mode or not changed and state == "ready":
            now = time.time()
            module.exit_json(changed=changed, servers=mine, elapsed=0.0, running_at_start=running, started=now, ended=now)
        start, started = time.monotonic(), time.time()
        if changed:
            for line in state_commands(states, cluster, state):
                answer = command(path, line).strip()
                if answer:
                    module.fail_json(msg=f"the router refused `{line}`: {answer}")
            if params["state_file"]:   # the configuration is the one running: every server's line is kept as it is
                keep(module, params["state_file"], command(path, "show servers state"))
        step = {"step": "done"}
        while state in ("drain", "maint") and params["wait"]:
            states = server_states(command(path, "show stat"))
            step = drain_step(states, cluster, time.monotonic() - start, params["timeout"])
            if step["step"] != "wait":
                break
            time.sleep(params["poll"])
        if step["step"] == "fail":
            module.fail_json(msg=step["msg"], servers=find_server(states, cluster))
        states = server_states(command(path, "show stat"))
    except SocketError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, servers=find_server(states, cluster), elapsed=round(time.monotonic() - start, 3),
                     running_at_start=running, started=started, ended=time.time())


if __name__ == "__main__":
    main()
