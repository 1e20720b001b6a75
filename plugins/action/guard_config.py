# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.guard_config: the group guard's configuration document, built and checked.

Runs in the controller's process and never touches a node (module_utils/_guard.py decides).
"""
from __future__ import annotations

import os
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._guard import (
    CONFIG_ARGUMENT_SPEC as ARGUMENT_SPEC,
    GuardConfigError,
    arm_reason,
    build_document,
    install_current,
    install_fingerprint,
    ssh_alias,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        cluster = plain(params["config"])
        hostvars = self._task_vars.get("hostvars", {})
        addresses = {}
        for host in cluster.get("workers") or []:
            address = hostvars[host].get("ansible_host", host) if host in hostvars else host
            addresses[host] = str(self._templar.template(address))
        try:
            document = build_document(cluster, addresses, plain(params["tunables"]), params["state_path"],
                                      params["maintenance_path"])
        except GuardConfigError as exc:
            raise ControllerTaskError(f"the group guard cannot be configured: {exc}", problems=exc.problems) from exc
        if params["payload"] or params["module_utils"] or params["install"]:
            here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
            files = params["payload"] + [os.path.join(here, name) for name in params["module_utils"]]
            document["_install"] = install_fingerprint(plain(params["install"]), self._payload(files))
        workers = [{"name": host, "alias": ssh_alias(host), "address": addresses[host]} for host in addresses]
        current = install_current(params["installed"], document)
        ranks = [rank["name"] for rank in document["ranks"]]
        reason = (arm_reason(params["armed_state"], params["maintenance_held"], plain(params["serving"]), ranks)
                  if current else "the guard is installed in this run")
        return {"changed": False, "document": document, "workers": workers, "current": current,
                "arm": reason is not None, "arm_reason": reason or "it keeps this group already: arming changes nothing"}

    @staticmethod
    def _payload(paths: list[str]) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for path in paths:
            name = path.rsplit("/", 1)[-1]
            if name in files:   # keyed by name, so that the fingerprint does not depend on where the checkout lies
                raise ControllerTaskError(f"the group guard's files {path} and another one share the name {name}")
            try:
                with open(path, "rb") as handle:
                    files[name] = handle.read()
            except OSError as exc:
                raise ControllerTaskError(f"the group guard's file {path} cannot be read: {exc.strerror}") from exc
        return files

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)
