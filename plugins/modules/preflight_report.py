#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_report
short_description: Decide the DGX Spark preflight checks from the raw probe results of every node
version_added: 0.1.0
description:
  - A pure decision step. It reads nothing and changes nothing where it runs; the M(dgxspark.vllm.rdma_link_info)
    module and read-only commands (C(ip -j addr show), C(ss -Hltnp), C(df), C(docker info), C(docker inspect),
    C(docker top), C(nvidia-smi), C(ping)) gather the raw results on the nodes, and this module turns them into
    checks, each with a status (C(pass), C(fail), C(warn), C(skipped)), the evidence and the fix.
  - Checks are decided only for the probes a node carries, so a first call with the C(ip_addr) probes alone
    already returns each node's CX7 interface (the role pings from it), and a second call with every probe
    returns the full report.
  - Cross-node checks (the CX7 MTU must be the same on every node) need every node in one call; the role runs
    this module once, on the controller.
  - Takes all nodes at once, rather than being a filter, so that its input and output are declared and
    validated here and the same code runs in C(--check).
author:
  - dgxspark.vllm contributors (@dgxspark)
options:
  nodes:
    description:
      - One dict per node. Keys C(name) (inventory name, required), C(role) (C(head) or C(worker)), C(cx7_ip),
        and the inventory pins C(cx7_iface), C(ib_hca), C(gid_index) (empty or null when unset).
      - Probe keys, each optional. Command results are dicts with C(rc), C(stdout), C(stderr), C(msg) as the
        command module registers them. C(ip_addr) (the stdout of C(ip -j addr show)); C(pings) (the loop results of
        C(ping -I IFACE -c 2 -W 2 PEER_IP) as registered, the peer from C(item) or C(target), its IP from the
        command's last argument or C(ip)); C(rdma) (the registered result of
        M(dgxspark.vllm.rdma_link_info)); C(listeners) (C(ss -Hltnp)); C(own_pids) (C(docker top CONTAINER -eo
        pid)); C(disk) (the role's disk probe); C(meminfo) (the text of /proc/meminfo); C(docker_info)
        (C(docker info --format '{{json .}}')); C(containers) (C(docker inspect) of the running containers);
        C(gpu) (C(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader));
        C(compute_apps) (C(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader));
        C(arch) (C(uname -m)); C(secret_files) (the preflight role's read-only C(stat) of every path in
        C(preflight_secret_paths), the script C(SECRET_FILES_PROBE) of C(module_utils/_preflight.py)).
    type: list
    elements: dict
    required: true
  cx7_subnet:
    description: The CX7 link's subnet in CIDR form (C(dgxspark_vllm_cx7_subnet)).
    type: str
    default: ""
  api_port:
    description: The serve's API port (C(dgxspark_vllm_port)).
    type: int
    default: 8000
  master_port:
    description: The torch distributed master port (C(dgxspark_vllm_master_port)).
    type: int
    default: 29521
  container_name:
    description: The serve container (C(dgxspark_vllm_container_name)); ports and the GPU it holds are ours.
    type: str
    default: vllm_glm53
  model_path:
    description: Where the checkpoint goes (C(dgxspark_vllm_model_path)); used in messages.
    type: str
    default: ""
  checkpoint_size_bytes:
    description: Size of the checkpoint on disk; what is already under O(model_path) counts against it.
    type: int
    default: 185000000000
  disk_margin_bytes:
    description: Free bytes to keep on top of the checkpoint.
    type: int
    default: 20000000000
  mem_available_floor_bytes:
    description: MemAvailable below this fails.
    type: int
    default: 110000000000
  lab:
    description:
      - The local lab (C(dgxspark_vllm_lab)). GPU, GPU runtime and architecture checks are then reported as
        C(skipped), with the reason.
    type: bool
    default: false
  rdma_skip:
    description:
      - The RDMA check was not run (C(preflight_rdma_skip)); reported as C(skipped). Only allowed with O(lab).
    type: bool
    default: false
  expected_gpu:
    description: Substring every GPU name must contain; other GPUs warn.
    type: str
    default: GB10
  expected_arch:
    description: Expected C(uname -m); other architectures warn.
    type: str
    default: aarch64
  min_mtu:
    description: A CX7 MTU below this warns (a mismatch across nodes fails).
    type: int
    default: 9000
  exposure:
    description:
      - Who can reach the API, from the C(dgxspark_vllm_config) fact. When given, the cluster-wide C(api_exposure)
        check is decided once and reported on the head (the node whose C(role) is C(head), else the first node).
      - An API on loopback passes; beyond loopback it passes with an API key, warns without one, and fails without
        one when O(exposure.require_api_key) is true. The message names the firewall's allowed networks, or says the
        firewall is off.
    type: dict
    suboptions:
      host:
        description:
          - The address the API listens on (C(settings.host)); empty is vLLM's default, every interface.
          - Ignored for O(exposure.launcher=exl3_kit), whose C(start.sh) always binds C(0.0.0.0).
        type: str
        default: ""
      host_source:
        description: Where the host came from (C(dgxspark_vllm_config.sources.host)), for the message.
        type: str
        default: ""
      launcher:
        description: The profile's launcher (C(dgxspark_vllm_config.launcher)).
        type: str
        choices: [docker_run, exl3_kit]
        default: docker_run
      api_key_set:
        description: Whether C(dgxspark_vllm_api_key) is set (never the key itself).
        type: bool
        default: false
      require_api_key:
        description: C(dgxspark_vllm_require_api_key); an API beyond loopback without a key then fails instead of warning.
        type: bool
        default: false
      firewall:
        description: C(dgxspark_vllm_firewall), whether the collection's firewall limits the API port.
        type: bool
        default: true
      api_allowed_cidrs:
        description:
          - C(dgxspark_vllm_api_allowed_cidrs), the networks the firewall admits to the API port; empty means the
            nodes' management networks.
        type: list
        elements: str
        default: []
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Computes from its arguments only; runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    details: Never changes anything; always reports no change.
notes:
  - The module fails only on unusable input (no nodes, repeated names, negative sizes, O(rdma_skip) outside
    the lab). Failed checks are returned in RV(failures), with RV(ok) false; the caller decides to fail.
seealso:
  - module: dgxspark.vllm.rdma_link_info
"""

EXAMPLES = r"""
- name: Decide the checks of every node, on the controller
  dgxspark.vllm.preflight_report:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'preflight_probe') | list }}"
    cx7_subnet: "{{ dgxspark_vllm_cx7_subnet }}"
    api_port: "{{ dgxspark_vllm_port }}"
    master_port: "{{ dgxspark_vllm_master_port }}"
    lab: "{{ dgxspark_vllm_lab }}"
    exposure:
      host: "{{ dgxspark_vllm_config.settings.host | default('') }}"
      launcher: "{{ dgxspark_vllm_config.launcher }}"
      api_key_set: "{{ dgxspark_vllm_config.api_key_set }}"
      require_api_key: "{{ dgxspark_vllm_config.require_api_key }}"
      firewall: "{{ dgxspark_vllm_config.firewall }}"
      api_allowed_cidrs: "{{ dgxspark_vllm_config.api_allowed_cidrs }}"
  delegate_to: localhost
  run_once: true
  become: false
  register: preflight

