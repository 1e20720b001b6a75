#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_link_info
short_description: Find the RoCE GID index, HCAs and interface NCCL needs on a DGX Spark's ConnectX-7 link
version_added: 0.1.0
description:
  - Reads the node's sysfs (C(class/infiniband) and C(class/net)) and finds the ConnectX-7 (CX7) port whose
    netdev carries O(cx7_ip). The kernel adds an IPv4-mapped RoCE v2 GID for every IPv4 address on a RoCE
    netdev; the index of that GID is the node's C(NCCL_IB_GID_INDEX). It is not a constant 3 and it
    differs between nodes, so it is read per node.
  - Returns the HCAs for C(NCCL_IB_HCA), the interface for C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME),
    its MTU and speed, the HCAs with their GID tables, and a list of problems, each with a fix.
  - "Rule for C(NCCL_IB_HCA): on a DGX Spark each physical CX7 port shows up as two HCAs, one per PCIe x4
    link, in PCI domains 0000 and 0002 (for example C(rocep1s0f1) and C(roceP2p1s0f1)). The list holds the
    HCA that carries O(cx7_ip) plus each such twin (same PCI bus, device and function, other domain) whose
    port is Ethernet, ACTIVE and LinkUp, whose netdev is up, and whose RoCE v2 IPv4 GID sits at the same
    index. A twin that fails any of these is left out with a warning (NCCL then gets about half the link).
    Other HCAs are never added: sysfs has no prefix lengths to decide a shared subnet."
  - Missing devices, a down port or an absent GID are reported in RV(problems), not as a failure; the
    module fails only when O(sysfs_root) is not a sysfs tree or O(cx7_ip) is not an IPv4 address.
author:
  - dgxspark.vllm maintainers (!UNKNOWN)
options:
  sysfs_root:
    description:
      - Where sysfs is mounted. Tests and the lab point this at a recorded tree.
    type: path
    default: /sys
  cx7_ip:
    description:
      - This node's IPv4 address on the CX7 link (the recipe's C(VLLM_HOST_IP)), without a prefix length.
    type: str
    required: true
  cx7_iface:
    description:
      - The interface the inventory or the facts expect for O(cx7_ip). When given and the address is found
        on another interface, that is reported as a C(cx7_iface) problem.
    type: str
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Only reads sysfs; runs the same in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
  idempotent:
    support: full
    details: Never changes anything; always reports no change.
notes:
  - Speed and MTU below 200000 Mb/s and 9000 are warnings; RV(ok) is false only for errors.
seealso:
  - name: NCCL environment variables
    description: C(NCCL_IB_HCA), C(NCCL_IB_GID_INDEX), C(NCCL_SOCKET_IFNAME).
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
"""

EXAMPLES = r"""
- name: Read this node's CX7 link
  dgxspark.vllm.rdma_link_info:
    cx7_ip: "{{ dgxspark_vllm_cx7_ip }}"
    cx7_iface: "{{ dgxspark_vllm_cx7_iface | default(omit) }}"
  register: rdma

- name: Stop when the link is not usable
  ansible.builtin.assert:
    that: rdma.ok
    fail_msg: "{{ rdma.problems | selectattr('severity', 'eq', 'error') | map(attribute='fix') | list }}"

- name: Use the per-node values
  ansible.builtin.set_fact:
    dgxspark_vllm_nccl_env:
      NCCL_IB_HCA: "{{ rdma.ib_hca }}"
      NCCL_IB_GID_INDEX: "{{ rdma.gid_index | string }}"
      NCCL_SOCKET_IFNAME: "{{ rdma.socket_ifname }}"
      GLOO_SOCKET_IFNAME: "{{ rdma.socket_ifname }}"

- name: Check a recorded sysfs tree instead of the live one
  dgxspark.vllm.rdma_link_info:
    sysfs_root: /srv/fixtures/sysfs/lab_head
    cx7_ip: 10.77.1.11
