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
  - Reads the interface that carries the node's CX7 IP (with C(ip -j -4 addr show)) and the RDMA facts of that
    port from sysfs, the serve container (exists, running, its C(dgxspark.vllm.config_hash) label), the serve
    image's ID, the GPU's identity (C(nvidia-smi); null without it, as in the lab), the staged checkpoint's stamp,
    whether a staging lock is held and the memory size, with the docker CLI and the file system.
  - One module run instead of one per read and no fact gathering; the launch role calls it once per node, first,
    before it renders anything or decides whether to start anything.
  - Reads only. It never changes the node.
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  cx7_ip:
    description:
      - The node's CX7 IP. The interface that carries it is returned as RV(cx7_iface).
      - Without O(cx7_iface), the module fails when no interface carries it, naming the interfaces it found.
    type: str
  cx7_iface:
    description:
      - The CX7 interface, when the inventory names it (or a preflight in this run found it). It is returned as
        RV(cx7_iface) as given, and the lookup by IP is skipped.
    type: str
  rdma:
    description:
      - Whether to read the RDMA facts of the port that carries O(cx7_ip) from O(sysfs_root), as
        M(dgxspark.vllm.rdma_link_info) does; returned as RV(rdma). Needs O(cx7_ip).
    type: bool
    default: false
  sysfs_root:
    description: Root of the sysfs tree the RDMA facts are read from (a recorded tree in the lab).
    type: path
    default: /sys
  container:
    description: Name of the serve container. Not read when omitted (RV(container) is then null).
    type: str
  image:
    description: The serve image (as rendered); its ID on this node is returned as RV(image_id).
    type: str
  image_record_path:
    description:
      - The record the image role writes on each node (C(/var/lib/dgxspark/image.json), root-only - the digest its
        staging resolved); when given, it is returned as RV(image_record), and the repo digests of O(image) on this
        node as RV(image_repo_digests). The launch runs the digest every node holds.
    type: path
  stamp_path:
    description: The staged checkpoint's stamp file (C(.dgxspark-stamp.json)); returned as RV(stamp) when given.
    type: path
  lock_path:
    description: The staging lock; RV(staging_lock) says whether it exists when given.
    type: path
  kv_record_path:
    description: The cluster's copy of the KV record on the head (C(/var/lib/dgxspark/kv-calibration.json),
      root-only); returned as RV(kv_record) when given.
    type: path
  hf_staged:
    description:
      - Repositories staged in the hub cache layout (the EXL3 kit's checkpoint and drafter) to read, returned as
        RV(hf_staged). C(hub_dir) is the hub cache (C(<HF_HOME>/hub)); each of C(repos) a C(repo) (an empty one is
        skipped) and its C(revision).
    type: dict
    suboptions:
      hub_dir:
        description: The hub cache folder.
        type: path
        required: true
      repos:
        description: The repositories, each C(repo) and C(revision).
        type: list
        elements: dict
        required: true
  firewall_table:
    description:
      - The collection's nftables table (family and name, C(inet dgxspark)); when given, RV(firewall) says whether
        it is loaded (read with C(nft list table)).
    type: str
  trusted_folders:
    description:
      - Folders root trusts on this node, each by the variable that sets it (for example
        C(dgxspark_vllm_model_path) and C(dgxspark_vllm_cache_path), which the serve container mounts); when given,
        RV(folders) lists, for each folder with an unsafe existing level (a symlink, not a folder, not owned by root or
        the user the module runs as, writable by the group or others; a root-owned sticky folder such as C(/var/tmp)
        is accepted as an ancestor), the refusal naming that level and the fix. Missing levels are no problem.
    type: dict
  gpu:
    description: Whether to read the GPU's identity with C(nvidia-smi) (absent C(nvidia-smi) gives null).
    type: bool
    default: true
  name:
    description:
      - The node's inventory name. With it, the module also returns RV(node) (the node as the render takes it) and
        RV(identity) (its part of the KV calibration key).
    type: str
  head:
    description: Whether the node is the head (rank 0), for RV(node).
    type: bool
    default: false
  inventory:
    description:
      - What the inventory says about the node's CX7 port (C(cx7_iface), C(ib_hca), C(gid_index); empty or null
        when unset), as the resolved configuration lists it per node.
      - Each fact given here wins over O(detected) and over the sysfs read; an interface given here is used as
        O(cx7_iface) is.
    type: dict
    default: {}
  detected:
    description:
      - What a preflight in the same run detected (C(cx7_iface), C(ib_hca), C(gid_index)); used where the inventory
        gives nothing.
      - With a detected GID index, or both HCAs and GID index in O(inventory), O(rdma) reads nothing.
    type: dict
    default: {}
  api_url:
    description:
      - The head's API base URL (for example V(http://10.77.1.11:8000)). Given, the node asks it once for
        C(/v1/models) (no proxy) and returns the answer in RV(api); no retry, a refused connection is an answer.
    type: str
  api_key:
    description: "The API key, sent as C(Authorization: Bearer <key>)."
    type: str
  api_timeout:
    description: Seconds each GET may take.
    type: float
    default: 5
  api_metrics:
    description: With O(api_url), after a 200 also read C(/metrics) once and summarise it (C(metrics) in RV(api)).
    type: bool
    default: false
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
- name: Read the node's CX7 port, RDMA facts and serve state before the launch renders and decides
  dgxspark.vllm.vllm_node_state:
    cx7_ip: 192.168.100.10
    rdma: true
    container: vllm_glm53
    image: vllm-node:latest
    stamp_path: /var/tmp/models/glm-5.3-flash/.dgxspark-stamp.json
    lock_path: /run/dgxspark-staging.lock
  register: node_state
