# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the dgxspark.vllm.node_program lookup: a role's program with the module_utils it imports."""
from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError
import yaml
from ansible import constants as C
from ansible.parsing.dataloader import DataLoader

from ansible_collections.dgxspark.vllm.plugins.lookup import node_program

NAME = "dgxspark.vllm.node_program"
# what the plugin loader does when it loads the lookup: its documented options become its configuration
C.config.initialize_plugin_configuration_definitions(
    "lookup", NAME, yaml.safe_load(node_program.DOCUMENTATION)["options"])

ROOT = Path(__file__).resolve().parents[4]
TREE = "/opt/g/ansible_collections/dgxspark/vllm/plugins/module_utils"


def run(role: str, *terms: str, **options):
    variables = {"ansible_search_path": [str(ROOT / "roles" / role)]}
    lookup = node_program.LookupModule(loader=DataLoader())
    lookup._load_name = NAME  # pylint: disable=protected-access
    return lookup.run(list(terms), variables=variables, **options)


def test_the_guard_program_comes_with_the_module_utils_it_imports():
    entries = run("guard", "dgxspark_group_guard.py", dest="/opt/g/dgxspark_group_guard.py")
    assert [entry["path"] for entry in entries] == ["/opt/g/dgxspark_group_guard.py"] + [
        f"{TREE}/{name}" for name in ("_docker_logs.py", "_guard.py", "_metrics.py", "_startup.py", "_vllm_log.py")]
    assert entries[0]["content"] == (ROOT / "roles/guard/files/dgxspark_group_guard.py").read_text()
    assert entries[3]["content"] == (ROOT / "plugins/module_utils/_metrics.py").read_text()
    assert entries[3]["dir"] == TREE and entries[3]["module_util"] == "_metrics.py"


def test_read_as_gives_the_files_of_a_read():
    entries = run("cache_flush", "dgxspark_cache_flush.py", dest="/opt/g/p.py", read_as="program")
    assert [(entry["path"], entry.get("name"), entry.get("part_of")) for entry in entries] == [
        ("/opt/g/p.py", "program", None), (f"{TREE}/_vllm_log.py", None, "program")]


@pytest.mark.parametrize(("terms", "options", "message"), [
    (("missing.py",), {"dest": "/opt/x.py"}, "the program 'missing.py' is not in the role's files/"),
    (("a.py", "b.py"), {"dest": "/opt/x.py"}, "takes one program file name, not 2"),
    (("dgxspark_cache_flush.py",), {"dest": "opt/x.py"}, "must be an absolute file path"),
])
def test_bad_calls_are_refused(terms, options, message):
    with pytest.raises(AnsibleLookupError, match=message):
        run("cache_flush", *terms, **options)
