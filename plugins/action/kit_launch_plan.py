# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.kit_launch_plan: the EXL3 kit launch's decisions, on the controller.

Hands what the nodes showed to the pure planner (module_utils/_kit_plan.py) and returns its decisions; never
touches a node.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kit_plan import ARGUMENT_SPEC, KitPlanError, plan
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        try:
            # the controller's clock dates a start's record (the planner itself reads no clock)
            result = plan(plain(params), now=datetime.now(timezone.utc).isoformat())
        except KitPlanError as exc:
            raise ControllerTaskError(f"the kit's launch cannot be planned: {exc}") from exc
        except KeyError as exc:
            raise ControllerTaskError(f"the kit's launch cannot be planned: the configuration has no {exc}") from exc
        result["changed"] = False
        return result