"""

RETURN = r"""
node:
  description:
    - The node as M(dgxspark.vllm.vllm_serve_spec) takes it, when O(name) is given. Each RDMA fact comes from
      O(inventory), else O(detected), else the sysfs read; a fact none of them gives is left out.
  returned: when O(name) is given
  type: dict
  sample: {name: spark-a, cx7_ip: 192.168.100.10, head: true, cx7_iface: enp1s0f0np0, ib_hca: "rocep1s0f0", gid_index: 3}
identity:
  description: The node's part of the KV calibration key (serve image ID, GPU name, driver, GPU memory, MemTotal).
  returned: when O(name) is given
  type: dict
  sample: {name: spark-a, image_id: "sha256:0123", hardware: {gpu_name: NVIDIA GB10, driver: "580.95",
           gpu_memory: "[N/A]", mem_total_bytes: 128000000000}}
cx7_iface:
  description: The interface that carries O(cx7_ip) (or O(cx7_iface) as given); null without O(cx7_ip).
  returned: always
  type: str
  sample: enp1s0f0np0
rdma:
  description:
    - The RDMA facts of the CX7 port, as M(dgxspark.vllm.rdma_link_info) returns them (C(ok), C(hca),
      C(ib_hca), C(gid_index), C(problems), ...); null unless O(rdma).
    - A sysfs tree that cannot be read gives C(ok=false) and C(msg) rather than a failure (preflight is where a
      missing RDMA device is diagnosed).
  returned: always
  type: dict
  sample: {ok: true, hca: rocep1s0f0, ib_hca: "rocep1s0f0,roceP2p1s0f0", gid_index: 3}
container:
  description: The serve container; C(config_hash) is its C(dgxspark.vllm.config_hash) label. Null when
    O(container) is omitted.
  returned: always
  type: dict
  sample: {exists: true, running: true, id: "4f1c...", exit_code: 0, config_hash: "9b2e...", started_at: "2026-12-01T07:05:12Z"}
image_id:
  description: The ID of O(image) on this node; null when the node does not hold it or O(image) is not given.
  returned: always
  type: str
  sample: sha256:4f1c0d...
image_repo_digests:
  description: The repo digests (C(repo@sha256:...)) of O(image) on this node; null without O(image_record_path).
  returned: always
  type: list
  elements: str
  sample: ["ghcr.io/dgxspark-lab/vllm-openai-cpu@sha256:0123..."]
