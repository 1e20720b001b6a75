# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for dgxspark.vllm.cluster_config: resolve and check the whole cluster's configuration.

Runs in the controller's process and never touches a node. It picks this run's cluster (the whole of
spark_head and spark_workers, or, when the inventory names its clusters in ``dgxspark_vllm_clusters``, the one
cluster group this run's hosts are in), reads, for every host of it, the ``dgxspark_vllm_*`` variables the inventory and extra vars give it (hostvars: no role
defaults), resolves them with the profile (module_utils/_config.py) and publishes the ``dgxspark_vllm_config``
fact, or fails listing every problem.
"""
from __future__ import annotations

import os
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import (
    FACT,
    FACT_NAMES,
    PREFIX,
    ConfigError,
    Inputs,
    checked_for_placeholders,
    describe_sources,
    parse_bool,
    resolve,
    select_cluster,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._upgrade import PIN_FACT
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._controller_action import (
    ControllerAction,
    ControllerTaskError,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import ProfileFileError, builtin_profile_data

# The collection's roles: their public variables (<role>_*) are checked for the example inventory's placeholders.
ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
# The dgxspark_vllm role's only defaults (the secrets, read directly by tasks): not a value a play gives.
SECRET_DEFAULTS = frozenset({"dgxspark_vllm_api_key", "dgxspark_vllm_hf_token"})

ARGUMENT_SPEC: dict[str, Any] = dict(
    head_group=dict(type="str", default="spark_head"),
    workers_group=dict(type="str", default="spark_workers"),
)


class ActionModule(ControllerAction):
    argument_spec = ARGUMENT_SPEC

    def _read(self, hostvars: Any, host: str, names: list[str], problems: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in names:
            try:
                out[name] = plain(hostvars[host][name])
            except Exception as exc:  # noqa: BLE001 - any templating error is reported with its variable
                problems.append(f"{name} of {host} cannot be templated: {exc}")
        return out

    def _checked(self, hostvars: Any, host: str, roles: list[str]) -> dict[str, Any]:
        """The host's connection and role variables as the inventory gives them (untemplated: a lookup in one is not
        run, a vaulted value not decrypted), for the placeholder check; and its name."""
        try:
            raw = hostvars.raw_get(host)
            names = [name for name in raw if checked_for_placeholders(name, roles)]
        except Exception:  # noqa: BLE001 - no raw view of the host: only the dgxspark_vllm_* variables are checked
            return {"inventory_hostname": host}
        out: dict[str, Any] = {"inventory_hostname": host}
        for name in names:
            try:
                out[name] = plain(raw[name])
            except Exception:  # noqa: BLE001 - a value that cannot be read as data is not a placeholder
                continue
        return out

    def run_task(self, params: dict[str, Any], check_mode: bool, diff: bool) -> dict[str, Any]:
        task_vars = self._task_vars
        groups = task_vars.get("groups", {})
        hostvars = task_vars["hostvars"]
        problems: list[str] = []
        name = PREFIX + "clusters"
        declared: dict[str, Any] = {}   # each head and worker of the inventory that sets it -> its value
        for host in dict.fromkeys([*groups.get(params["head_group"], []), *groups.get(params["workers_group"], [])]):
            if name in hostvars[host]:
                declared[host] = self._read(hostvars, host, [name], problems).get(name)
        if problems:
            raise ControllerTaskError(f"the inventory's {name} cannot be read: {'; '.join(problems)}")
        try:
            cluster = select_cluster(groups, declared, list(task_vars.get("ansible_play_hosts_all", [])),
                                     params["head_group"], params["workers_group"])
        except ConfigError as exc:
            listed = "\n".join(f"- {problem}" for problem in exc.problems)
            raise ControllerTaskError(
                f"the inventory's clusters have {len(exc.problems)} problem(s); nothing was started, pulled or "
                f"downloaded. Fix every one of them:\n{listed}", problems=exc.problems) from exc
        head, workers = cluster.head, cluster.workers
        read: dict[str, dict[str, Any]] = {}
        for host in dict.fromkeys(head + workers):
            names = [name for name in hostvars[host] if name.startswith(PREFIX)]
            read[host] = self._read(hostvars, host, names, problems)
        # What this play gives every host above the inventory (play vars, vars_files, role params, role defaults):
        # the current host's task vars that its hostvars lack or hold another value of. They apply to every host.
        current = task_vars.get("inventory_hostname")
        for name in [name for name in task_vars if name.startswith(PREFIX) and name not in FACT_NAMES]:
            try:
                value = plain(self._templar.template(task_vars[name]))
            except Exception as exc:  # noqa: BLE001 - any templating error is reported with its variable
                problems.append(f"{name} cannot be templated: {exc}")
                continue
            if current in read and name in read[current] and read[current][name] == value:
                continue
            if value == "" and name in SECRET_DEFAULTS:
                continue   # the dgxspark_vllm role's default, below every inventory value
            for host in read:
                read[host][name] = value
        try:
            roles = sorted(name for name in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, name)))
        except OSError:
            roles = []
        checked = {host: self._checked(hostvars, host, roles) for host in read}
        extra: dict[str, Any] = {}
        if head:
            wanted = ("ansible_user", "checkpoint_allow_denylisted", "image_digest", PIN_FACT)
            extra = self._read(hostvars, head[0], [name for name in wanted if name in hostvars[head[0]]], problems)
        try:
            builtin = builtin_profile_data()
            inputs = Inputs(hostvars=read, head=head, workers=workers, builtin_profiles=builtin, cluster=cluster.name,
                            ansible_user=extra.get("ansible_user"), checked_vars=checked,
                            allow_denylisted=parse_bool(str(extra.get("checkpoint_allow_denylisted", False))) is True,
                            image_digest=str(extra.get("image_digest") or ""),
                            release_pin=extra.get(PIN_FACT) or None)
            if problems:
                raise ConfigError(problems)
            config = resolve(inputs)
        except ProfileFileError as exc:
            raise ControllerTaskError(str(exc)) from exc
        except ConfigError as exc:
            listed = "\n".join(f"- {problem}" for problem in exc.problems)
            raise ControllerTaskError(
                f"the inventory has {len(exc.problems)} problem(s); nothing was started, pulled or downloaded. "
                f"Fix every one of them:\n{listed}", problems=exc.problems) from exc
        result: dict[str, Any] = {"changed": False, "ansible_facts": {FACT: config}, "sources": describe_sources(config)}
        if config["unpinned"]:   # dgxspark_vllm_require_pins: true makes them problems above
            result["warnings"] = list(config["unpinned"])
        return result

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._task_vars = task_vars or {}
        return super().run(tmp, task_vars)
