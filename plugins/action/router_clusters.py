# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.router_clusters: every cluster of the inventory, resolved as its own runs resolve it.

Runs in the controller's process and never touches a node. Each cluster (``dgxspark_vllm_clusters``, or the one
cluster of spark_head and spark_workers) is resolved by plugin_utils/_cluster_resolve.py, the code cluster_config
runs, and reduced to what the router needs: its head, the address the router reaches the head's API on (the head's
``ansible_host``), the API port, the served model name, the longest context, where its key comes from.
"""
from __future__ import annotations

from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._router import CLUSTERS_ARGUMENT_SPEC, SINGLE_CLUSTER, url_host
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._cluster_resolve import inventory_configs
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)


class ActionModule(ControllerAction):
    argument_spec = CLUSTERS_ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        task_vars = self._task_vars
        hostvars = task_vars["hostvars"]
        clusters: list[dict[str, Any]] = []
        keys: dict[str, str] = {}
        host_ports: dict[str, int] = {}
        routers = list(task_vars.get("ansible_play_hosts_all", []))
        for name, config in inventory_configs(self._templar, task_vars, params["head_group"], params["workers_group"]):
            label = name or SINGLE_CLUSTER
            head = config["head"]
            try:
                address = str(plain(hostvars[head].get("ansible_host") or head))
                key = plain(hostvars[head].get("dgxspark_vllm_api_key") or "")
            except Exception as exc:  # noqa: BLE001 - a templating error names the host
                raise ControllerTaskError(f"the cluster {label}: the head {head}'s ansible_host or "
                                          f"dgxspark_vllm_api_key cannot be templated: {exc}") from exc
            if key and not config.get("api_key_generate"):
                keys[label] = str(key)
            port = int(config["port"])
            clusters.append({"name": label, "head": head, "nodes": [head, *config["workers"]], "address": address,
                             "port": port, "model": config["served_model_name"],
                             "max_model_len": config.get("max_model_len") or 0,
                             "api_key_file": config["api_key_file"],
                             "key_generated": bool(config.get("api_key_generate")),
                             "health_url": f"http://{url_host(address)}:{port}/health"})
            for router in routers:
                if router in config["nodes"]:
                    host_ports[router] = port
        summary = [f"{c['name']}: {c['model']} at {c['address']}:{c['port']} (head {c['head']})" for c in clusters]
        return {"changed": False, "clusters": clusters, "keys": keys, "host_ports": host_ports, "summary": summary}

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)