image_record:
  description:
    - The image role's record on this node (C(format), C(image), C(reference), C(digest), C(source), C(image_id));
      null without O(image_record_path), or when the file is absent or not a record.
  returned: always
  type: dict
  sample: {image: "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0", digest: "sha256:0123...", source: head}
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
hf_staged:
  description:
    - Per repository of O(hf_staged), the commit its C(refs/<revision>) names (the revision itself when it is a commit
      id; null when the ref is missing) and whether that snapshot carries the staging's stamp (C(staged)). Empty
      when O(hf_staged) is not given.
  returned: always
  type: list
  elements: dict
  sample: [{repo: brandonmusic/GLM-5.3-Flash-tr3-4bpw, revision: main, commit: 5d3f..., staged: true,
            stamp_path: /root/.cache/huggingface/hub/models--brandonmusic--GLM-5.3-Flash-tr3-4bpw/snapshots/5d3f.../.dgxspark-stamp.json}]
kv_record:
  description: The text of O(kv_record_path) (at most 4 MiB); null when it is not given, absent or unreadable.
  returned: always
  type: str
staging_lock:
  description: Whether O(lock_path) exists; null when not given.
  returned: always
  type: bool
  sample: false
folders:
  description: The refusals of the unsafe folders of O(trusted_folders) (empty when every one is safe); null when not given.
  returned: always
  type: list
  elements: str
  sample: []
firewall:
  description: Whether O(firewall_table) is loaded (C(present)) and, when it is not, why; null when not given.
  returned: always
  type: dict
  sample: {present: true, why: ""}
mem_total_mb:
  description: MemTotal from C(/proc/meminfo) in MiB, rounded down as the C(memtotal_mb) fact (null if unreadable).
  returned: always
  type: int
  sample: 124546
