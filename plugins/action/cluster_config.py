# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.cluster_config: resolve and check the whole cluster's configuration.

Runs in the controller's process and never touches a node. It picks this run's cluster (the whole of
spark_head and spark_workers, or, when the inventory names its clusters in ``dgxspark_vllm_clusters``, the one
cluster group this run's hosts are in), reads, for every host of it, the ``dgxspark_vllm_*`` variables the inventory and extra vars give it (hostvars: no role
defaults), resolves them with the profile (module_utils/_config.py) and publishes the ``dgxspark_vllm_config``
fact, or fails listing every problem (plugin_utils/_cluster_resolve.py, which router_clusters shares).
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.plugin_utils._cluster_resolve import resolve_cluster
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import ControllerAction

ARGUMENT_SPEC: dict[str, Any] = dict(
    head_group=dict(type="str", default="spark_head"),
    workers_group=dict(type="str", default="spark_workers"),
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        return resolve_cluster(self._templar, self._task_vars, params["head_group"], params["workers_group"],
                               list(self._task_vars.get("ansible_play_hosts_all", [])))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)
