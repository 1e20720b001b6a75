# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.vllm_serve_spec: the render runs in the controller's process.

The render is pure (it never touches the node), so a module run on the node - a Python start and a module
transfer per node and per render - bought nothing. Same arguments, same code (module_utils/_serve_spec.py), same
result; the API key's value is not in the result (``secret_env`` names it). The profile is the resolved one the
config step publishes (``profile_data``), or a built-in profile by name (read from the collection's profiles/).
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import ProfileError, build_profiles
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    ARGUMENT_SPEC,
    TEMPLATE_KEYS,
    SpecError,
    profile_from_data,
    render_spec,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import ProfileFileError, builtin_profile_data


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        try:
            if params["profile_data"] is not None:
                profile = profile_from_data(params["profile_data"])
            else:
                profiles = build_profiles(builtin_profile_data(), None, TEMPLATE_KEYS)
                if params["profile"] not in profiles:
                    raise ControllerTaskError(f"profile {params['profile']!r} is not a built-in profile "
                                              f"({', '.join(sorted(profiles))}); pass profile_data for another")
                profile = profiles[params["profile"]]
            spec = render_spec(profile=profile, nodes=params["nodes"], node=params["node"],
                               settings=params["settings"], api_key=params["api_key"])
        except (SpecError, ProfileError, ProfileFileError) as exc:
            raise ControllerTaskError(str(exc)) from exc
        result: dict[str, Any] = {"changed": False, **spec.as_result()}
        if spec.warnings:
            result["warnings"] = list(spec.warnings)
        return result
