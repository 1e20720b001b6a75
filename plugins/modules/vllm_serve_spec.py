#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_serve_spec
short_description: Render one node's vLLM serving container from a named profile
version_added: 0.1.0
description:
  - Validates the whole cluster (nodes, ranks, addresses, parallelism, memory, flags) and renders, for the
    node named by O(node), the vLLM container as a dict ready for M(community.docker.docker_container), the
    equivalent C(docker run) line, and a config hash.
  - The profile V(glm53_flash_nvfp4) reproduces the recipe's NVFP4 C(docker run) command exactly, flag for
    flag and env for env. V(lab_cpu) is the same path for the CPU lab (no GPUs, no InfiniBand, no memlock
    ulimit, no MTP, no fp8 KV, C(--max-model-len 4096), C(--gpu-memory-utilization 0.1), on CPU a fraction of
    host RAM from which vLLM auto-sizes the KV cache unless C(--kv-cache-memory-bytes) is rendered).
  - Per node only V(VLLM_HOST_IP), C(--node-rank), C(--headless) (last argument, every non-head node, never
    the head) and the node's own network identity (interface, HCAs, GID index) differ.
  - Workers keep the head's C(--host) and C(--port) as the recipe's worker command does ("everything below
    PLUS --headless"); vLLM does not open the API port in headless mode.
  - The whole cluster is rendered on every call, so a setting that is wrong for any node fails on every node
    and a launch never starts a rank the others cannot join.
  - Never touches the target and never reports a change. An action plugin of the same name renders in the
    controller's process (the render is pure; no module run on the node).
author:
  - dgxspark.vllm contributors (@dgxspark)
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Pure rendering; the result is the same in check mode.
  diff_mode:
    support: none
    details: Nothing on the target is changed, so there is nothing to diff.
  idempotent:
    support: full
    details: The same input always renders the same container and hash, and nothing is ever changed.
options:
  profile:
    description:
      - The name of a built-in profile (a file in the collection's C(profiles/) folder) whose container options,
        env and vLLM flags are rendered, when O(profile_data) is not given. Built-in - V(glm53_flash_nvfp4),
        V(lab_cpu).
    type: str
    default: glm53_flash_nvfp4
  profile_data:
    description:
      - A resolved profile as data (the C(profile) key of the C(dgxspark_vllm_config) fact that
        M(dgxspark.vllm.cluster_config) publishes), built-in or defined in the inventory. Takes precedence over
        O(profile).
    type: dict
  nodes:
    description:
      - The whole cluster, every node including the one rendered.
      - Exactly one node has O(nodes[].head=true). Ranks are 0 for the head, then 1..N-1 in list order,
        unless every node gives O(nodes[].rank).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Node name, unique; O(node) refers to it (usually the inventory hostname).
        type: str
        required: true
      cx7_ip:
        description:
          - The node's address on the ConnectX-7 link. Rendered as V(VLLM_HOST_IP); the head's is C(--master-addr).
        type: str
        required: true
      head:
        description: Whether this node is the head (rank 0, serves the API, no C(--headless)).
        type: bool
        default: false
      rank:
        description:
          - Explicit rank. If any node gives one, all must, as 0..N-1 with the head at 0.
        type: int
      cx7_iface:
        description:
          - The node's CX7 interface for V(NCCL_SOCKET_IFNAME), V(GLOO_SOCKET_IFNAME), V(TP_SOCKET_IFNAME)
            and V(MN_IF_NAME). Defaults to O(settings.cx7_iface).
        type: str
      ib_hca:
        description:
          - Comma-separated HCA names for V(NCCL_IB_HCA). Defaults to O(settings.ib_hca).
        type: str
      gid_index:
        description:
          - RoCE GID index for V(NCCL_IB_GID_INDEX). Defaults to O(settings.gid_index).
        type: int
  node:
    description:
      - Name of the node to render; must be one of O(nodes[].name).
    type: str
    required: true
  settings:
    description:
      - Overrides of the profile's settings. A key left out or null keeps the profile's value.
    type: dict
    default: {}
    suboptions:
      image:
        description: Container image. Profile default, for example V(ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8).
        type: str
      container_name:
        description: Container name (profile default V(vllm_glm53)).
        type: str
      model_path:
        description:
          - Absolute path of the checkpoint on every node, mounted read-only at the same path and passed
            as the model.
        type: str
      served_model_name:
        description: C(--served-model-name) (profile default V(glm-5.3-flash)).
        type: str
      host:
        description: C(--host) bind address, an IP address (profile default V(0.0.0.0)).
        type: str
      port:
        description: C(--port), the API port (profile default V(8000)).
        type: int
      master_port:
        description: C(--master-port), the rendezvous port on the head (profile default V(29521)).
        type: int
      master_addr:
        description:
          - C(--master-addr). Defaults to the head's O(nodes[].cx7_ip); if given it must be that address.
        type: str
      tensor_parallel_size:
        description:
          - C(--tensor-parallel-size). Defaults to nodes x O(settings.gpus_per_node) /
            O(settings.pipeline_parallel_size); tensor x pipeline must equal nodes x gpus per node.
        type: int
      pipeline_parallel_size:
        description: C(--pipeline-parallel-size), rendered only when above 1 (profile default 1).
        type: int
      gpus_per_node:
        description: GPUs per node (profile default 1, as on DGX Spark).
        type: int
      gpu_memory_utilization:
        description:
          - C(--gpu-memory-utilization) in (0, 1] (profile default 0.85). Above 0.85 needs
            O(settings.allow_high_gpu_memory_utilization); 0.87 has crashed heads on DGX Spark.
        type: float
      allow_high_gpu_memory_utilization:
        description: Accept O(settings.gpu_memory_utilization) above 0.85 (profile default false).
        type: bool
      max_model_len:
        description: C(--max-model-len) (profile default 262144; 4096 for V(lab_cpu)).
        type: int
      kv_cache_memory_bytes:
        description:
          - C(--kv-cache-memory-bytes) as a plain positive integer, the recipe's C(--kv-cache-memory).
            Left out of the command while unknown.
        type: int
      cx7_subnet:
        description:
          - CIDR of the CX7 link, for V(NCCL_IB_ADDR_RANGE); every O(nodes[].cx7_ip) must lie in it.
            Required by V(glm53_flash_nvfp4).
        type: str
      cx7_iface:
        description: Cluster default for O(nodes[].cx7_iface).
        type: str
      ib_hca:
        description: Cluster default for O(nodes[].ib_hca).
        type: str
      gid_index:
        description: Cluster default for O(nodes[].gid_index) (profile default 3, as in the recipe).
        type: int
      cache_path:
        description: Absolute host directory mounted at C(/cache) for V(HF_HOME) (profile default V(/var/tmp/cache)).
        type: str
      shm_size:
        description: C(--shm-size) such as V(32g) (V(1g) for V(lab_cpu)).
        type: str
      speculative_config:
        description:
          - C(--speculative-config) as a JSON object string (a dict is serialised compactly).
        type: raw
      default_chat_template_kwargs:
        description:
          - C(--default-chat-template-kwargs) as a JSON object string (a dict is serialised compactly).
        type: raw
      extra_env:
        description:
          - Environment variables added to the profile's or replacing them. Per-node variables (for example
            V(VLLM_HOST_IP), V(NCCL_IB_HCA)) and V(VLLM_API_KEY) are refused; set their own option instead.
        type: dict
      remove_env:
        description: Names of profile environment variables to leave out.
        type: list
        elements: str
      extra_args:
        description:
          - vLLM argument tokens, for example V(["--max-num-seqs", "8"]). A flag the profile already renders
            is replaced in place; others are appended (before C(--headless)). Flags that a setting or the node
            list controls are refused with the option to use instead.
        type: list
        elements: str
      remove_args:
        description:
          - vLLM flags to leave out, with their values. C(--headless), C(--nnodes), C(--node-rank) and
            C(--master-addr) cannot be removed.
        type: list
        elements: str
      distributed_timeout_seconds:
        description:
          - C(--distributed-timeout-seconds), the rendezvous timeout; left out when unset (PyTorch's 30 min).
        type: int
      log_max_size:
        description:
          - The serve container's json-file log rotates at this size (C(--log-opt max-size)), such as V(100m)
            (profile default V(100m)).
        type: str
      log_max_file:
        description:
          - How many rotated log files Docker keeps (C(--log-opt max-file), 1 to 100; profile default 5).
        type: int
  api_key:
    description:
      - API key for the head's OpenAI-compatible server, for env V(VLLM_API_KEY).
      - The key's value never leaves the module; RV(container.env) lacks V(VLLM_API_KEY) and RV(secret_env) names
        it, so the caller adds the key from its own C(no_log) variable when it starts the container (see the
        examples). RV(command_line) shows C(-e VLLM_API_KEY) without a value (docker then reads it from the
        caller's environment); RV(config_hash) sees only a hash of it, so changing the key forces a restart.
    type: str
notes:
  - Rendering does not check the target; the launch role compares RV(config_hash) with the running
    container's C(dgxspark.vllm.config_hash) label to decide on a restart.
seealso:
  - module: community.docker.docker_container
"""

EXAMPLES = r"""
- name: Render this node's vLLM container
  dgxspark.vllm.vllm_serve_spec:
    profile: glm53_flash_nvfp4
    node: "{{ inventory_hostname }}"
    nodes:
      - name: spark1
        cx7_ip: 192.168.100.11
        head: true
        ib_hca: rocep1s0f1,roceP2p1s0f1
      - name: spark2
        cx7_ip: 192.168.100.12
        ib_hca: rocep1s0f1,roceP2p1s0f1
        gid_index: 4
    settings:
      cx7_subnet: 192.168.100.0/24
      cx7_iface: enp1s0f1np1
      kv_cache_memory_bytes: 41875931136
      extra_args: ["--max-num-seqs", "8"]
    api_key: "{{ vllm_api_key }}"
  register: serve_spec

- name: Start it
  community.docker.docker_container:
    name: "{{ serve_spec.container.name }}"
    image: "{{ serve_spec.container.image }}"
    command: "{{ serve_spec.container.command }}"
    # the key's value is not in the result (secret_env names it): add it from the no_log variable
    env: "{{ serve_spec.container.env | combine({'VLLM_API_KEY': vllm_api_key} if 'VLLM_API_KEY' in serve_spec.secret_env else {}) }}"
    volumes: "{{ serve_spec.container.volumes }}"
    devices: "{{ serve_spec.container.devices }}"
    ulimits: "{{ serve_spec.container.ulimits }}"
    capabilities: "{{ serve_spec.container.capabilities }}"
    ipc_mode: "{{ serve_spec.container.ipc_mode }}"
    network_mode: "{{ serve_spec.container.network_mode }}"
    shm_size: "{{ serve_spec.container.shm_size }}"
    log_driver: "{{ serve_spec.container.log_driver }}"
    log_options: "{{ serve_spec.container.log_options }}"
    restart_policy: "{{ serve_spec.container.restart_policy }}"
    device_requests: "{{ serve_spec.container.device_requests }}"
    labels: "{{ serve_spec.container.labels }}"
  no_log: "{{ dgxspark_vllm_secure_logging | default(true) }}"

- name: The CPU lab, four nodes with explicit ranks
  dgxspark.vllm.vllm_serve_spec:
    profile: lab_cpu
    node: lab-node2
    nodes:
      - {name: lab-node0, cx7_ip: 10.91.0.11, head: true, rank: 0}
      - {name: lab-node1, cx7_ip: 10.91.0.12, rank: 1}
      - {name: lab-node2, cx7_ip: 10.91.0.13, rank: 2}
      - {name: lab-node3, cx7_ip: 10.91.0.14, rank: 3}
    settings:
      cx7_iface: eth0
      cx7_subnet: 10.91.0.0/24
"""

RETURN = r"""
container:
  description:
    - The container for M(community.docker.docker_container). RV(container.command) is the model path then
      the vLLM flags (the image's entrypoint is C(vllm serve)).
  returned: success
  type: dict
  contains:
    name:
      description: Container name.
      returned: success
      type: str
      sample: vllm_glm53
    image:
      description: Image reference.
      returned: success
      type: str
      sample: ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8
    command:
      description: Model path followed by the vLLM flags; C(--headless) last on workers.
      returned: success
      type: list
      elements: str
      sample: ["/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat", "--served-model-name", "glm-5.3-flash"]
    env:
      description: Environment, every value a string; never V(VLLM_API_KEY) (see RV(secret_env)).
      returned: success
      type: dict
      sample: {"VLLM_HOST_IP": "192.168.100.12", "NCCL_IB_GID_INDEX": "3"}
    volumes:
      description: Bind mounts as C(src:dst[:ro]).
      returned: success
      type: list
      elements: str
      sample: ["/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat:/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat:ro",
               "/var/tmp/cache:/cache"]
    devices:
      description: Host devices passed through.
      returned: success
      type: list
      elements: str
      sample: ["/dev/infiniband:/dev/infiniband"]
    ulimits:
      description: Ulimits as C(name:soft:hard).
      returned: success
      type: list
      elements: str
      sample: ["memlock:-1:-1"]
    capabilities:
      description: Added capabilities.
      returned: success
      type: list
      elements: str
      sample: ["IPC_LOCK"]
    ipc_mode:
      description: IPC namespace mode.
      returned: success
      type: str
      sample: host
    network_mode:
      description: Network mode.
      returned: success
      type: str
      sample: host
    shm_size:
      description: Size of C(/dev/shm).
      returned: success
      type: str
      sample: 32g
    restart_policy:
      description: Always V(no); both ranks are restarted together by the launch role.
      returned: success
      type: str
      sample: "no"
    log_driver:
      description: Always V(json-file), rotated by RV(container.log_options).
      returned: success
      type: str
      sample: json-file
    log_options:
      description: The json-file log's rotation, from O(settings.log_max_size) and O(settings.log_max_file).
      returned: success
      type: dict
      sample: {"max-size": "100m", "max-file": "5"}
    device_requests:
      description: The GPU request for C(--gpus all); empty for V(lab_cpu).
      returned: success
      type: list
      elements: dict
      sample: [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    labels:
      description:
        - C(dgxspark.vllm.config_hash), C(dgxspark.vllm.rank), C(dgxspark.vllm.role) (head or worker) and
          C(dgxspark.vllm.profile).
      returned: success
      type: dict
      sample: {"dgxspark.vllm.config_hash": "3f2a9c0d1e4b5a67", "dgxspark.vllm.rank": "1",
               "dgxspark.vllm.role": "worker", "dgxspark.vllm.profile": "glm53_flash_nvfp4"}
secret_env:
  description:
    - Names of the environment variables the container needs whose values are secrets, left out of
      RV(container.env) - V(VLLM_API_KEY) when O(api_key) is given. Add them when starting the container.
  returned: success
  type: list
  elements: str
  sample: [VLLM_API_KEY]
command_line:
  description:
    - The equivalent C(docker run) command as one shell-quoted string, in the recipe's order (labels are not
      part of it). The API key appears only as C(-e VLLM_API_KEY), without its value.
  returned: success
  type: str
  sample: "docker run --gpus all -d --name vllm_glm53 --restart no --network host ... --headless"
config_hash:
  description:
    - First 16 hex digits of the sha256 of a canonical JSON of the container spec without labels. Anything that
      must force a restart changes it; the API key enters only as a hash.
  returned: success
  type: str
  sample: 3f2a9c0d1e4b5a67
rank:
  description: The node's rank (C(--node-rank)); 0 is the head.
  returned: success
  type: int
  sample: 1
role:
  description: V(head) or V(worker).
  returned: success
  type: str
  sample: worker
headless:
  description: Whether the command ends with C(--headless) (every worker, never the head).
  returned: success
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    ARGUMENT_SPEC,
    SpecError,
    profile_from_data,
    render_spec,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    if module.params["profile_data"] is None:
        # the built-in profiles are files on the controller: the action plugin of the same name reads them
        module.fail_json(msg="profile_data is required when the module runs on a node (the action plugin of the "
                             "same name renders built-in profiles by name on the controller)")
    try:
        spec = render_spec(
            profile=profile_from_data(module.params["profile_data"]),
            nodes=module.params["nodes"],
            node=module.params["node"],
            settings=module.params["settings"],
            api_key=module.params["api_key"],
        )
    except SpecError as exc:
        module.fail_json(msg=str(exc))
    for warning in spec.warnings:
        module.warn(warning)
    module.exit_json(changed=False, **spec.as_result())


if __name__ == "__main__":
    main()
