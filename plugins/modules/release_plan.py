#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_plan
short_description: Decide what a run is against the serving release, and the way back to a known-good one
version_added: 0.1.0
description:
  - The decisions of the role C(dgxspark.vllm.upgrade) in one place, by O(mode).
  - V(plan) (before anything is stopped) - a first start (no release recorded), no change (the configuration asks for
    the serving release), or an upgrade from the serving release (its image, model repository or revision, profile
    settings or KV value differ), with the last known-good release a failed upgrade rolls back to; RV(plan).
  - V(failure) - after a failed launch or verify (O(step), O(diagnosis)) what follows; RV(decision) C(action) is
    C(rollback) (to the last known-good), C(stop) (C(dgxspark_vllm_upgrade_rollback=false) - left stopped) or
    C(fail) (not an upgrade, or nothing known-good - the failure as it is).
  - V(rollback) - the recorded release O(release) names (its id or a unique start of it), refused unless it is
    still staged on every node of O(nodes) (its image by ID or digest, its checkpoint commit by the stamp), naming
    each missing part; RV(pin) is what the configuration step then serves (the fact C(upgrade_release_pin)).
  - V(outcome) - the closing message of a rolled-back run, with the seconds from the failure found to serving again
    and the ratio to the relaunch's own group start.
  - V(prune) - the retention choice after a known-good. Without O(nodes), RV(images) names the images the history
    records (to inspect on every node). With O(nodes), RV(prune) says per node which parked checkpoint commits and
    which recorded images no release among the newest C(upgrade_keep_staged) of O(config) needs (never the serving
    release's nor the last known-good's; nothing while the serving release is not the last known-good), with the
    bytes each frees.
  - V(disk) - before an upgrade's staging stops anything, the disk for the new image and commit next to the
    known-good's. Without O(nodes), RV(url) is the hub's model info of the configured revision (at O(endpoint)). With
    O(nodes) and O(model_info), each node's need (the image's compressed layer bytes when the node lacks it, the
    commit's bytes unless it is staged at or beside the model path) against the free bytes of each filesystem; a node
    short of room is refused, naming the bytes needed and free.
  - Runs on the controller only (an action plugin); it never connects to a node.
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
  - dgxspark.vllm.attributes.pure
