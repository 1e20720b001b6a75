# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.vllm_serve_spec: the render runs in the controller's process.

The render is pure (it never touches the node), so a module run on the node - a Python start and a module
transfer per node and per render - bought nothing. Same arguments, same code (module_utils/_serve_spec.py), same
result; the API key's value is not in the result (``secret_env`` names it).
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import ARGUMENT_SPEC, SpecError, render_spec
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        try:
            spec = render_spec(profile=params["profile"], nodes=params["nodes"], node=params["node"],
                               settings=params["settings"], api_key=params["api_key"])
        except SpecError as exc:
            raise ControllerTaskError(str(exc)) from exc
        result: dict[str, Any] = {"changed": False, **spec.as_result()}
        if spec.warnings:
            result["warnings"] = list(spec.warnings)
        return result
