#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_api_check
short_description: Ask vLLM's OpenAI API for its served models until it answers
version_added: 1.0.0
description:
  - GETs C(<url>/v1/models) with the API key's bearer header, up to 1 + O(retries) times O(delay) seconds apart,
    until it answers HTTP 200 with a JSON object. A refused key (HTTP 401 or 403) ends the tries at once.
  - The collection's one way to ask whether the API answers (module_utils/_api_probe.py), shared with the launch's
    node read (M(dgxspark.vllm.vllm_node_state)) and its startup wait (M(dgxspark.vllm.vllm_startup_wait)).
  - Never fails on the API's answer (RV(ok) says it; the caller judges and words the failure); fails only on bad
    options.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  url:
    description: The server's base URL (C(http://<head CX7 IP>:<port>)); C(/v1/models) is asked.
    type: str
    required: true
  api_key:
    description: The key vLLM was started with (C(--api-key)), sent as a bearer token. Empty or unset, none is sent.
    type: str
  timeout:
    description: Seconds one request may take.
    type: float
    default: 10
  retries:
    description: How many more tries after the first one fails.
    type: int
    default: 0
  delay:
    description: Seconds between two tries.
    type: float
    default: 5
  validate_certs:
    description: Validate the server's TLS certificate (an https:// URL only).
    type: bool
    default: true
  use_proxy:
    description: Use the proxy from the environment. Off by default, as the API is on the cluster's own network.
    type: bool
    default: false
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing changes, so there is nothing to diff.
  idempotent:
    support: full
    details: Reads only.
seealso:
  - module: dgxspark.vllm.vllm_metrics_info
"""

EXAMPLES = r"""
- name: Ask the head's API from this node, up to 13 times 5 s apart
  dgxspark.vllm.vllm_api_check:
    url: "http://{{ dgxspark_vllm_config.head_cx7_ip }}:{{ dgxspark_vllm_config.port }}"
    api_key: "{{ dgxspark_vllm_api_key }}"
    retries: 12
    delay: 5
  register: api
  no_log: true

- name: Fail naming what came back
  ansible.builtin.assert:
    that: api.ok
    fail_msg: "{{ api.msg }} after {{ api.attempts }} tries"
"""

RETURN = r"""
url:
  description: The URL asked.
  returned: always
  type: str
  sample: http://10.77.1.11:8000/v1/models
ok:
  description: Whether the last try answered HTTP 200 with a JSON object.
  returned: always
  type: bool
status:
  description: The last try's HTTP status; -1 without an HTTP answer.
  returned: always
  type: int
  sample: 200
msg:
  description: What the last try got (C(HTTP 200) when it answered; otherwise what went wrong, naming the URL).
  returned: always
  type: str
json:
  description: The answer, parsed (the served models in C(data)); null unless RV(ok).
  returned: always
  type: dict
  sample: {object: list, data: [{id: glm-5.3-flash, max_model_len: 131072}]}
attempts:
  description: How many tries were made.
  returned: always
  type: int
elapsed:
  description: Seconds the last try took.
  returned: always
  type: float
"""

import functools

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._api_probe import probe_until
from ansible_collections.dgxspark.vllm.plugins.module_utils._http import get


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "float", "default": 10},
            "retries": {"type": "int", "default": 0},
            "delay": {"type": "float", "default": 5},
            "validate_certs": {"type": "bool", "default": True},
            "use_proxy": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    if not p["url"].strip().lower().startswith(("http://", "https://")):
        problems.append(f"url must be the server's base URL, such as http://10.0.0.1:8000, not {p['url']!r}")
    if p["timeout"] <= 0:
        problems.append(f"timeout must be > 0 seconds, got {p['timeout']}")
    if p["retries"] < 0 or p["delay"] < 0:
        problems.append(f"retries and delay must not be negative (retries {p['retries']}, delay {p['delay']})")
    if problems:
        module.fail_json(msg="; ".join(problems))
    ask = functools.partial(get, timeout=p["timeout"], validate_certs=p["validate_certs"], use_proxy=p["use_proxy"])
    result = probe_until(ask, p["url"], p["api_key"] or None, p["retries"], p["delay"])
    module.exit_json(changed=False, url=result["url"], ok=result["ok"], status=result["status"], msg=result["msg"],
                     json=result["json"], attempts=result["attempts"], elapsed=result["elapsed"])


if __name__ == "__main__":
    main()
