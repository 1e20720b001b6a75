# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.release_plan: what a run is against the serving release, and the way back.

Hands the head's release history, the configuration and what the nodes hold to the pure decisions
(module_utils/_upgrade.py); never touches a node.
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._release import ReleaseError
from ansible_collections.dgxspark.vllm.plugins.module_utils._upgrade import ARGUMENT_SPEC, UpgradeError, run
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        try:
            return {"changed": False, **run(plain(params))}
        except (UpgradeError, ReleaseError) as exc:
            raise ControllerTaskError(str(exc)) from exc
