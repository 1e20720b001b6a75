# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.image_pin: the one reference every node pulls, decided on the controller.

Hands the configured image, the image role's image_digest and the head's repo digests to the pure decision
(module_utils/_pins.py) and returns the reference, the digest and the record each node keeps; never touches a node.
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import ARGUMENT_SPEC, PinError, image_record, staging_pin
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        params = plain(params)
        try:
            pin = staging_pin(params["image"], params["image_digest"], params["head_repo_digests"], params["head"])
        except PinError as exc:
            raise ControllerTaskError(f"the image cannot be pinned: {exc}") from exc
        return {"changed": False, **pin.as_dict(), "record": image_record(params["image"], pin.as_dict())}
