#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_files_info
short_description: Read a systemd unit's state and its files in one step, and compare the files with the plan
version_added: 0.1.0
description:
  - Reads, on the node, the state of one systemd unit (C(systemctl show)) and a list of files. A file given with
    its planned C(content) is compared byte for byte; a file given with C(read) is returned whole.
  - One round trip tells a role whether its service is installed as planned and running, enabled at boot. The
    roles install and start only when it is not (RV(current) is false), so a re-run that finds everything in
    place changes nothing.
  - Read-only; runs the same in check mode.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  unit:
    description:
      - The unit's full name (for example V(dgxspark-cache-flush-follow.service)). Omitted, only the files are read.
    type: str
  running:
    description:
      - The unit's planned state. V(true), RV(current) needs it active; V(false), it must not be active, activating
        or reloading (inactive or failed).
    type: bool
    default: true
  enabled:
    description:
      - Whether the unit is planned to start at boot. RV(current) needs it enabled (V(true)) or not enabled
        (V(false)).
    type: bool
    default: true
  compare_state:
    description:
      - V(false), RV(current) needs the unit loaded only, whatever O(running) and O(enabled) say (a caller that
        installs and leaves the unit running or stopped as it finds it).
    type: bool
    default: true
  files:
    description:
      - The files to read.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's path on the node.
        type: path
        required: true
      name:
        description:
          - The file's key in RV(by_name), so that a caller reads it by name (C(result.by_name.config.matches)),
            not by its position in RV(files). Not empty, and given to one file only.
          - Omitted, the file is in RV(files) only.
        type: str
      part_of:
        description:
          - The O(files[].name) of another file this one is part of (a module_utils the program imports, part of
            the program). It folds into that file's RV(by_name) entry, whose C(exists) and C(matches) then hold
            only when they hold for each part too; the entry lists its parts' states in C(parts).
          - A file has either a O(files[].name) or O(files[].part_of); a O(files[].part_of) that names no file is
            refused.
        type: str
      content:
        description:
          - The planned content. The file must hold exactly these bytes (UTF-8) for RV(current) to be true.
        type: str
      read:
        description: Return the file's text in the result (small text files only).
        type: bool
        default: false
  also:
    description:
      - More units and files to read in the same round trip, for a caller that reads this node anyway (the group
        guard reads its own unit and files with the follow-mode flush service's read). They are returned in RV(also)
        and never compared, so they do not count in RV(current).
    type: dict
    default: {}
    suboptions:
      units:
        description: Units whose state to read (full names).
        type: list
        elements: str
        default: []
      files:
        description: Files to read (whether they exist, their SHA-256 and, with C(read), their text).
        type: list
        elements: dict
        default: []
        suboptions:
          path:
            description: Where the file is on the node (read, never compared).
            type: path
            required: true
          name:
            description:
              - The file's key in RV(also.by_name). Not empty, and given to one file of C(also.files) only.
              - Omitted, the file is in RV(also.files) only.
            type: str
          read:
            description: Return its text in RV(also) (small text files only).
            type: bool
            default: false
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    details: Never changes anything; always reports no change.
notes:
  - A unit that systemd does not know is reported in RV(unit) with C(loaded) false, not as an error. The module fails
    only when C(systemctl) is missing (with a unit to read), a file exists and cannot be read, or a file's C(name)
    is empty or given to two files (before anything is read).
seealso:
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
- name: Read the flush service's unit and files, compared with what the role installs
  dgxspark.vllm.service_files_info:
    unit: dgxspark-cache-flush-follow.service
    files:
      - path: /etc/dgxspark/cache-flush-follow.json
        content: "{{ lookup('ansible.builtin.template', 'cache-flush.json.j2') }}"
        name: config
    also:
      files:
        - {path: /var/lib/dgxspark-guard/state.json, read: true, name: guard_state}
  register: flush_now

- name: Install only when something differs
  ansible.builtin.include_tasks: install.yml
  when: not flush_now.current

- name: Write the configuration again only when it differs
  ansible.builtin.debug:
    msg: "the configuration differs (the guard's state file exists: {{ flush_now.also.by_name.guard_state.exists }})"
  when: not flush_now.by_name.config.matches
"""

RETURN = r"""
current:
  description:
    - Every file given with C(content) holds it, and the unit (when given) is loaded, active or not as O(running)
      plans and enabled at boot or not as O(enabled) plans.
    - A running unit whose process started before one of those files was last written is not current either way
      (O(compare_state) or not); its RV(unit) C(stale) is true. It runs what was there before, from an install whose
      restart did not happen (the run failed before its handlers, or was stopped).
  returned: always
  type: bool
  sample: true
differences:
  description: What keeps RV(current) false, one phrase each.
  returned: always
  type: list
  elements: str
  sample: ["/etc/dgxspark/cache-flush-follow.json differs from the planned content"]
unit:
  description:
    - The unit's state (null when O(unit) is not given). C(loaded), its unit file exists; C(running), active;
      C(stopped), inactive or failed (not active, activating - a restart loop's wait too -, reloading or
      deactivating); C(enabled), enabled at boot; C(installed), systemd knows its unit file (also with a bad
      setting); C(at_rest), stopped and not enabled at boot (nothing for a stop to do); and systemd's own
      C(load_state), C(active_state) and C(unit_file_state).
    - C(started_at), when the running process started (seconds since the epoch on the node's clock, the clock of
      the files' C(mtime); null when the unit is not active); C(stale_files), the files given with C(content) that
      hold it and were written after that start; C(stale), whether there is any (a restart is due).
  returned: always
  type: dict
  sample: {name: dgxspark-cache-flush-follow.service, load_state: loaded, active_state: active,
           unit_file_state: enabled, loaded: true, running: true, stopped: false, enabled: true, installed: true,
           at_rest: false, started_at: 1796583001.25, stale_files: [], stale: false}
files:
  description: One entry per O(files) item, in order, with C(path), C(exists), C(sha256), C(mtime) (its last
    write, seconds since the epoch; null when absent), C(matches) (null without C(content)) and, with C(read),
    C(content) (null when the file is absent).
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/dgxspark/cache-flush-follow.json, exists: true, sha256: "9f2c...", mtime: 1796582990.5,
            matches: true}]
