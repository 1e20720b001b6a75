# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The staging lock's refusal: nothing that serves starts while staging runs on a node.

Private module: may change at any time. Staging (the image and checkpoint roles) holds the lock file on every node
while it works; the recipe serializes staging and serving. The planners (`_launch_plan`, `_kit_plan`) refuse a start
with this message, from each node's lock as `vllm_node_state` read it (its `staging_lock`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def locked_nodes(order: Sequence[str], states: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes, in `order`, whose read found the staging lock held."""
    return [name for name in order if (states.get(name) or {}).get("staging_lock")]


def refusal(locked: Sequence[str], path: str) -> str | None:
    """Why nothing may start while staging runs on `locked` (None when no node holds the lock)."""
    if not locked:
        return None
    return (f"Staging runs on {', '.join(locked)} ({path} exists): a heavy download during a model load starves "
            "GB10's unified memory. Let staging finish (or remove a stale lock left by a killed run) and launch again.")
