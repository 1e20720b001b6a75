# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.vllm_serve_spec: the render runs in the controller's process.

The render is pure (it never touches the node), so a module run on the node - a Python start and a module
transfer per node and per render - bought nothing. Same arguments, same code (module_utils/_serve_spec.py), same
result; the API key's value is not in the result (``secret_env`` names it).
"""
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import ARGUMENT_SPEC, SpecError, render_spec


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp
        _validation, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            spec = render_spec(profile=params["profile"], nodes=params["nodes"], node=params["node"],
                               settings=params["settings"], api_key=params["api_key"])
        except SpecError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        if spec.warnings:
            result["warnings"] = list(spec.warnings)
        result.update(changed=False, **spec.as_result())
        return result
