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
