# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of a program the collection installs on a node, with the module_utils it imports (pure).

A program that runs on a node outside Ansible (the group guard on the head, the page-cache flush service on every
node) decides with the collection's own module_utils, never with a copy of their code. It is installed with them in
a package tree next to itself (``<program's folder>/ansible_collections/dgxspark/vllm/plugins/module_utils/``) and
puts its own folder first on ``sys.path``. Which module_utils go with it is not a list kept by hand: it is the
closure of the program's imports of ``ansible_collections.dgxspark.vllm.plugins.module_utils``, read from the source
(``ast``), so a new import ships by itself. Nodes have no Ansible: a shipped module that imports ``ansible`` (or a
module_utils that does not exist) is refused here, on the controller, naming the chain that leads to it.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable
from typing import Any

PACKAGE = "ansible_collections.dgxspark.vllm.plugins.module_utils"
TREE = PACKAGE.replace(".", "/")


class ProgramFilesError(ValueError):
    """A program that cannot be shipped to a node as it is."""


def _imports(source: str, where: str) -> list[str]:
    """The module_utils names (``_vllm_log``) one source imports; refuses ``ansible`` imports and relative ones."""
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as err:
        raise ProgramFilesError(f"{where} is not valid Python: {err}") from None
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ProgramFilesError(f"{where} imports relatively (line {node.lineno}): a program on a node "
                                        f"imports the collection's module_utils as {PACKAGE}._name")
            base = node.module or ""
            if base == PACKAGE:
                found.extend(alias.name for alias in node.names)
                continue
            modules = [base]
        else:
            continue
        for module in modules:
            if module.startswith(PACKAGE + "."):
                found.append(module[len(PACKAGE) + 1:].split(".")[0])
            elif module == "ansible" or module.startswith(("ansible.", "ansible_collections.")):
                raise ProgramFilesError(f"{where} imports {module} (line {node.lineno}): nodes have no Ansible, so "
                                        "a program installed there may import only the standard library and the "
                                        "collection's own module_utils that need nothing else")
    return found


def closure(program: str, source: str, read: Callable[[str], str | None]) -> list[str]:
    """The module_utils file names (``_vllm_log.py``) a program needs, sorted: its imports and theirs.

    ``read(name)`` returns a module_utils file's text (``name`` like ``_vllm_log.py``), None when there is none."""
    needed: dict[str, str] = {}
    todo = [(name, program) for name in _imports(source, program)]
    while todo:
        name, importer = todo.pop()
        file_name = name + ".py"
        if file_name in needed:
            continue
        text = read(file_name)
        if text is None:
            raise ProgramFilesError(f"{importer} imports {PACKAGE}.{name}, which the collection does not have")
        needed[file_name] = importer
        chain = f"{file_name} (imported by {importer})"
        todo.extend((inner, chain) for inner in _imports(text, chain))
    return sorted(needed)


def node_files(program: str, source: str, dest: str, read: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """What to install on the node for ``program`` (its file name) at ``dest`` (its absolute path there): the program
    first, then each module_utils of its closure, each as ``{path, dir, content, module_util}`` (``module_util`` is
    the module_utils file name, None for the program)."""
    if not posixpath.isabs(dest) or dest.endswith("/"):
        raise ProgramFilesError(f"the path of {program} on the node must be an absolute file path, not {dest!r}")
    folder = posixpath.join(posixpath.dirname(dest), TREE)
    entries: list[dict[str, Any]] = [
        {"path": dest, "dir": posixpath.dirname(dest), "content": source, "module_util": None}]
    for name in closure(program, source, read):
        entries.append({"path": posixpath.join(folder, name), "dir": folder, "content": read(name),
                        "module_util": name})
    return entries


def read_items(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """``node_files`` entries as the files of a ``dgxspark.vllm.service_files_info`` read: the program under ``name``,
    each module_utils ``part_of`` it, so that the read's ``by_name[name]`` matches only when every file does."""
    if not name:
        raise ProgramFilesError("the name the program is read under must not be empty")
    return [{"path": entry["path"], "content": entry["content"],
             **({"part_of": name} if entry["module_util"] else {"name": name})} for entry in entries]
