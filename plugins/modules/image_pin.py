#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_pin
short_description: Decide the one image reference every node pulls (the tag resolved to its digest once)
version_added: 0.3.0
description:
  - The decision of the role C(dgxspark.vllm.image) in one place - a digest in O(image) wins, then O(image_digest),
    else the digest the head's pull of the tag resolved (its image's repo digests for the image's repository). Every
    node then pulls C(repo@sha256:...), so all of them hold one build, whatever the tag points at later.
  - An image without a repo digest on the head (built or loaded locally) keeps its tag; the role compares the nodes'
    image IDs as before.
  - Returns the record each node keeps (root-only, read by the launch when it runs alone).
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Computes only; the result is the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is nothing to diff.
  idempotent:
    support: full
    details: The same inputs always give the same reference, and nothing is ever changed.
options:
  image:
    description: The configured image, C(dgxspark_vllm_config.image) (a tag, or a reference with C(@sha256:)).
    type: str
    required: true
  image_digest:
    description: The image role's C(image_digest) (C(sha256:...)); empty when unset.
    type: str
    default: ""
  head_repo_digests:
    description: The repo digests of the image the head holds after its pull of the tag (C(RepoDigests)).
    type: list
    elements: str
    default: []
  head:
    description: The head's inventory name, for the messages.
    type: str
    default: the head
"""

EXAMPLES = r"""
- name: Decide the reference every node pulls
  dgxspark.vllm.image_pin:
    image: "{{ dgxspark_vllm_config.image }}"
    image_digest: "{{ image_digest }}"
    head_repo_digests: "{{ (hostvars[dgxspark_vllm_config.head].head_image.images | first).RepoDigests }}"
    head: "{{ dgxspark_vllm_config.head }}"
  run_once: true
  register: image_pin
"""

RETURN = r"""
reference:
  description: What every node pulls and the launch runs - C(repo@sha256:...), or the tag when nothing resolves it.
  returned: success
  type: str
  sample: ghcr.io/dgxspark-lab/vllm-openai-cpu@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
digest:
  description: The digest (C(sha256:...)); empty when the image has none.
  returned: success
  type: str
  sample: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
source:
  description: Where the digest came from - C(configured), C(image_digest), C(head) (the head's pull of the tag), C(none).
  returned: success
  type: str
  sample: head
message:
  description: One line for the report, with the pin to set when the configuration names a tag.
  returned: success
  type: str
  sample: "ghcr.io/org/image:v1 resolved on spark-a to sha256:0123...: every node pulls ghcr.io/org/image@sha256:0123..."
record:
  description: The record each node keeps (C(format), C(image), C(reference), C(digest), C(source), C(image_id) empty -
    the role fills in each node's image ID).
  returned: success
  type: dict
  sample: {format: 1, image: "ghcr.io/org/image:v1", reference: "ghcr.io/org/image@sha256:0123...", digest: "sha256:0123...",
           source: head, image_id: ""}
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import ARGUMENT_SPEC


def main() -> None:
    refuse("image_pin", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
