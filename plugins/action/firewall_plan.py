# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.firewall_plan: every node's nftables ruleset, decided on the controller.

Resolves the address Ansible reaches each node on (a name is looked up here, as the SSH client would) and hands it
with what the nodes showed to the pure planner (module_utils/_firewall.py); never touches a node.
"""
from __future__ import annotations

import json
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import ARGUMENT_SPEC, FirewallError, plan
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._addresses import resolve
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        params = plain(params)
        reached = {host: resolve(str(address or "")) for host, address in params["reached"].items()}
        hostvars = (self._task_vars or {}).get("hostvars", {})
        routers = {}
        for host in params.get("routers") or []:
            try:
                address = plain(hostvars[host].get("ansible_host") or host) if host in hostvars else host
            except Exception as exc:  # noqa: BLE001 - a templating error names the host
                raise ControllerTaskError(f"the firewall cannot be planned: the router host {host}'s ansible_host "
                                          f"cannot be templated: {exc}") from exc
            routers[host] = resolve(str(address or ""))
        addresses = {}
        for host, listing in params["addresses"].items():
            try:   # the nodes' `ip -j addr show` output as it came, or already parsed
                addresses[host] = json.loads(listing) if isinstance(listing, str) else listing
            except ValueError as exc:
                raise ControllerTaskError(f"the firewall cannot be planned: {host}'s `ip -j addr show` is not JSON "
                                          f"({exc})") from exc
        try:
            result = plan(params["config"], addresses, reached, params.get("controller") or {}, routers)
        except FirewallError as exc:
            raise ControllerTaskError(f"the firewall cannot be planned: {exc}") from exc
        except KeyError as exc:
            raise ControllerTaskError(f"the firewall cannot be planned: the configuration has no {exc}") from exc
        result["changed"] = False
        return result