by_name:
  description: The entries of RV(files) whose O(files) item has a C(name), by that name (the same values). An entry
    with parts (O(files[].part_of)) also has C(parts), their states; its C(exists) and C(matches) then cover the
    parts too. Empty when no file has a name.
  returned: always
  type: dict
  sample: {config: {path: /etc/dgxspark/cache-flush-follow.json, exists: true, sha256: "9f2c...", matches: true}}
also:
  description: What O(also) asked for, C(units) by name (each as in RV(unit)), C(files) in order (each as in
    RV(files), C(matches) null) and C(by_name), the entries of C(files) whose item has a C(name), by that name.
    Empty lists and mappings when O(also) is not given.
  returned: always
  type: dict
  contains:
    units:
      description: Each unit of O(also.units), by its name, as in RV(unit) but for C(stale_files) and C(stale) (no
        file is compared for it; the caller compares C(started_at) with the C(mtime) of the files it reads).
      type: dict
      returned: always
    files:
      description: One entry per O(also.files) item, in order, as in RV(files) (C(matches) null).
      type: list
      elements: dict
      returned: always
    by_name:
      description: The entries of C(files) whose O(also.files) item has a C(name), by that name.
      type: dict
      returned: always
  sample: {units: {dgxspark-group-guard.service: {name: dgxspark-group-guard.service, loaded: true, running: true,
                                                   stopped: false, enabled: true}},
           files: [{path: /etc/dgxspark/guard.json, exists: true, sha256: "1c0e...", matches: null, content: "{}"}],
           by_name: {guard_config: {path: /etc/dgxspark/guard.json, exists: true, sha256: "1c0e...", matches: null,
                                    content: "{}"}}}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._service_state import (
    UNIT_PROPERTIES, ServiceFilesError, by_name, check_names, differences, file_state, parse_show,
    planned_stale_files, unit_state)


def _read(module: AnsibleModule, path: str) -> tuple[bytes | None, float | None]:
    """The file's bytes and modification time; (None, None) when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read(), os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        module.fail_json(msg="cannot read %s on this node: %s" % (path, exc.strerror))
    return None, None


def _file(module: AnsibleModule, item: dict, wanted: str | None) -> dict:
    data, mtime = _read(module, item["path"])
    return file_state(item["path"], data, wanted, item["read"], mtime)


def _unit(module: AnsibleModule, name: str) -> dict:
    systemctl = module.get_bin_path("systemctl", required=True)
    argv = [systemctl, "show", name] + ["--property=%s" % prop for prop in UNIT_PROPERTIES]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg="systemctl show %s failed on this node: %s" % (name, " ".join(err.split()) or rc))
    return unit_state(name, parse_show(out), (time.time(), time.monotonic()))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str"},
            "running": {"type": "bool", "default": True},
            "enabled": {"type": "bool", "default": True},
            "compare_state": {"type": "bool", "default": True},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "name": {"type": "str"},
                "part_of": {"type": "str"},
                "content": {"type": "str"},
                "read": {"type": "bool", "default": False},
            }},
            "also": {"type": "dict", "default": {}, "options": {
                "units": {"type": "list", "elements": "str", "default": []},
                "files": {"type": "list", "elements": "dict", "default": [], "options": {
                    "path": {"type": "path", "required": True},
                    "name": {"type": "str"},
                    "read": {"type": "bool", "default": False},
                }},
            }},
        },
        supports_check_mode=True,
    )
    also = module.params["also"]   # the argument spec fills in units and files (empty lists) when not given
    try:
        check_names(module.params["files"], "files")
        check_names(also["files"], "also.files")
    except ServiceFilesError as exc:
        module.fail_json(msg=str(exc))
    unit = _unit(module, module.params["unit"]) if module.params["unit"] else None
    files = [_file(module, item, item["content"]) for item in module.params["files"]]
    compared = module.params["compare_state"]
    found = differences(unit, files, module.params["running"] if compared else None,
                        module.params["enabled"] if compared else None)
    if unit is not None:
        unit["stale_files"] = planned_stale_files(unit, files)
        unit["stale"] = bool(unit["stale_files"])
    also_files = [_file(module, item, None) for item in also["files"]]
    also_read = {"units": {name: _unit(module, name) for name in also["units"]}, "files": also_files,
                 "by_name": by_name(also["files"], also_files)}
    module.exit_json(changed=False, current=not found, differences=found, unit=unit, files=files,
                     by_name=by_name(module.params["files"], files), also=also_read)


if __name__ == "__main__":
    main()
