# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.secret_file: writes 0600, removes, never returns the secret, refuses what it cannot do."""
from __future__ import annotations

import json
import os
import pwd
import stat

import pytest

from ansible_collections.dgxspark.vllm.plugins.modules import secret_file
from helpers.module_runner import ModuleFail, run_module

SECRET = "lab-hf-token-unit"


def test_writes_0600_then_changes_nothing_and_never_returns_the_secret(tmp_path):
    path = tmp_path / "dgxspark" / "hf-token"
    first = run_module(secret_file.main, {"path": str(path), "content": SECRET})
    assert (first["changed"], first["written"], first["path"]) == (True, True, str(path))
    assert path.read_text() == SECRET and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = run_module(secret_file.main, {"path": str(path), "content": SECRET})
    assert again["changed"] is False
    assert SECRET not in json.dumps([first, again])


def test_env_as_shell_assignments_and_no_file_without_a_value(tmp_path):
    path = tmp_path / "start.env"
    me = pwd.getpwuid(os.geteuid()).pw_name
    result = run_module(secret_file.main, {"path": str(path), "env": {"VLLM_API_KEY": "k", "HF_TOKEN": ""},
                                           "owner": me})
    assert result["written"] and path.read_text() == "VLLM_API_KEY=k\n"
    empty = run_module(secret_file.main, {"path": str(path), "env": {"VLLM_API_KEY": "", "HF_TOKEN": ""}})
    assert (empty["changed"], empty["written"]) == (True, False) and not path.exists()


def test_absent_and_check_mode(tmp_path):
    path = tmp_path / "t"
    assert run_module(secret_file.main, {"path": str(path), "content": "s"}, check_mode=True)["changed"] is True
    assert not path.exists()
    run_module(secret_file.main, {"path": str(path), "content": "s"})
    assert run_module(secret_file.main, {"path": str(path), "state": "absent"}, check_mode=True)["changed"] is True
    assert path.exists()
    assert run_module(secret_file.main, {"path": str(path), "state": "absent"})["changed"] is True
    assert not path.exists()
    assert run_module(secret_file.main, {"path": str(path), "state": "absent"})["changed"] is False


@pytest.mark.parametrize("args, match", [
    ({}, "state is present but any of the following are missing: content, env"),
    ({"content": "s", "env": {"A": "b"}}, "parameters are mutually exclusive: content|env"),
    ({"content": "s", "owner": "no-such-user-dgxspark"}, "no user no-such-user-dgxspark on this node"),
    ({"content": "s", "group": "no-such-group-dgxspark"}, "no group no-such-group-dgxspark on this node"),
    ({"env": {"BAD NAME": SECRET}}, "'BAD NAME' is not an environment variable name"),
])
def test_refuses(tmp_path, args, match):
    with pytest.raises(ModuleFail, match=match) as err:
        run_module(secret_file.main, {"path": str(tmp_path / "t"), **args})
    assert SECRET not in json.dumps(err.value.result)
    assert not (tmp_path / "t").exists()