- name: Fail with every failed check and its fix
  ansible.builtin.fail:
    msg: "{{ preflight.message }}"
  when: not preflight.ok
  run_once: true

- name: Only the CX7 interface of one node, from `ip -j addr show`
  dgxspark.vllm.preflight_report:
    nodes:
      - name: spark-a
        cx7_ip: 198.51.100.1
        ip_addr: "{{ ip_addr.stdout }}"
    cx7_subnet: 198.51.100.0/24
  register: link
"""

RETURN = r"""
ok:
  description: True when no check on any node failed.
  returned: always
  type: bool
  sample: false
reports:
  description:
    - One report per node, by name, as the role writes it to C(<node>.json). C(checks) lists C(name), C(status)
      (pass, fail, warn, skipped), C(evidence), C(fix) (empty for a pass) and C(data) (the numbers behind the
      evidence). C(detected) holds what the node shows, C(configured) the inventory pins, C(effective) the
      pin when set, else the detected value.
  returned: always
  type: dict
  sample:
    lab-head:
      schema: 1
      node: lab-head
      role: head
      ok: false
      counts: {pass: 11, fail: 1, warn: 0, skipped: 3}
      detected: {cx7_iface: enp1s0f1np1, ib_hca: "rocep1s0f1,roceP2p1s0f1", gid_index: 3}
      configured: {cx7_iface: "", ib_hca: "", gid_index: null}
      effective: {cx7_iface: enp1s0f1np1, ib_hca: "rocep1s0f1,roceP2p1s0f1", gid_index: 3}
      checks:
        - name: port.8000
          status: fail
          evidence: "Port 8000 (API port, dgxspark_vllm_port) is held by python3 (pid 812) on 0.0.0.0:8000, not by the serve container vllm_glm53."
          fix: "Stop that process (`ss -ltnp 'sport = :8000'` shows it, `systemctl status <pid>` names its unit) or set dgxspark_vllm_port to a free port."
          data: {port: 8000, holders: [{process: python3, pid: 812, ours: false}]}
