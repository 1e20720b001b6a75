#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: kit_env
short_description: Render the EXL3 kit's .env from inventory, or check the DFlash2 drafter's licence acknowledgement
version_added: 0.1.0
description:
  - The MiaAI-Lab EXL3 kit (profile C(glm53_flash_exl3)) is launched by its own C(./start.sh), which sources C(.env)
    on the head and drives the worker over ssh. This module renders that file (every key of the kit's
    C(.env.example) at the commit the collection models, in its order) from the cluster's two nodes and the
    settings, and returns it; it writes nothing (the role writes RV(content) with M(ansible.builtin.copy)).
  - With O(example), the kit checkout's own C(.env.example) is checked first - a checkout with other keys is
    refused, so nothing is written that its C(start.sh) would ignore.
  - With O(purpose=licence), only the licence guard runs - staging calls it before anything is downloaded.
  - Pure computation; the same on any host, in check mode too.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  purpose:
    description:
      - V(env) renders the file; V(licence) refuses the non-commercial DFlash2 drafter (C(incoai/GLM-5.3-Flash-DFlash2))
        with C(SPEC_METHOD=dflash) unless C(settings.accept_noncommercial_drafter) is true, and renders nothing.
    type: str
    choices: [env, licence]
    default: env
  settings:
    description:
      - C(hf_bin) (required for V(env)), C(skip_build), C(env) (more kit keys by their kit name),
        C(accept_noncommercial_drafter), C(allow_high_gpu_memory_utilization), and the collection's values
        C(image), C(model), C(model_revision), C(drafter), C(served_model_name), C(port), C(master_port),
        C(hf_home), C(worker_user), C(worker_home) (each rendered into its kit key; unset keeps the kit default).
      - Secrets (C(HF_TOKEN), C(GHCR_TOKEN), C(VLLM_API_KEY)) are refused - this file is plain configuration; the
        kit_launch role hands them to C(./start.sh) through a 0600 file its start sources and removes
        (M(dgxspark.vllm.kit_launch_plan) O(dgxspark.vllm.kit_launch_plan#module:secrets_file)).
    type: dict
    required: true
  node:
    description: This node - name, cx7_ip, head, cx7_iface, ib_hca (one device), gid_index. Required for V(env).
    type: dict
  peers:
    description: The other node, in a list. Required for V(env).
    type: list
    elements: dict
    default: []
  example:
    description: The text of the kit checkout's C(.env.example), checked against the modelled keys.
    type: str
notes:
  - docs/exl3-kit.md documents the kit's C(.env) contract and where the recipe and the kit disagree.
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Renders the same in check mode; it never writes.
  diff_mode:
    support: none
    details: The role writes RV(content) with M(ansible.builtin.copy), which shows the diff.
  idempotent:
    support: full
    details: Pure computation; the same inputs give the same text.
"""

EXAMPLES = r"""
- name: Render the kit's .env
  dgxspark.vllm.kit_env:
    settings:
      hf_bin: /home/spark/.hf-cli/venv/bin/hf
      accept_noncommercial_drafter: true
      model: brandonmusic/GLM-5.3-Flash-tr3-4bpw
    node: {name: spark1, head: true, cx7_ip: 192.168.100.11, cx7_iface: enp1s0f1np1, ib_hca: rocep1s0f1, gid_index: 3}
    peers:
      - {name: spark2, cx7_ip: 192.168.100.12, cx7_iface: enP2p1s0f1np1, ib_hca: roceP2p1s0f1, gid_index: 3}
    example: "{{ (kit_example.content | b64decode) }}"
  register: kit

- name: Refuse the non-commercial drafter without the acknowledgement
  dgxspark.vllm.kit_env:
    purpose: licence
    settings:
      drafter: incoai/GLM-5.3-Flash-DFlash2
      accept_noncommercial_drafter: "{{ dgxspark_vllm_accept_noncommercial_drafter }}"
"""

RETURN = r"""
content:
  description: The C(.env) text (V(env) only).
  returned: purpose is env
  type: str
checksum:
  description: SHA-256 of RV(content).
  returned: purpose is env
  type: str
values:
  description: Every key written and its value, in the file's order.
  returned: purpose is env
  type: dict
changed_from_kit:
  description: The keys whose value differs from the kit's default (or that the example only shows in comments).
  returned: purpose is env
  type: dict
unset_in_caller:
  description:
    - The variables C(start.sh) takes from its caller over C(.env) (start.sh:96-122); the C(./start.sh) task must
      not carry them (C(env -u NAME ...)).
  returned: always
  type: list
  elements: str
drafter:
  description: The drafter that would be served (C(DFLASH_MODEL)), or an empty string without C(SPEC_METHOD=dflash).
  returned: always
  type: str
drafter_licence:
  description: The drafter's licence when it is the non-commercial one (then acknowledged), else an empty string.
  returned: always
  type: str
"""

import hashlib

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils import _kit


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "purpose": {"type": "str", "choices": ["env", "licence"], "default": "env"},
            "settings": {"type": "dict", "required": True},
            "node": {"type": "dict"},
            "peers": {"type": "list", "elements": "dict", "default": []},
            "example": {"type": "str"},
        },
        required_if=[("purpose", "env", ("node",))],
        supports_check_mode=True,
    )
    p = module.params
    settings = p["settings"]
    drafter = _kit.served_drafter(settings)
    result = {"changed": False, "drafter": drafter, "unset_in_caller": list(_kit.CALLER_OVERRIDES),
              "drafter_licence": _kit.DRAFTER_LICENCE if drafter == _kit.DRAFTER_REPO else ""}
    try:
        if p["purpose"] == "licence":
            _kit.drafter_guard(drafter, settings.get(_kit.ACK_SETTING, False))
            module.exit_json(**result)
        if p["example"] is not None:
            _kit.check_example(p["example"])
        values = _kit.resolve_env(settings, p["node"], p["peers"])
        content = _kit.render_env(settings, p["node"], p["peers"])
    except _kit.KitError as exc:
        module.fail_json(msg=str(exc), **result)
    result.update(
        content=content,
        checksum=hashlib.sha256(content.encode("utf-8")).hexdigest(),
        values=values,
        changed_from_kit={key: value for key, value in values.items() if _kit.KIT_KEYS.get(key) != value},
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
