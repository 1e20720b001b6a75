#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: api_key
short_description: The cluster's generated API key, made once on the head and read back by every run
version_added: 0.2.0
description:
  - Reads the API key from O(path), or, when O(path) does not exist, generates one (256 random bits, URL-safe
    text) and writes it there as a new file of mode C(0600) in a folder of mode C(0700) (created when missing).
  - The file is linked into place only when absent, so two runs that race for it end with one key; a file that is
    there is never replaced.
  - Refuses a key file that is a symlink, not a regular file, another user's than root, or open to group or
    others, and a folder that is a symlink, another user's or writable by others, each with the fix.
  - The dgxspark.vllm.dgxspark_vllm role runs it on the head when the API listens beyond loopback and
    C(dgxspark_vllm_api_key) is unset, and gives every node of the cluster the key it returns.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  path:
    description: The key file on the head.
    type: path
    required: true
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: A missing file is not written; the key returned is one this run would write.
  diff_mode:
    support: none
    details: A diff would show the key.
  idempotent:
    support: full
    details: Once the file exists, the key in it is returned and nothing is written.
notes:
  - Run it with C(no_log=true), because the key is in its result.
"""

EXAMPLES = r"""
- name: The cluster's API key (generated on the first run)
  dgxspark.vllm.api_key:
    path: /etc/dgxspark/api-key
  delegate_to: "{{ dgxspark_vllm_config.head }}"
  run_once: true
  register: generated
  no_log: true
"""

RETURN = r"""
key:
  description: The API key.
  returned: success
  type: str
path:
  description: The key file.
  returned: always
  type: str
  sample: /etc/dgxspark/api-key
created:
  description: Whether this run generated the key (and, outside check mode, wrote the file).
  returned: success
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils import _api_key


def main() -> None:
    module = AnsibleModule(argument_spec=dict(path=dict(type="path", required=True)), supports_check_mode=True)
    path = module.params["path"]
    try:
        key, created = _api_key.read_or_create(path, module.check_mode)
    except (_api_key.ApiKeyError, OSError) as exc:
        module.fail_json(msg="the API key file %s cannot be used: %s" % (path, exc), path=path)
    module.exit_json(changed=created, key=key, path=path, created=created)


if __name__ == "__main__":
    main()
