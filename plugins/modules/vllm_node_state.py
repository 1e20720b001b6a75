#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_node_state
short_description: Read in one pass what the launch needs to know about a node
version_added: 0.1.0
description:
  - Reads the serve container (exists, running, its C(dgxspark.vllm.config_hash) label), the serve image's ID, the
    GPU's identity (C(nvidia-smi); null without it, as in the lab), the staged checkpoint's stamp, whether a
    staging lock is held and the memory size, with the docker CLI and the file system.
  - One module run instead of one per read; the launch role calls it once per node before it decides whether to
    start anything.
  - Reads only. It never changes the node.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  container:
    description: Name of the serve container.
    type: str
    required: true
  image:
    description: The serve image (as rendered); its ID on this node is returned as RV(image_id).
    type: str
  stamp_path:
    description: The staged checkpoint's stamp file (C(.dgxspark-stamp.json)); returned as RV(stamp) when given.
    type: path
  lock_path:
    description: The staging lock; RV(staging_lock) says whether it exists when given.
    type: path
  gpu:
    description: Whether to read the GPU's identity with C(nvidia-smi) (absent C(nvidia-smi) gives null).
    type: bool
    default: true
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; it reads the same in check mode.
  diff_mode:
    support: none
    details: Read-only.
  idempotent:
    support: full
    details: Read-only; never reports a change.
"""

EXAMPLES = r"""
- name: Read the node's serve state before the launch decides
  dgxspark.vllm.vllm_node_state:
    container: vllm_glm53
    image: vllm-node:latest
    stamp_path: /var/tmp/models/glm-5.3-flash/.dgxspark-stamp.json
    lock_path: /run/dgxspark-staging.lock
  register: node_state
"""

RETURN = r"""
container:
  description: The serve container; C(config_hash) is its C(dgxspark.vllm.config_hash) label.
  returned: always
  type: dict
  sample: {exists: true, running: true, id: "4f1c...", exit_code: 0, config_hash: "9b2e...", started_at: "2026-12-01T07:05:12Z"}
image_id:
  description: The ID of O(image) on this node; null when the node does not hold it or O(image) is not given.
  returned: always
  type: str
  sample: sha256:4f1c0d...
gpu:
  description: The GPU's name, driver and memory from C(nvidia-smi); null when it is absent or fails.
  returned: always
  type: dict
  sample: {gpu_name: NVIDIA GB10, driver: "580.95.05", gpu_memory: "[N/A]"}
stamp:
  description: The stamp's JSON (repo, commit, files, time); null when O(stamp_path) is not given or absent.
  returned: always
  type: dict
  sample: {repo: dgxspark-lab/tiny-glm, commit: 5d3f...}
staging_lock:
  description: Whether O(lock_path) exists; null when not given.
  returned: always
  type: bool
  sample: false
mem_total_mb:
  description: MemTotal from C(/proc/meminfo) in MiB, rounded down as the C(memtotal_mb) fact (null if unreadable).
  returned: always
  type: int
  sample: 124546
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import NodeStateError, read_state


def _read_meminfo() -> str:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "image": {"type": "str"},
            "stamp_path": {"type": "path"},
            "lock_path": {"type": "path"},
            "gpu": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    docker = module.get_bin_path("docker")
    if docker is None:
        module.fail_json(msg="the docker CLI is not installed on this node (not found on PATH)")
    stamp_text = None
    if p["stamp_path"] and os.path.exists(p["stamp_path"]):
        try:
            with open(p["stamp_path"], encoding="utf-8") as handle:
                stamp_text = handle.read()
        except OSError as exc:
            module.fail_json(msg="cannot read the stamp %s: %s" % (p["stamp_path"], exc))
    try:
        state = read_state(module.run_command, docker, p["container"], p["image"],
                           module.get_bin_path("nvidia-smi") if p["gpu"] else None,
                           stamp_text, p["stamp_path"],
                           os.path.lexists(p["lock_path"]) if p["lock_path"] else None,
                           _read_meminfo())
    except NodeStateError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
