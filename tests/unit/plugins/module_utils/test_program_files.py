# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for module_utils/_program_files.py: what a program installed on a node takes with it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.programs import install_program
import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._program_files import (
    PACKAGE, ProgramFilesError, closure, node_files, read_items)

ROOT = Path(__file__).resolve().parents[4]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
GUARD = ROOT / "roles" / "guard" / "files" / "dgxspark_group_guard.py"
FLUSH = ROOT / "roles" / "cache_flush" / "files" / "dgxspark_cache_flush.py"


def read_collection(name: str) -> str | None:
    path = MODULE_UTILS / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def fake(files: dict[str, str]):
    return files.get


def test_the_guard_takes_its_imports_and_theirs():
    # the program imports _guard, _docker_logs, _startup, _vllm_log; _guard imports _metrics (and _startup)
    assert closure(GUARD.name, GUARD.read_text(), read_collection) == [
        "_docker_logs.py", "_guard.py", "_metrics.py", "_startup.py", "_vllm_log.py"]


def test_the_flush_program_takes_the_log_reader():
    assert closure(FLUSH.name, FLUSH.read_text(), read_collection) == ["_vllm_log.py"]


@pytest.mark.parametrize("line", [
    f"from {PACKAGE} import _a",
    f"from {PACKAGE} import _a as A",
    f"from {PACKAGE}._a import thing",
    f"import {PACKAGE}._a",
    f"def later():\n    from {PACKAGE}._a import thing\n",
])
def test_every_import_form_is_followed_through_the_chain(line):
    files = {"_a.py": f"from {PACKAGE}._b import x\n", "_b.py": "import json\n", "_c.py": "x = 1\n"}
    assert closure("prog.py", line + "\n", fake(files)) == ["_a.py", "_b.py"]


def test_a_cycle_ends():
    files = {"_a.py": f"from {PACKAGE}._b import x\n", "_b.py": f"from {PACKAGE}._a import y\n"}
    assert closure("prog.py", f"from {PACKAGE} import _a\n", fake(files)) == ["_a.py", "_b.py"]


@pytest.mark.parametrize(("program", "files", "message"), [
    (f"from {PACKAGE} import _a\n", {"_a.py": "from ansible.module_utils.basic import AnsibleModule\n"},
     "_a.py (imported by prog.py) imports ansible.module_utils.basic (line 1): nodes have no Ansible"),
    ("import ansible\n", {}, "prog.py imports ansible (line 1): nodes have no Ansible"),
    ("from ansible_collections.community.docker.plugins.module_utils import x\n", {},
     "prog.py imports ansible_collections.community.docker.plugins.module_utils (line 1)"),
    (f"from {PACKAGE} import _gone\n", {}, f"prog.py imports {PACKAGE}._gone, which the collection does not have"),
    ("from . import _a\n", {}, "prog.py imports relatively (line 1)"),
    ("def broken(:\n", {}, "prog.py is not valid Python"),
])
def test_what_cannot_run_on_a_node_is_refused_naming_the_chain(program, files, message):
    with pytest.raises(ProgramFilesError) as err:
        closure("prog.py", program, fake(files))
    assert message in str(err.value)


def test_node_files_puts_the_tree_next_to_the_program():
    files = {"_a.py": "A = 1\n"}
    entries = node_files("prog.py", f"from {PACKAGE} import _a\n", "/usr/local/libexec/x/prog.py", fake(files))
    tree = "/usr/local/libexec/x/ansible_collections/dgxspark/vllm/plugins/module_utils"
    assert entries == [
        {"path": "/usr/local/libexec/x/prog.py", "dir": "/usr/local/libexec/x",
         "content": f"from {PACKAGE} import _a\n", "module_util": None},
        {"path": f"{tree}/_a.py", "dir": tree, "content": "A = 1\n", "module_util": "_a.py"},
    ]


@pytest.mark.parametrize("dest", ["prog.py", "relative/prog.py", "/usr/local/libexec/x/"])
def test_node_files_wants_an_absolute_file_path(dest):
    with pytest.raises(ProgramFilesError, match="must be an absolute file path"):
        node_files("prog.py", "x = 1\n", dest, fake({}))


@pytest.mark.parametrize("program", [GUARD, FLUSH])
def test_an_installed_program_starts_without_the_collection_on_its_path(program, tmp_path):
    """Installed as the role installs it and run as its unit runs it (-I: no PYTHONPATH, no user site), each
    program imports what it needs: its --help answers."""
    installed = install_program(program, tmp_path)
    run = subprocess.run([sys.executable, "-I", str(installed), "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr


def test_read_items_name_the_program_and_fold_its_module_utils_into_it():
    entries = node_files("prog.py", f"from {PACKAGE} import _a\n", "/opt/prog.py", fake({"_a.py": "A = 1\n"}))
    assert read_items(entries, "program") == [
        {"path": "/opt/prog.py", "content": f"from {PACKAGE} import _a\n", "name": "program"},
        {"path": "/opt/ansible_collections/dgxspark/vllm/plugins/module_utils/_a.py", "content": "A = 1\n",
         "part_of": "program"}]
    with pytest.raises(ProgramFilesError, match="must not be empty"):
        read_items(entries, "")
