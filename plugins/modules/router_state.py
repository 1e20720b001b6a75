#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_state
short_description: Keep each cluster's drain and maintenance for the router's next start or reload
version_added: 0.4.0
description:
  - Writes HAProxy's server-state file (O(path), root's, mode 0600), which the router (role C(dgxspark.vllm.router))
    loads at every start and reload, so that a cluster drained or in maintenance (M(dgxspark.vllm.router_backend))
    stays so after a changed configuration, a restart or a reboot; a reload without it puts every cluster back.
  - The state comes from the running router (C(show servers state) on O(socket)); when it does not answer, from the
    file as it is. The health is not kept - each server starts as HAProxy starts it without the file (up; its checks
    take it out), so that a health gone stale by the next start does not keep a cluster out.
  - Only the servers of O(backends) (the router's plan) that run at the planned address and port are kept. A cluster
    that moved, or is no longer behind the router, loses its line; HAProxy 2.6 would otherwise take its old port over
    the configuration's.
  - The file is rewritten only when a server, its address or its state differs from what it holds. With nothing to
    keep (the router's first start), it holds HAProxy's format version alone, which HAProxy reads without a warning.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads the state and tells whether the file would change; writes nothing.
  diff_mode:
    support: none
    details: RV(kept) and RV(dropped) name each server.
  idempotent:
    support: full
    details: The same servers in the same states leave the file alone.
options:
  path:
    description: The server-state file (C(server-state) in the router's folder; the C(server-state-file) of its
      configuration).
    type: path
    default: /etc/dgxspark/router/server-state
  socket:
    description: The router's runtime socket.
    type: path
    default: /run/dgxspark-router/admin.sock
  backends:
    description: The router's plan (C(backends) of M(dgxspark.vllm.router_plan)) - each with C(backend), C(cluster),
      C(address) and C(port).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Keep each cluster's drain and maintenance across the reload
  dgxspark.vllm.router_state:
    path: /etc/dgxspark/router/server-state
    backends: "{{ router_plan.backends }}"
"""

RETURN = r"""
source:
  description: Where the state came from - V(router) (the running router), V(file) (the router did not answer) or
    V(none) (neither; nothing is kept).
  returned: success
  type: str
  sample: router
kept:
  description: Each server kept, and the state the router gets back at its next start or reload.
  returned: success
  type: list
  elements: str
  sample: ["spark_cluster in model_0: maintenance"]
dropped:
  description: Each server whose state is not kept, and why.
  returned: success
  type: list
  elements: str
  sample: ["pair_b in model_0: now at 10.0.0.21:8000, not 10.0.0.20:8000 (its state is not kept)"]
"""

import ipaddress
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._haproxy_socket import SocketError, command
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import (
    RouterError,
    kept_server_state,
    same_server_state,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._secret_file import write_secret


def addresses(host: str) -> set[str]:
    """What HAProxy's libc resolution makes of a server's address: itself for an IP address, else the host's."""
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


def main() -> None:
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "default": "/etc/dgxspark/router/server-state"},
        "socket": {"type": "path", "default": "/run/dgxspark-router/admin.sock"},
        "backends": {"type": "list", "elements": "dict", "required": True},
    }, supports_check_mode=True)
    path = module.params["path"]
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except FileNotFoundError:
        current = ""
    except OSError as exc:
        module.fail_json(msg=f"the router's server-state file {path} cannot be read: {exc}")
    try:
        dump, source = command(module.params["socket"], "show servers state"), "router"
    except SocketError:
        dump, source = current, "file" if current else "none"
    try:
        kept = kept_server_state(dump, module.params["backends"], addresses)
    except RouterError as exc:
        if source == "router":
            module.fail_json(msg=f"{exc}: the router's `show servers state` cannot be kept")
        # the file as it is cannot be read: HAProxy skips it too; nothing of it is kept
        kept = dict(kept_server_state("", [], addresses), dropped=[f"the file {path} as it was ({exc})"])
    changed = False
    try:   # with nothing to keep, the version alone: HAProxy starts every server as its configuration says
        if not same_server_state(current, kept["text"]):
            changed = write_secret(path, kept["text"], check_mode=module.check_mode)
    except OSError as exc:
        module.fail_json(msg=f"the router's server-state file {path} cannot be written: {exc}")
    module.exit_json(changed=changed, source=source, kept=kept["kept"], dropped=kept["dropped"])


if __name__ == "__main__":
    main()
