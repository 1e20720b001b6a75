# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Base of the collection's action plugins that run a module's pure code in the controller's process.

Private: may change at any time. A subclass names the module's argument spec and implements `run_task`; the
base validates the task's arguments against that spec (the same checks and messages as the module), never uses
the connection, and turns the task's own error into a failed result.
"""
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


class ControllerTaskError(Exception):
    """The task fails: msg for the user, extra keys for the result."""

    def __init__(self, msg: str, **extra: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


class ControllerAction(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    argument_spec: dict[str, Any] = {}
    mutually_exclusive: list[Any] = []
    required_if: list[Any] = []

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        """The task's result from validated params; raise ControllerTaskError to fail it."""
        raise NotImplementedError

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp
        _validation, params = self.validate_argument_spec(
            argument_spec=self.argument_spec, mutually_exclusive=self.mutually_exclusive, required_if=self.required_if)
        try:
            result.update(self.run_task(params, bool(self._task.check_mode), bool(self._task.diff)))
        except ControllerTaskError as exc:
            result.update(exc.extra)
            result.update(failed=True, msg=exc.msg)
        return result