options:
  mode:
    description: The decision to make.
    type: str
    required: true
    choices: [plan, failure, rollback, outcome, prune, disk]
  history:
    description: The head's release history (the C(history) M(dgxspark.vllm.release_history) returns).
      With O(mode=plan) and O(mode=rollback).
    type: dict
  config:
    description: The resolved configuration, C(dgxspark_vllm_config). With O(mode=plan), O(mode=rollback) and
      O(mode=prune).
    type: dict
  record:
    description: The head's image record (its JSON text or a mapping; empty when absent). With O(mode=plan).
    type: raw
  running:
    description: Whether the head's serve container runs now (unset - not read). With O(mode=plan).
    type: bool
  plan:
    description: This run's RV(plan). With O(mode=failure).
    type: dict
  step:
    description: The step that failed (C(launch), C(verify)). With O(mode=failure).
    type: str
    default: launch
  diagnosis:
    description: The failed step's message. With O(mode=failure).
    type: str
    default: ""
  release:
    description: The release to go back to, its id or a unique start of it. With O(mode=rollback).
    type: str
    default: ""
  nodes:
    description:
      - With O(mode=rollback), per node, C(images) (what C(docker image inspect) of the release's image found -
        C(Id), C(RepoDigests)), C(stamp) (the checkpoint stamp at the model path, its JSON text or mapping; empty when
        absent), C(parked) (the stamp of the release's commit parked beside the model path; empty when absent) and
        C(lock) (the staging lock's text; empty when no staging runs).
      - With O(mode=disk), per node, C(image_present), C(manifest) (C(docker manifest inspect --verbose) of the
        image), C(architecture) (C(docker info)'s), C(selected) and C(parked)
        (M(dgxspark.vllm.checkpoint_store)'s listing) and C(model_df) / C(docker_df) (C(df -B1
        --output=source,avail,target) of the model path and of Docker's data root).
      - With O(mode=prune), per node, C(parked) (the RV(dgxspark.vllm.checkpoint_store#module:parked) listing) and
        C(images) (what C(docker image inspect) of RV(images) found - C(Id), C(RepoDigests), C(Size)).
    type: dict
  endpoint:
    description: The hub (C(checkpoint_hf_endpoint)); empty - huggingface.co. With O(mode=disk).
    type: str
    default: ""
  model_info:
    description: The hub's model info of the configured revision with every file's size (RV(url)'s answer). With
      O(mode=disk) and O(nodes).
    type: dict
  decision:
    description: The RV(decision) of O(mode=failure). With O(mode=outcome).
    type: dict
  serving:
    description: The release recorded as serving after the rollback's verify. With O(mode=outcome).
    type: str
    default: ""
  found_at:
    description: When the failure was found (seconds since the epoch). With O(mode=outcome).
    type: float
    default: 0.0
  launch_started_at:
    description: When the rollback's launch began. With O(mode=outcome).
    type: float
    default: 0.0
  served_at:
    description: When the rollback's launch had the group serving. With O(mode=outcome).
    type: float
    default: 0.0
"""

EXAMPLES = r"""
- name: Decide what this run is, before anything is stopped
  dgxspark.vllm.release_plan:
    mode: plan
    history: "{{ upgrade_history.history }}"
    config: "{{ dgxspark_vllm_config }}"
    record: "{{ upgrade_record.content | default('') | b64decode }}"
    running: true
  register: upgrade_plan_result

- name: Check release 3f2a9c1e0b7d is still staged and pin it
  dgxspark.vllm.release_plan:
    mode: rollback
    release: 3f2a9c1e0b7d
    history: "{{ upgrade_history.history }}"
    config: "{{ dgxspark_vllm_config }}"
    nodes:
      spark-a: {images: [{Id: "sha256:aa...", RepoDigests: ["ghcr.io/org/img@sha256:bb..."]}], stamp: '{"repo": ...}'}
"""

RETURN = r"""
plan:
  description: What the run is - C(kind) (first_start, no_change, upgrade), C(from) (the serving release's id),
    C(known_good) (the last known-good release), C(changes) (each difference in a sentence), C(stage) (an image or
    model change - the staging pulls or downloads), C(rollback) (a failure rolls back), C(wanted), C(message).
  returned: mode is plan
  type: dict
  sample: {kind: upgrade, from: 3f2a9c1e0b7d, changes: ["image ghcr.io/org/img:v2 (serving ghcr.io/org/img:v1 ...)"]}
decision:
  description: C(action) (rollback, stop, fail), C(target) (the known-good release), C(message).
  returned: mode is failure
  type: dict
release:
  description: The recorded release the rollback goes to.
  returned: mode is rollback
  type: dict
swap:
  description: The nodes whose model path holds another commit while the release's is parked beside it (brought
    back once the group stopped).
  returned: mode is rollback
  type: list
  elements: str
url:
  description: The hub's model info of the configured repository and revision, with every file's size.
  returned: mode is disk, without nodes
  type: str
lines:
  description: Per node, what the upgrade's staging needs there.
  returned: mode is disk, with nodes
  type: list
  elements: str
unknown:
  description: The nodes whose registry gave no size for the new image (counted as 0).
  returned: mode is disk, with nodes
  type: list
  elements: str
images:
  description: The images the history's releases record, as references to inspect (by digest, else by image ID).
  returned: mode is prune, without nodes
  type: list
  elements: str
prune:
  description: Per node, C(checkpoints) (parked commits to remove, each with its C(commit) and C(bytes)), C(images)
    (recorded images to remove - C(id), C(digests), C(bytes)), C(bytes) (the total), C(kept) (the releases kept) and
    a C(message).
  returned: mode is prune, with nodes
  type: dict
bytes:
  description: The bytes RV(prune) frees on all nodes.
  returned: mode is prune, with nodes
  type: int
pin:
  description: The release as the configuration step serves it - C(id), C(image) (by digest), C(model_repo),
    C(model_revision) (the commit), C(profile), C(settings), C(kv_cache_memory_bytes), and C(image_record), the record
    each node gets back.
  returned: mode is rollback
  type: dict
message:
  description: The closing message of a rolled-back run.
  returned: mode is outcome
  type: str
seconds:
  description: Seconds from the failure found to the known-good serving again.
  returned: mode is outcome
  type: float
start_seconds:
  description: Seconds of the rollback's own group start (from its launch to serving).
  returned: mode is outcome
  type: float
ratio:
  description: RV(seconds) over RV(start_seconds) (null when the start took no time).
  returned: mode is outcome
  type: float
msg:
  description: The decision in a sentence.
  returned: always
  type: str
"""

from ansible_collections.dgxspark.vllm.plugins.module_utils._controller_only import refuse
from ansible_collections.dgxspark.vllm.plugins.module_utils._upgrade import ARGUMENT_SPEC


def main() -> None:
    refuse("release_plan", ARGUMENT_SPEC)


if __name__ == "__main__":
    main()
