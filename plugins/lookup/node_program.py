# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lookup plugin: the files of a program the collection installs on a node, with the module_utils it imports."""

from __future__ import annotations

DOCUMENTATION = r"""
name: node_program
short_description: The files that install a program on a node, with the collection's module_utils it imports
version_added: 1.0.0
author:
  - dgxspark.vllm contributors (@dgxspark)
description:
  - A program the collection runs on a node outside Ansible (the group guard, the page-cache flush service) decides
    with the collection's own module_utils. It is installed with them in a package tree next to itself
    (C(<its folder>/ansible_collections/dgxspark/vllm/plugins/module_utils/)), and it puts its folder first on
    C(sys.path).
  - This lookup reads the program (a file of the calling role's C(files/)) and returns what to install, in order,
    the program, then every module_utils it imports, directly or through another (read from the source, so nothing
    is listed by hand). Each entry is a mapping with C(path) (where it goes on the node), C(dir) (its folder),
    C(content) (its text) and C(module_util) (the module_utils file name; null for the program).
  - Refused (naming the import chain) when a shipped file imports C(ansible) (nodes have no Ansible), imports
    relatively or imports a module_utils the collection does not have.
options:
  _terms:
    description: The program's file name in the role's C(files/) (one).
    required: true
    type: list
    elements: str
  dest:
    description: The program's absolute path on the node; the module_utils go into the package tree in its folder.
    required: true
    type: str
  read_as:
    description:
      - Return the files as the O(dgxspark.vllm.service_files_info#module:files) of a read instead, the program named
        O(read_as) and each module_utils C(part_of) it (C(path), C(content) and C(name) or C(part_of)), so that the
        read's C(by_name[read_as]) matches only when the program and every module_utils it needs do.
      - Empty, the entries to install.
    type: str
    default: ""
notes:
  - Use it with C(query) (or C(wantlist=true)) to get the list of entries.
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Create the program's folders
  ansible.builtin.file:
    path: "{{ item }}"
    state: directory
    mode: "0755"
  loop: "{{ program_files | map(attribute='dir') | unique }}"
  vars:
    program_files: "{{ query('dgxspark.vllm.node_program', 'dgxspark_cache_flush.py', dest='/usr/local/libexec/dgxspark/dgxspark_cache_flush.py') }}"

- name: Install the program and its module_utils
  ansible.builtin.copy:
    content: "{{ item.content }}"
    dest: "{{ item.path }}"
    mode: "0644"
  loop: "{{ program_files }}"
  loop_control:
    label: "{{ item.path }}"
"""

RETURN = r"""
_raw:
  description: The program first, then each module_utils it needs, sorted by name (with O(read_as), as read items).
  type: list
  elements: dict
  contains:
    path:
      description: Where the file goes on the node.
      type: str
    dir:
      description: The folder of RV(_raw.path).
      type: str
    content:
      description: The file's text.
      type: str
    module_util:
      description: The module_utils file name (C(_vllm_log.py)); null for the program.
      type: str
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.dgxspark.vllm.plugins.module_utils._program_files import (
    ProgramFilesError, node_files, read_items)

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")


def _read_module_util(name: str) -> str | None:
    path = os.path.join(_MODULE_UTILS, name)
    if os.path.basename(name) != name or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


class LookupModule(LookupBase):
    """Returns the node files of one program (see DOCUMENTATION)."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleLookupError(f"node_program takes one program file name, not {len(terms)}: {terms!r}")
        program = terms[0]
        found = self.find_file_in_search_path(variables, "files", program, ignore_missing=True)
        if not found:
            raise AnsibleLookupError(f"node_program: the program {program!r} is not in the role's files/")
        source = self._loader.get_text_file_contents(found)
        try:
            entries = node_files(program, source, self.get_option("dest"), _read_module_util)
            return read_items(entries, self.get_option("read_as")) if self.get_option("read_as") else entries
        except ProgramFilesError as err:
            raise AnsibleLookupError(f"node_program: {err}") from None
