# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.vllm_kv_calibration: the lookup/record runs in the controller's process.

The calibration file lives on the controller; running the module there (delegate_to: localhost) cost a Python
start and a module transfer per call. Same arguments, same code (module_utils/_kv_calibration_task.py), same
result.
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration_task import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_IF,
    CalibrationTaskError,
    run,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC
    mutually_exclusive = MUTUALLY_EXCLUSIVE
    required_if = REQUIRED_IF

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        try:
            return run(params, check_mode, diff)
        except CalibrationTaskError as exc:
            raise ControllerTaskError(exc.msg, **exc.extra) from exc
