#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_store
short_description: Serve another staged checkpoint commit at the model path, list the parked ones, or prune them
version_added: 0.1.0
description:
  - The tree at O(path) (C(dgxspark_vllm_model_path)) is the checkpoint commit the launch serves; every other verified
    commit staged on the node is parked whole beside it, in C(<path>.commits/<commit>/) (see
    O(dgxspark.vllm.hf_checkpoint#module:keep_commits)).
  - V(list) lists the parked commits with their bytes and the selected one. V(select) makes O(commit) of O(repo)
    the tree at O(path) - the tree there, when it is another verified commit, is parked, and the wanted one is
    brought back from the store (renames - nothing is copied or downloaded); a commit neither selected nor parked is
    refused. V(prune) removes the parked trees of O(commits) (never the tree at O(path)) and lists what it freed.
  - Before anything moves, every level of O(path)'s parent is checked (root's, no symlink, not writable by others),
    as the checkpoint staging checks it. A O(path) that is a mount point cannot be moved; that is refused, naming the
    fix. No symlink is followed.
  - Run it only while no serve container uses O(path) (the rollback stops the group first).
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  path:
    description: The model path, the tree the launch serves.
    type: path
    required: true
  operation:
    description: V(list) lists, V(select) serves O(commit), V(prune) removes the parked O(commits).
    type: str
    choices: [list, select, prune]
    default: list
  repo:
    description: The repository of O(commit). Required with O(operation=select).
    type: str
  commit:
    description: The 40-hex commit to serve. Required with O(operation=select).
    type: str
  commits:
    description: The parked commits to remove, with O(operation=prune). The tree at O(path) is never removed.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Says what would move or be removed; nothing moves.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: The wanted commit already selected, or nothing left to remove, is no change.
"""

EXAMPLES = r"""
- name: Serve the recorded release's commit again (its tree parked beside the model path)
  dgxspark.vllm.checkpoint_store:
    path: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    operation: select
    repo: RedHatAI/GLM-5.3-Flash-NVFP4
    commit: 0123456789abcdef0123456789abcdef01234567

- name: Remove the parked commits no kept release needs
  dgxspark.vllm.checkpoint_store:
    path: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat
    operation: prune
    commits: [0123456789abcdef0123456789abcdef01234567]
"""

RETURN = r"""
store:
  description: The store folder beside O(path).
  returned: always
  type: str
  sample: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat.commits
selected:
  description: The repository and commit of the tree at O(path) (its stamp), after the module ran; empty when it has
    no stamp.
  returned: always
  type: dict
  sample: {repo: RedHatAI/GLM-5.3-Flash-NVFP4, commit: 0123456789abcdef0123456789abcdef01234567}
parked:
  description: Each parked commit with its repository, bytes and folder, after the module ran.
  returned: always
  type: dict
  sample: {0123456789abcdef0123456789abcdef01234567: {repo: org/name, bytes: 1024, path: /m.commits/0123...}}
moved:
  description: With O(operation=select), what moved - C(park), C(unpark), C(set_aside), C(selected) and a C(message).
  returned: when O(operation=select)
  type: dict
removed:
  description: With O(operation=prune), each removed (in check mode, each that would be removed) parked tree - its
    commit, folder and bytes.
  returned: when O(operation=prune)
  type: list
  elements: dict
freed_bytes:
  description: The bytes RV(removed) freed (would free, in check mode).
  returned: when O(operation=prune)
  type: int
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgxspark.vllm.plugins.module_utils import _checkpoint_store as cs
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf
from ansible_collections.dgxspark.vllm.plugins.module_utils import _safe_paths as sp


def _listing(path: str) -> dict:
    parked = cs.list_parked(path)
    stamp = mf.read_stamp(path) if os.path.isdir(path) and not os.path.islink(path) else None
    return {"store": cs.store_dir(path),
            "selected": {"repo": stamp.get("repo"), "commit": stamp.get("commit")} if stamp else {},
            "parked": {commit: {"repo": found.get("repo"), "path": cs.parked_path(path, commit),
                                "bytes": cs.tree_bytes(cs.parked_path(path, commit))}
                       for commit, found in parked.items()}}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            operation=dict(type="str", choices=["list", "select", "prune"], default="list"),
            repo=dict(type="str"),
            commit=dict(type="str"),
            commits=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("operation", "select", ["repo", "commit"])],
        supports_check_mode=True,
    )
    p = module.params
    path = os.path.normpath(p["path"])
    result: dict = {"changed": False}
    try:
        sp.check_levels(os.path.dirname(path), {0, os.geteuid()}, "the model folder's parent",
                        "dgxspark_vllm_model_path")
        if p["operation"] == "select":
            if p["commit"] not in cs.list_parked(path) and (mf.read_stamp(path) or {}).get("commit") != p["commit"]:
                raise cs.StoreError(f"{p['repo']}@{p['commit']} is neither the tree at {path} nor parked in "
                                    f"{cs.store_dir(path)}: stage it (site.yml with its revision); nothing moved")
            moved = cs.select(path, p["repo"], p["commit"], module.check_mode)
            result.update(changed=moved["changed"], moved=moved)
        elif p["operation"] == "prune":
            parked = cs.list_parked(path)
            removed = []
            for commit in p["commits"]:
                if commit not in parked:
                    continue
                folder = cs.parked_path(path, commit)
                size = cs.tree_bytes(folder) if module.check_mode else cs.remove_parked(path, commit)
                removed.append({"commit": commit, "path": folder, "bytes": size})
            result.update(changed=bool(removed), removed=removed, freed_bytes=sum(item["bytes"] for item in removed))
        result.update(_listing(path))
    except (cs.StoreError, sp.UnsafePathError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