"""

RETURN = r"""
hcas:
  description:
    - Every RDMA device under C(class/infiniband), in PCI address order, with its ports. A port lists only
      the used entries of its GID table (all-zero entries are left out).
  returned: always
  type: list
  elements: dict
  sample:
    - name: rocep1s0f1
      node_guid: "946d:ae03:004a:0b61"
      fw_ver: "28.45.1200"
      board_id: NVD0000000087
      hca_type: MT4129
      pci_address: "0000:01:00.1"
      netdevs: [enp1s0f1np1]
      ports:
        - port: 1
          state: ACTIVE
          phys_state: LinkUp
          link_layer: Ethernet
          rate: 200 Gb/sec (2X NDR)
          rate_gbps: 200.0
          netdev: enp1s0f1np1
          gids:
            - index: 3
              gid: "0000:0000:0000:0000:0000:ffff:0a4d:010b"
              type: RoCE v2
              ndev: enp1s0f1np1
              ipv4: 10.77.1.11
netdevs:
  description:
    - The netdevs behind the RDMA devices (and O(cx7_iface) when given), by name.
    - C(speed_mbps) is null when the kernel reports the speed unknown (link down) or cannot read it.
  returned: always
  type: dict
  sample:
    enp1s0f1np1:
      name: enp1s0f1np1
      operstate: up
      mtu: 9000
      speed_mbps: 200000
      address: "94:6d:ae:4a:0b:61"
hca:
  description: The HCA whose port carries O(cx7_ip) as a RoCE v2 GID; null when none does.
  returned: always
  type: str
  sample: rocep1s0f1
port:
  description: That HCA's port number; null when no port carries O(cx7_ip).
  returned: always
  type: int
  sample: 1
gid_index:
  description: Index of the RoCE v2 GID that encodes O(cx7_ip), for C(NCCL_IB_GID_INDEX); null when absent.
  returned: always
  type: int
  sample: 3
ib_hca:
  description: RV(ib_hcas) joined with commas, the form C(NCCL_IB_HCA) takes; empty when none.
  returned: always
  type: str
  sample: rocep1s0f1,roceP2p1s0f1
ib_hcas:
  description: The HCAs for C(NCCL_IB_HCA), in PCI address order (see the rule in the description).
  returned: always
  type: list
  elements: str
  sample: [rocep1s0f1, roceP2p1s0f1]
socket_ifname:
  description: The netdev that carries O(cx7_ip), for C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME).
  returned: always
  type: str
  sample: enp1s0f1np1
mtu:
  description: MTU of RV(socket_ifname); null when unknown.
  returned: always
  type: int
  sample: 9000
speed_mbps:
  description: Link speed of RV(socket_ifname) in Mb/s; null when unknown or the link is down.
  returned: always
  type: int
  sample: 200000
problems:
  description:
    - What is wrong, each with a fix. C(check) is one of C(no_hca), C(gid_ipv4), C(gid_roce_v2),
      C(ipv6_only), C(ip_ambiguous), C(link_layer), C(port_state), C(phys_state), C(netdev_state), C(mtu),
      C(speed), C(cx7_iface), C(twin_down), C(twin_gid_index). C(severity) is C(error) or C(warning).
  returned: always
  type: list
  elements: dict
  sample:
    - check: mtu
      severity: warning
      message: "enp1s0f1np1 MTU is 1500, below 9000: RoCE then uses a smaller path MTU and NCCL loses bandwidth."
      fix: "Set MTU 9000 on enp1s0f1np1 on both nodes (netplan `mtu: 9000`; the peer must match)."
ok:
  description: True when no problem has severity C(error).
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._rdma import (
    RdmaError,
    resolve_link,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "cx7_ip": {"type": "str", "required": True},
            "cx7_iface": {"type": "str"},
        },
        supports_check_mode=True,
    )
    try:
        info = resolve_link(module.params["cx7_ip"], module.params["cx7_iface"] or None,
                            module.params["sysfs_root"])
    except RdmaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **info.to_dict())


if __name__ == "__main__":
    main()
