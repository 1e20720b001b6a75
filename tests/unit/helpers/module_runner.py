"""Run a module's main() in-process: exit_json/fail_json become exceptions carrying the result."""
import json
from typing import Any
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes


class ModuleExit(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result)
        self.result = result


class ModuleFail(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg"))
        self.result = result


def _exit_json(self: Any, **kwargs: Any) -> None:
    kwargs.setdefault("changed", False)
    raise ModuleExit(kwargs)


def _fail_json(self: Any, **kwargs: Any) -> None:
    kwargs["failed"] = True
    raise ModuleFail(kwargs)


def run_module(main: Any, args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """Call main() with args; return the exit_json result or raise ModuleFail."""
    payload = dict(args)
    payload["_ansible_check_mode"] = check_mode
    payload["_ansible_remote_tmp"] = "/tmp"
    payload["_ansible_keep_remote_files"] = False
    # ansible-core 2.19 refuses module args without a serialization profile
    with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))), \
            mock.patch.object(basic, "_ANSIBLE_PROFILE", "legacy"), \
            mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json), \
            mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json):
        try:
            main()
        except ModuleExit as done:
            return done.result
    raise AssertionError("module returned without exit_json/fail_json")
