# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.launch_plan: the launch's next step, decided on the controller.

Reads the KV record (next to the inventory), renders every node's container and asks the pure planner
(module_utils/_launch_plan.py) for the next step; writes the record when the step measured something. Never
touches a node.
"""
from __future__ import annotations

import json
import time
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import CalibrationError, dump_cache, load_cache, merge
from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration_task import (
    missing_directory,
    read_text,
    record_lock,
    write_text,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import (
    ARGUMENT_SPEC,
    Calibration,
    PlanError,
    carries_out,
    described_nodes,
    plan,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import SpecError, profile_from_data, render_cluster
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        config, nodes = plain(params["config"]), plain(params["nodes"])
        c = params["calibration"]
        path = c["path"]
        if c["enabled"] and not path:
            raise ControllerTaskError("calibration.path is required when calibration.enabled is true")
        calibration = Calibration(enabled=c["enabled"], policy=c["policy"], margin_bytes=c["margin_bytes"],
                                  default_block_size=c["default_block_size"],
                                  accept_estimated_max_model_len=c["accept_estimated_max_model_len"],
                                  record_path=path or "the KV record")
        problem = missing_directory(path) if c["enabled"] else None
        if problem:
            raise ControllerTaskError(problem)
        api_key = params["api_key"] or None
        try:
            profile = profile_from_data(config["profile"])
            described = described_nodes(config, nodes)
        except (SpecError, PlanError, KeyError) as exc:
            raise ControllerTaskError(f"the launch cannot be planned: {exc}") from exc

        def render(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
            return {name: spec.as_result() for name, spec in render_cluster(profile, described, settings, api_key).items()}

        with record_lock(path if c["enabled"] and not check_mode else None):
            try:
                text = read_text(path) if c["enabled"] and path else None
            except OSError as exc:
                raise ControllerTaskError(f"cannot read the KV calibration file {path}: {exc}") from exc
            head, merged = c.get("head_record"), False
            try:
                cache = load_cache(text, path or "the KV record")
                theirs = None
                if c["enabled"] and head is not None:
                    theirs = (load_cache(head if isinstance(head, str) else json.dumps(head), c["head_path"])
                              if head else load_cache(None))
                    joined = merge(cache, theirs)
                    if joined != cache:   # the head knows entries this controller does not: keep them here too
                        if not check_mode and path:
                            try:
                                write_text(path, dump_cache(joined))
                            except OSError as exc:
                                raise ControllerTaskError(
                                    f"cannot write the KV calibration file {path}: {exc}") from exc
                        cache, merged = joined, True
                result = plan(config, nodes, render, cache, calibration, plain(params["previous"]),
                              plain(params["observed"]), plain(params["metrics"]), params["diagnosis_lines"],
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            except (SpecError, CalibrationError, PlanError) as exc:
                raise ControllerTaskError(f"the launch cannot be planned: {exc}") from exc
            out = result.as_result()
            out["changed"] = merged
            out["kv_record"] = None
            if theirs is not None:
                final = result.cache if result.cache is not None else cache
                out["kv_record"] = {"text": dump_cache(final), "head_differs": merge(theirs, final) != theirs}
            out["carry_out"] = carries_out(result.step, params["previous"] is None,
                                           bool(out["kv_record"] and out["kv_record"]["head_differs"]), check_mode)
            if result.cache is not None and path:
                out["changed"] = True
                if not check_mode:
                    try:
                        write_text(path, dump_cache(result.cache))
                    except OSError as exc:
                        raise ControllerTaskError(f"cannot write the KV calibration file {path}: {exc}") from exc
        return out
