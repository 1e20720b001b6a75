# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.rolling_plan: a rolling change over the inventory's clusters, decided on the
controller.

Resolves every cluster as its own runs do (plugin_utils/_cluster_resolve.py), reads the router hosts' drain settings,
takes the rolling run's own command line (its inventory sources, extra variables, vault and connection options) and
hands them to the pure planner (module_utils/_rolling.py). Never touches a node.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from ansible import constants as C
from ansible import context

from ansible_collections.dgxspark.vllm.plugins.module_utils import _router
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._rolling import (
    ARGUMENT_SPEC,
    RollingError,
    identity,
    plan,
    router_problems,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._cluster_resolve import inventory_configs
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)

# The router role's settings a rolling change reads, with the router planner's defaults (the role's defaults)
_ROUTER_VARS = (("socket", "router_socket", "socket"), ("drain_timeout", "router_drain_timeout", "drain_timeout"),
                ("request_timeout", "router_request_timeout", "request_timeout"))


# Options whose value from the configuration (ansible.cfg, ANSIBLE_*) each cluster's run reads again by itself
_CONFIGURED = (("become_method", "DEFAULT_BECOME_METHOD"), ("become_user", "DEFAULT_BECOME_USER"),
               ("forks", "DEFAULT_FORKS"), ("timeout", "DEFAULT_TIMEOUT"), ("connection", "DEFAULT_TRANSPORT"),
               ("remote_user", "DEFAULT_REMOTE_USER"), ("private_key_file", "DEFAULT_PRIVATE_KEY_FILE"))


def _cli() -> dict[str, Any]:
    """The rolling run's command line options, less those that only repeat the configuration."""
    cli = dict(context.CLIARGS)
    for name, constant in _CONFIGURED:
        if name in cli and cli[name] == getattr(C, constant, None):
            del cli[name]
    return cli


def _executable() -> str:
    """The ansible-playbook this run is (its clusters' runs use the same one), else the first on PATH."""
    if os.path.basename(sys.argv[0]) == "ansible-playbook" and os.path.isfile(sys.argv[0]):
        return os.path.abspath(sys.argv[0])
    return shutil.which("ansible-playbook") or "ansible-playbook"


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        task_vars = self._task_vars
        hostvars = task_vars["hostvars"]
        clusters = []
        for name, config in inventory_configs(self._templar, task_vars, params["head_group"], params["workers_group"]):
            head = config["head"]
            try:
                address = str(plain(hostvars[head].get("ansible_host") or head))
            except Exception as exc:  # noqa: BLE001 - a templating error names the host
                raise ControllerTaskError(f"the head {head}'s ansible_host cannot be templated: {exc}") from exc
            port = int(config["port"])
            clusters.append({"name": name or _router.SINGLE_CLUSTER, "model": config["served_model_name"],
                             "head": head, "port": port, "api_url": f"http://{_router.url_host(address)}:{port}",
                             "identity": identity(config)})
        routers = []
        # the router role's folder by default (where router_plan's model list goes)
        default_dir = os.path.dirname(_router.ARGUMENT_SPEC["models_file"]["default"])
        for host in task_vars.get("groups", {}).get(params["router_group"], []):
            router: dict[str, Any] = {"host": host}
            try:
                for key, name, spec_key in _ROUTER_VARS:
                    router[key] = plain(hostvars[host].get(name, _router.ARGUMENT_SPEC[spec_key]["default"]))
                config_dir = plain(hostvars[host].get("router_config_dir", default_dir))
            except Exception as exc:  # noqa: BLE001 - a templating error names the host
                raise ControllerTaskError(f"the router host {host}'s settings cannot be templated: {exc}") from exc
            router["map_file"] = f"{config_dir}/models.map"
            router["state_file"] = f"{config_dir}/{_router.STATE_FILE_NAME}"   # a drain outlives a reload
            for key in ("drain_timeout", "request_timeout"):
                try:
                    router[key] = int(router[key])
                except (TypeError, ValueError):
                    pass   # the router's own plan names it; here it is not compared
            routers.append(router)
        cli = _cli()
        sources = [str(source) for source in task_vars.get("ansible_inventory_sources") or ()]
        try:
            result = plan(clusters, routers, params, cli, sources, _executable())
            if params.get("router_states") is not None:
                changed = [c for c in clusters if c["name"] in result["changed_names"]]
                problems = router_problems(plain(params["router_states"]), clusters, changed,
                                           bool(params["allow_downtime"]))
                if problems:
                    raise RollingError(problems)
        except RollingError as exc:
            listed = "\n".join(f"- {problem}" for problem in exc.problems)
            raise ControllerTaskError(f"the rolling change has {len(exc.problems)} problem(s); no cluster was drained "
                                      f"or changed. Fix every one of them:\n{listed}", problems=exc.problems) from exc
        result.update(changed=False, chdir=os.getcwd())
        return result

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)
