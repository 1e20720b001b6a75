# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module side of the tasks an action plugin runs in the controller's process (the planners).

Private module: may change at any time. Each such module is a documentation stub with its argument spec: run as a
module (through ansible.builtin.command, a module runner, or with its action plugin missing), it validates its
arguments as the task would and fails saying where it runs.
"""
from __future__ import annotations

from typing import Any

from ansible.module_utils.basic import AnsibleModule


def refuse(name: str, argument_spec: dict[str, Any], **module_args: Any) -> None:
    """Validate the arguments against ``argument_spec``, then fail naming where the task ``name`` runs."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **module_args)
    module.fail_json(msg=f"dgxspark.vllm.{name} runs on the controller through its action plugin; "
                         "call it as a task (not through ansible.builtin.command or a module runner)")
