#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: secret_file
short_description: Write a secret (the HF token, the API key) into a file only its owner can read, or remove it
version_added: 0.1.0
description:
  - Writes O(content), or the shell assignments of O(env), into O(path) as a new file of mode C(0600) (owned by
    O(owner) and O(group) when given) that then replaces O(path); nobody else can read it at any time, and a file
    that was there is replaced whatever its mode. A missing folder for it is created with mode C(0700) and the same
    owner (its own parent must exist).
  - Meant for a task that runs in the background (C(async)) and for a program that must not take the secret on its
    command line or in its environment - they get the file's path, never the secret (Ansible writes an async
    task's arguments into the job's files on the node, and prints a task's environment with C(-vvv)).
    M(dgxspark.vllm.hf_checkpoint) reads its O(dgxspark.vllm.hf_checkpoint#module:token_file) this way.
  - Unlike M(ansible.builtin.copy) with C(content), the secret is not first written to a temporary file on the
    controller and another one on the node; with pipelining (the collection's C(ansible.cfg)) it travels on the
    connection only.
  - The secret is never returned.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  path:
    description: The secret file.
    type: path
    required: true
  state:
    description: V(present) writes the file, V(absent) removes it (a missing file is no change).
    type: str
    choices: [present, absent]
    default: present
  content:
    description: The secret, written as given. One of O(content) and O(env) is required with O(state=present).
    type: str
  env:
    description:
      - Variables to write as shell assignments (C(NAME='value'), one a line, quoted for C(sh)), for a wrapper that
        sources the file with C(set -a). A variable whose value is empty is left out.
      - One of O(content) and O(env) is required with O(state=present).
    type: dict
  owner:
    description: The file's owner (a user name); the user this module runs as when omitted.
    type: str
  group:
    description: The file's group (a group name); the owner's primary group when omitted.
    type: str
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the file would change and writes nothing.
  diff_mode:
    support: none
    details: A diff would show the secret.
  idempotent:
    support: full
    details: A file that already holds the same secret with mode 0600 and the same owner is not written again.
notes:
  - Run it with C(no_log) (the collection's roles use C(dgxspark_vllm_config.secure_logging)); O(content) and O(env)
    are hidden from its own result either way.
  - Readers refuse a file that group or others can use, or that belongs to another user than the reader or root.
"""

EXAMPLES = r"""
- name: Give the background download the HF token through a root-only file on tmpfs
  dgxspark.vllm.secret_file:
    path: /run/dgxspark/hf-token-checkpoint
    content: "{{ dgxspark_vllm_hf_token }}"
  no_log: "{{ dgxspark_vllm_config.secure_logging }}"

- name: The kit user's start environment (sourced with set -a, then removed by the wrapper)
  dgxspark.vllm.secret_file:
    path: /run/dgxspark-kit/start.env
    env:
      VLLM_API_KEY: "{{ dgxspark_vllm_api_key }}"
      HF_TOKEN: "{{ dgxspark_vllm_hf_token }}"
    owner: spark
  no_log: "{{ dgxspark_vllm_config.secure_logging }}"

- name: Remove it
  dgxspark.vllm.secret_file:
    path: /run/dgxspark/hf-token-checkpoint
    state: absent
"""

RETURN = r"""
path:
  description: The secret file.
  returned: always
  type: str
  sample: /run/dgxspark/hf-token-checkpoint
written:
  description: Whether the file holds a secret now (false with O(state=absent), and when O(env) had no value set).
  returned: always
  type: bool
  sample: true
"""

import grp
import pwd

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils import _secret_file as sf


def _ids(owner: str | None, group: str | None) -> tuple[int | None, int | None]:
    """(uid, gid) of the owner and group names (the owner's primary group without a group); None: unchanged."""
    uid = gid = None
    if owner:
        try:
            entry = pwd.getpwnam(owner)
        except KeyError:
            raise sf.SecretFileError("no user %s on this node" % owner) from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise sf.SecretFileError("no group %s on this node" % group) from None
    return uid, gid


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            content=dict(type="str", no_log=True),
            env=dict(type="dict", no_log=True),
            owner=dict(type="str"),
            group=dict(type="str"),
        ),
        mutually_exclusive=[("content", "env")],
        required_if=[("state", "present", ("content", "env"), True)],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    try:
        if p["state"] == "absent":
            changed = sf.remove_secret(path, module.check_mode)
            module.exit_json(changed=changed, path=path, written=False)
        text = p["content"] if p["content"] is not None else sf.render_env(p["env"] or {})
        if text == "":
            # no secret to keep (every value of env empty): no file
            changed = sf.remove_secret(path, module.check_mode)
            module.exit_json(changed=changed, path=path, written=False)
        uid, gid = _ids(p["owner"], p["group"])
        changed = sf.write_secret(path, text, uid, gid, module.check_mode)
    except (sf.SecretFileError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (path, exc), path=path)
    module.exit_json(changed=changed, path=path, written=True)


if __name__ == "__main__":
    main()