api:
  description:
    - The API's answer from this node (null without O(api_url)) - C(url), C(status) (-1 without an HTTP answer),
      C(ok), C(msg), C(metrics) (vllm_metrics_info's figures from one read with O(api_metrics), else null) and
      C(metrics_msg) (why they are null after a 200).
  returned: always
  type: dict
  sample: {url: "http://10.77.1.11:8000/v1/models", status: 200, ok: true, msg: HTTP 200, metrics: null,
           metrics_msg: null}
"""

import functools
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._api_probe import probe
from ansible_collections.dgxspark.vllm.plugins.module_utils._http import get

from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import (
    NodeStateError, chosen_iface, describe, hf_staged, identity, interface_with_ip, no_interface_message,
    parse_ipv4_addresses, read_state, wants_rdma)
from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import parse_image_record, parse_repo_digests
from ansible_collections.dgxspark.vllm.plugins.module_utils._rdma import RdmaError, resolve_link
from ansible_collections.dgxspark.vllm.plugins.module_utils._safe_paths import folder_problems


def _read_text(path: str, limit: int = 65536):
    """A small file's text, None when it is absent or unreadable (a record the launch can do without)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(limit)
    except (OSError, UnicodeDecodeError):
        return None


def _read_meminfo() -> str:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return ""


def _cx7_iface(module: AnsibleModule, cx7_ip: str) -> str:
    """The interface that carries cx7_ip (fails with the fix when none does)."""
    ip_bin = module.get_bin_path("ip")
    if ip_bin is None:
        module.fail_json(msg="iproute2's ip is not installed on this node, so the interface that carries the CX7 IP "
                             "%s cannot be found: install iproute2 or set dgxspark_vllm_cx7_iface" % cx7_ip)
    rc, out, err = module.run_command([ip_bin, "-j", "-4", "addr", "show"])
    if rc != 0:
        module.fail_json(msg="ip -j -4 addr show failed on this node: %s" % (" ".join(err.split()) or rc))
    try:
        addresses = parse_ipv4_addresses(out)
        found = interface_with_ip(addresses, cx7_ip)
    except NodeStateError as exc:
        module.fail_json(msg=str(exc))
    if found is None:
        module.fail_json(msg=no_interface_message(cx7_ip, addresses), ipv4_interfaces=addresses)
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cx7_ip": {"type": "str"},
            "cx7_iface": {"type": "str"},
            "rdma": {"type": "bool", "default": False},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "container": {"type": "str"},
            "image": {"type": "str"},
            "image_record_path": {"type": "path"},
            "stamp_path": {"type": "path"},
            "lock_path": {"type": "path"},
            "kv_record_path": {"type": "path"},
            "hf_staged": {"type": "dict", "options": {
                "hub_dir": {"type": "path", "required": True},
                "repos": {"type": "list", "elements": "dict", "required": True},
            }},
            "firewall_table": {"type": "str"},
            "trusted_folders": {"type": "dict"},
            "gpu": {"type": "bool", "default": True},
            "name": {"type": "str"},
            "head": {"type": "bool", "default": False},
            "inventory": {"type": "dict", "default": {}},
            "detected": {"type": "dict", "default": {}},
            "api_url": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "api_timeout": {"type": "float", "default": 5},
            "api_metrics": {"type": "bool", "default": False},
        },
        required_if=[("rdma", True, ("cx7_ip",))],
        supports_check_mode=True,
    )
    p = module.params
    cx7_iface = p["cx7_iface"] or chosen_iface(p["inventory"], p["detected"])
    if p["cx7_ip"] and cx7_iface is None:
        cx7_iface = _cx7_iface(module, p["cx7_ip"])
    rdma = None
    if p["rdma"] and wants_rdma(p["inventory"], p["detected"]):
        try:
            rdma = resolve_link(p["cx7_ip"], cx7_iface, p["sysfs_root"]).to_dict()
        except RdmaError as exc:
            rdma = {"ok": False, "msg": str(exc)}
    stamp_text = None
    if p["stamp_path"] and os.path.exists(p["stamp_path"]):
        try:
            with open(p["stamp_path"], encoding="utf-8") as handle:
                stamp_text = handle.read()
        except OSError as exc:
            module.fail_json(msg="cannot read the stamp %s: %s" % (p["stamp_path"], exc))
    try:
        state = read_state(module.run_command, module.get_bin_path("docker"), p["container"], p["image"],
                           module.get_bin_path("nvidia-smi") if p["gpu"] else None,
                           stamp_text, p["stamp_path"],
                           os.path.lexists(p["lock_path"]) if p["lock_path"] else None,
                           _read_meminfo(), p["firewall_table"],
                           module.get_bin_path("nft", opt_dirs=["/usr/sbin", "/sbin"]) if p["firewall_table"] else None)
    except NodeStateError as exc:
        module.fail_json(msg=str(exc))
    state["image_record"] = state["image_repo_digests"] = None
    if p["image_record_path"]:
        state["image_record"] = parse_image_record(_read_text(p["image_record_path"]))
        docker = module.get_bin_path("docker")
        if p["image"] and docker and state["image_id"]:
            rc, out, _err = module.run_command([docker, "image", "inspect", "--format", "{{json .RepoDigests}}",
                                                p["image"]])
            state["image_repo_digests"] = parse_repo_digests(rc, out)
        else:
            state["image_repo_digests"] = []
    described = {}
    if p["name"]:
        described = {"node": describe(p["name"], p["cx7_ip"], p["head"], cx7_iface, p["inventory"], p["detected"], rdma),
                     "identity": identity(p["name"], state)}
    api = None
    if p["api_url"]:
        api = probe(functools.partial(get, timeout=p["api_timeout"]), p["api_url"], p["api_key"] or None, p["api_metrics"])
    staged = []
    if p["hf_staged"]:
        staged = hf_staged(p["hf_staged"]["hub_dir"], p["hf_staged"]["repos"], _read_text, os.path.isfile)
    folders = None
    if p["trusted_folders"] is not None:
        folders = folder_problems({str(k): str(v or "") for k, v in p["trusted_folders"].items()}, {0, os.geteuid()})
    kv_record = _read_text(p["kv_record_path"], 4 << 20) if p["kv_record_path"] else None
    module.exit_json(changed=False, cx7_iface=cx7_iface, rdma=rdma, api=api, folders=folders, hf_staged=staged,
                     kv_record=kv_record, **state, **described)


if __name__ == "__main__":
    main()
