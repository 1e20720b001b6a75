#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_verify_plan
short_description: Build the request bodies the verify role sends to a vLLM cluster
version_added: 0.1.0
description:
  - Takes the checkpoint's C(generation_config.json) text and returns the sampling parameters the verify
    requests use (C(temperature), C(top_p), C(top_k), C(min_p), C(repetition_penalty) when the file sets them),
    overridden key by key by O(sampling).
  - Returns four OpenAI chat-completion bodies, all with C(chat_template_kwargs.enable_thinking=false) - a
    short chat, a non-English prompt for the token-integrity check, a forced tool call, and a long completion
    with C(ignore_eos) for the busy-rank check.
  - Pure computation; it never touches the target.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  served_model_name:
    description: The C(model) every request names (C(--served-model-name)).
    type: str
    required: true
  generation_config:
    description:
      - Text of the checkpoint's C(generation_config.json). Empty or omitted means the engine's defaults.
    type: str
    default: ""
  sampling:
    description:
      - Overrides of the sampling parameters, key by key. A key set to null removes it.
      - Keys - C(temperature), C(top_p), C(top_k), C(min_p), C(repetition_penalty).
    type: dict
    default: {}
  prompts:
    description: The user prompt of each request.
    type: dict
    required: true
    suboptions:
      chat:
        description: Prompt of the short chat completion.
        type: str
        required: true
      utf8:
        description: Non-English prompt (several scripts) of the token-integrity check.
        type: str
        required: true
      tool_call:
        description: Prompt of the forced tool call.
        type: str
        required: true
      busy:
        description: Prompt of the long completion sent while the ranks are sampled.
        type: str
        required: true
  tool:
    description: The one tool offered, in OpenAI form (C(type=function), C(function.name), C(function.parameters)).
    type: dict
    required: true
  tool_choice:
    description: How the tool is forced - V(named) (C(tool_choice) names the function) or V(required).
    type: str
    choices: [named, required]
    default: named
  max_tokens:
    description: C(max_tokens) of each request.
    type: dict
    required: true
    suboptions:
      chat:
        description: Short chat.
        type: int
        required: true
      utf8:
        description: Token-integrity request.
        type: int
        required: true
      tool_call:
        description: Forced tool call (room for the whole JSON arguments).
        type: int
        required: true
      busy:
        description: Long completion (generated in full, C(ignore_eos)).
        type: int
        required: true
seealso:
  - module: dgxspark.vllm.vllm_verify_judge
"""

EXAMPLES = r"""
- name: Read the checkpoint's generation config on the head
  ansible.builtin.slurp:
    src: /var/tmp/models/GLM-5.3-Flash-NVFP4-redhat/generation_config.json
  register: genconf

- name: Build the verify requests
  dgxspark.vllm.vllm_verify_plan:
    served_model_name: glm-5.3-flash
    generation_config: "{{ genconf.content | b64decode }}"
    sampling: {temperature: 0.6}
    prompts:
      chat: Say hello.
      utf8: "你好, Привет, Γεια σου"
      tool_call: What is the weather in Paris?
      busy: Write a long story.
    tool:
      type: function
      function:
        name: get_weather
        parameters: {type: object, properties: {city: {type: string, enum: [Paris]}}, required: [city]}
    max_tokens: {chat: 64, utf8: 128, tool_call: 256, busy: 256}
  register: plan
"""

RETURN = r"""
sampling:
  description: Sampling parameters every request carries.
  returned: always
  type: dict
  sample: {"temperature": 1.0}
tool_name:
  description: Name of the forced tool.
  returned: always
  type: str
  sample: get_weather
requests:
  description: The request bodies, ready for ansible.builtin.uri with body_format json.
  returned: always
  type: dict
  contains:
    chat:
      description: Short chat completion.
      type: dict
      returned: always
      sample: {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 64,
               "chat_template_kwargs": {"enable_thinking": false}, "temperature": 1.0}
    utf8:
      description: Non-English prompt.
      type: dict
      returned: always
      sample: {"model": "glm-5.3-flash", "max_tokens": 128}
    tool_call:
      description: Forced tool call (C(tools) with the one tool, C(tool_choice)).
      type: dict
      returned: always
      sample: {"model": "glm-5.3-flash", "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    busy:
      description: Long completion with C(ignore_eos=true).
      type: dict
      returned: always
      sample: {"model": "glm-5.3-flash", "max_tokens": 256, "ignore_eos": true}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._verify import (
    VerifyError,
    plan_requests,
    sampling_from_generation_config,
)

_FOUR_STR = {k: {"type": "str", "required": True} for k in ("chat", "utf8", "tool_call", "busy")}
_FOUR_INT = {k: {"type": "int", "required": True} for k in ("chat", "utf8", "tool_call", "busy")}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "served_model_name": {"type": "str", "required": True},
            "generation_config": {"type": "str", "default": ""},
            "sampling": {"type": "dict", "default": {}},
            "prompts": {"type": "dict", "required": True, "options": _FOUR_STR},
            "tool": {"type": "dict", "required": True},
            "tool_choice": {"type": "str", "choices": ["named", "required"], "default": "named"},
            "max_tokens": {"type": "dict", "required": True, "options": _FOUR_INT, "no_log": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        sampling = sampling_from_generation_config(p["generation_config"], p["sampling"])
        requests = plan_requests(p["served_model_name"], sampling, p["prompts"], p["tool"], p["tool_choice"],
                                 p["max_tokens"])
    except VerifyError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, sampling=sampling, requests=requests,
                     tool_name=p["tool"]["function"]["name"])


if __name__ == "__main__":
    main()
