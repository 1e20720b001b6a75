# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Import a standalone program the collection ships (a role's or a playbook's files/*.py) for its unit tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_program(path: Path, name: str) -> ModuleType:
    """The program at `path` as module `name`: registered in sys.modules (dataclasses look their module up while
    they build the classes), and written without a __pycache__ among the files the collection ships."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    keep, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = keep
    return module


def install_program(program: Path, folder: Path) -> Path:
    """Install `program` into `folder` as its role installs it on a node (module_utils/_program_files.node_files: the
    program and the closure of the collection's module_utils it imports, in the package tree next to it), so that a
    test runs it the way the node does (``python -I``, no collection on the path). Returns the installed program."""
    from ansible_collections.dgxspark.vllm.plugins.module_utils._program_files import node_files

    module_utils = Path(__file__).resolve().parents[3] / "plugins" / "module_utils"

    def read(name: str) -> str | None:
        path = module_utils / name
        return path.read_text(encoding="utf-8") if path.is_file() else None

    dest = folder / program.name
    for entry in node_files(program.name, program.read_text(encoding="utf-8"), str(dest), read):
        Path(entry["dir"]).mkdir(parents=True, exist_ok=True)
        Path(entry["path"]).write_text(entry["content"], encoding="utf-8")
    return dest
