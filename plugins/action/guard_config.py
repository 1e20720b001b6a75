# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.guard_config: the group guard's configuration document, built and checked, and
what its SSH key may do on the workers.

Runs in the controller's process and never touches a node (module_utils/_guard.py and _guard_access.py decide); the
head's ansible_host is resolved here, as the SSH client would resolve it.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard_access as access
from ansible_collections.dgxspark.vllm.plugins.module_utils._guard import (
    CONFIG_ARGUMENT_SPEC as ARGUMENT_SPEC,
    GuardConfigError,
    arm_reason,
    build_document,
    entry_steps,
    install_current,
    install_fingerprint,
    ssh_alias,
    webhook_file_current,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._service_state import stale_files
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._addresses import resolve
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def _address(self, host: str) -> str:
        """The host's ansible_host (its inventory name when unset), templated."""
        hostvars = self._task_vars.get("hostvars", {})
        address = hostvars[host].get("ansible_host", host) if host in hostvars else host
        return str(self._templar.template(address))

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        cluster = plain(params["config"])
        addresses = {host: self._address(host) for host in cluster.get("workers") or []}
        tunables = plain(params["tunables"])
        if tunables.get("metrics_port") and not tunables.get("metrics_address"):
            # the head's management address, as the workers' from= has it: where a Prometheus of the LAN reaches it
            given = self._address(cluster["head"])
            tunables["metrics_address"] = resolve(given) or given
        try:
            document = build_document(cluster, addresses, tunables, params["state_path"],
                                      params["maintenance_path"], params["ssh_config"], params["webhook_url"],
                                      params["webhook_path"])
        except GuardConfigError as exc:
            raise ControllerTaskError(f"the group guard cannot be configured: {exc}", problems=exc.problems) from exc
        settings = plain(params["access"])
        head = cluster["head"]
        given = self._address(head)
        try:
            plan = access.plan(head, given, resolve(given), str(cluster["nodes"][head]["cx7_ip"]), settings["ssh_from"],
                               settings["user"], settings["python"], settings["program"], cluster["container_name"])
        except access.GuardAccessError as exc:
            raise ControllerTaskError(f"the group guard's SSH access cannot be planned: {exc}",
                                      problems=exc.problems) from exc
        files: dict[str, bytes] = {}
        if params["payload"] or params["module_utils"] or params["install"]:
            here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
            files = self._payload(params["payload"] + [os.path.join(here, name) for name in params["module_utils"]])
            shaped = dict(plain(params["install"]), access={k: plan[k] for k in ("from", "command", "sudoers", "user")})
            document["_install"] = install_fingerprint(shaped, files)
        workers = [{"name": host, "alias": ssh_alias(host), "address": addresses[host]} for host in addresses]
        current = install_current(params["installed"], document)
        # the URL stays out of the result (it may carry a token): where it goes, whether it goes, whether it is there
        webhook = {"path": params["webhook_path"], "present": bool(params["webhook_url"]),
                   "current": webhook_file_current(params["webhook_url"], plain(params["webhook_read"]))}
        current = current and webhook["current"]
        read = plain(params["access_read"])
        if read is not None:
            name = settings["program"].rsplit("/", 1)[-1]
            if name not in files:
                raise ControllerTaskError(f"the group guard's payload has no {name}: its SHA-256 is what each worker's "
                                          "copy is compared with")
            workers_read = read.get("workers") or {}
            held = {host: access.worker_read(list(workers_read.get(host) or []),
                                             settings["home"].rstrip("/") + "/.ssh/authorized_keys",
                                             settings["sudoers_path"], settings["program"])
                    for host in cluster.get("workers") or []}
            plan["drift"] = access.problems_on_nodes(plan, read.get("head_public_key"), held,
                                                     hashlib.sha256(files[name]).hexdigest())
            current = current and not plan["drift"]
        ranks = [rank["name"] for rank in document["ranks"]]
        reason = (arm_reason(params["armed_state"], params["maintenance_held"], plain(params["serving"]), ranks)
                  if current else "the guard is installed in this run")
        # a guard that runs a process older than the files an install writes last: that install's restart did not
        # happen (its handlers never ran), so it still runs the program and configuration from before
        unit = plain(params["unit_read"])
        stale = stale_files(unit, plain(params["installed_read"]))
        steps = entry_steps(current, bool(stale), reason is not None, unit, params["state_exists"], params["install_only"],
                            params["lock_mine"], check_mode)
        return {"changed": False, "document": document, "workers": workers, "current": current, "access": plan,
                "webhook": webhook, "restart": bool(stale),
                "restart_reason": (f"the guard runs a process started before {', '.join(stale)} was written: an install "
                                   "whose restart did not happen") if stale else "",
                "arm": reason is not None, "arm_reason": reason or "it keeps this group already: arming changes nothing",
                "prepare_steps": steps["prepare"], "arm_steps": steps["arm"]}

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