detected:
  description: Per node, the detected CX7 interface, C(NCCL_IB_HCA) list and RoCE v2 GID index (null when unknown).
  returned: always
  type: dict
  sample:
    lab-head: {cx7_iface: enp1s0f1np1, ib_hca: "rocep1s0f1,roceP2p1s0f1", gid_index: 3}
    lab-worker: {cx7_iface: enP2p1s0f1np1, ib_hca: "rocep1s0f1,roceP2p1s0f1", gid_index: 4}
failures:
  description: Every failed check on every node.
  returned: always
  type: list
  elements: dict
  sample:
    - node: lab-head
      name: ping.lab-worker
      evidence: "`ping -I enp1s0f1np1 -c 2 -W 2 10.77.1.99` (lab-worker's CX7 IP): 2 packets transmitted, 0 received, +2 errors, 100% packet loss, time 1010ms."
      fix: "Check lab-worker's dgxspark_vllm_cx7_ip (10.77.1.99) against the address on its CX7 interface, ..."
summary:
  description: A readable summary, one line per check and node, with the fix of every failure and warning.
  returned: always
  type: str
  sample: "preflight: 2 node(s), 24 passed, 0 failed, 0 warnings, 6 skipped\n..."
message:
  description: Every failed check on every node with its fix, for a failure message; empty when RV(ok).
  returned: always
  type: str
  sample: "Preflight failed: 1 check(s) on 1 node(s) (lab-head). Nothing was pulled, staged or started.\n- lab-head port.8000: ..."
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._preflight import (
    Exposure,
    PreflightError,
    Settings,
    evaluate,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nodes": {"type": "list", "elements": "dict", "required": True},
            "cx7_subnet": {"type": "str", "default": ""},
            "api_port": {"type": "int", "default": 8000},
            "master_port": {"type": "int", "default": 29521},
            "container_name": {"type": "str", "default": "vllm_glm53"},
            "model_path": {"type": "str", "default": ""},
            "checkpoint_size_bytes": {"type": "int", "default": 185000000000},
            "disk_margin_bytes": {"type": "int", "default": 20000000000},
            "mem_available_floor_bytes": {"type": "int", "default": 110000000000},
            "lab": {"type": "bool", "default": False},
            "rdma_skip": {"type": "bool", "default": False},
            "expected_gpu": {"type": "str", "default": "GB10"},
            "expected_arch": {"type": "str", "default": "aarch64"},
            "min_mtu": {"type": "int", "default": 9000},
            "exposure": {"type": "dict", "options": {
                "host": {"type": "str", "default": ""},
                "host_source": {"type": "str", "default": ""},
                "launcher": {"type": "str", "choices": ["docker_run", "exl3_kit"], "default": "docker_run"},
                "api_key_set": {"type": "bool", "default": False},
                "require_api_key": {"type": "bool", "default": False},
                "firewall": {"type": "bool", "default": True},
                "api_allowed_cidrs": {"type": "list", "elements": "str", "default": []},
            }},
        },
        supports_check_mode=True,
    )
    params = module.params
    settings = Settings(**{key: params[key] for key in (
        "cx7_subnet", "api_port", "master_port", "container_name", "model_path", "checkpoint_size_bytes",
        "disk_margin_bytes", "mem_available_floor_bytes", "lab", "rdma_skip", "expected_gpu", "expected_arch",
        "min_mtu")})
    given = params["exposure"]
    exposure = None if given is None else Exposure(
        **dict(given, api_allowed_cidrs=tuple(given["api_allowed_cidrs"] or ())))
    try:
        result = evaluate(params["nodes"], settings, exposure)
    except PreflightError as exc:
        module.fail_json(msg="preflight_report: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
