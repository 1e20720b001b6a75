# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.vllm_kv_calibration: the lookup/record runs in the controller's process.

The calibration file lives on the controller; running the module there (delegate_to: localhost) cost a Python
start and a module transfer per call. Same arguments, same code (module_utils/_kv_calibration_task.py), same
result.
"""
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration_task import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_IF,
    CalibrationTaskError,
    run,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp
        _validation, params = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE, required_if=REQUIRED_IF)
        try:
            result.update(run(params, bool(self._task.check_mode), bool(self._task.diff)))
        except CalibrationTaskError as exc:
            result.update(exc.extra)
            result.update(failed=True, msg=exc.msg)
        return result
