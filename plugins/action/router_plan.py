# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.router_plan: the router's files, decided on the controller.

Hands the clusters (router_clusters), their keys, what the router's hosts saw of each cluster and the router role's
settings to the pure planner (module_utils/_router.py); never touches a node. A cluster the router's host cannot
reach, and every other bad input, fails the task before anything is installed or started.
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import ARGUMENT_SPEC, RouterError, plan, probes, unreachable
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        params = plain(params)
        why = unreachable(probes(params.get("probes") or {}))
        if why:
            raise ControllerTaskError(why)
        if params["stage"] == "reach":   # the clusters answer the router's hosts: the keys are read next
            return {"changed": False}
        try:
            result = plan(params)
        except RouterError as exc:
            listed = "\n".join(f"- {problem}" for problem in exc.problems)
            raise ControllerTaskError(f"the router has {len(exc.problems)} problem(s); nothing was installed or "
                                      f"started. Fix every one of them:\n{listed}", problems=exc.problems) from exc
        result["changed"] = False
        return result
