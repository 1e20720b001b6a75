# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Named serving profiles, as data.

Private module: may change at any time. No logic lives here beyond the data classes; `_serve_spec` turns a
profile plus the cluster into a container spec.

Templates: an env value, a volume or a flag value is either a literal or a ``{name}`` placeholder resolved by
`_serve_spec` from the settings and the node being rendered (see `_serve_spec.TEMPLATE_KEYS`). A flag whose
placeholder resolves to an *optional* value that is unset (`kv_cache_memory_bytes`,
`distributed_timeout_seconds`, `pipeline_parallel_size` when 1) is left out; any other unset value is an
error. Order is significant: it is the order of the rendered ``docker run`` line.

Adding a profile (e.g. a future ``glm53_flash_exl3``): add a `Profile` to `PROFILES`; nothing else changes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Profile:
    """One way of serving: container options, env, vLLM flags and default settings."""

    name: str
    description: str
    settings: Mapping[str, Any]
    env: tuple[tuple[str, str], ...]
    args: tuple[tuple[str, str | None], ...]
    volumes: tuple[str, ...]
    gpus: str | None = None
    devices: tuple[str, ...] = ()
    ulimits: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    network_mode: str = "host"
    ipc_mode: str = "host"
    # env names left out (instead of an error) when their placeholder's value is unset
    optional_env: frozenset[str] = frozenset()


# Settings every profile understands, with the values shared by all profiles. A profile overrides some.
BASE_SETTINGS: Mapping[str, Any] = MappingProxyType({
    "image": None,
    "container_name": "vllm_glm53",
    "model_path": None,
    "served_model_name": "glm-5.3-flash",
    "host": "0.0.0.0",
    "port": 8000,
    "master_port": 29521,
    "master_addr": None,              # derived: the head's cx7_ip
    "tensor_parallel_size": None,     # derived: nodes x gpus_per_node / pipeline_parallel_size
    "pipeline_parallel_size": 1,
    "gpus_per_node": 1,
    "gpu_memory_utilization": 0.85,
    "allow_high_gpu_memory_utilization": False,
    "max_model_len": None,
    "kv_cache_memory_bytes": None,
    "cx7_subnet": None,
    "cx7_iface": None,
    "ib_hca": None,
    "gid_index": 3,
    "cache_path": "/var/tmp/cache",
    "shm_size": "32g",
    "speculative_config": None,
    "default_chat_template_kwargs": '{"enable_thinking": false}',
    "extra_env": MappingProxyType({}),
    "remove_env": (),
    "extra_args": (),
    "remove_args": (),
    "distributed_timeout_seconds": None,
})


def _settings(**overrides: Any) -> Mapping[str, Any]:
    merged = dict(BASE_SETTINGS)
    merged.update(overrides)
    return MappingProxyType(merged)


_NVFP4_ENV: tuple[tuple[str, str], ...] = (
    ("VLLM_HOST_IP", "{host_ip}"),
    ("HF_HOME", "/cache/huggingface"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_ENGINE_READY_TIMEOUT_S", "3600"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ("TORCH_CUDA_ARCH_LIST", "12.1a"),
    ("FLASHINFER_CUDA_ARCH_LIST", "12.1a"),
    ("FLASHINFER_DISABLE_VERSION_CHECK", "1"),
    ("NCCL_NET", "IB"),
    ("NCCL_IB_DISABLE", "0"),
    ("NCCL_IB_HCA", "{ib_hca}"),
    ("NCCL_IB_GID_INDEX", "{gid_index}"),
    ("NCCL_IB_ROCE_VERSION_NUM", "2"),
    ("NCCL_IB_ADDR_FAMILY", "AF_INET"),
    ("NCCL_IB_ADDR_RANGE", "{cx7_subnet}"),
    ("NCCL_SOCKET_IFNAME", "{cx7_iface}"),
    ("GLOO_SOCKET_IFNAME", "{cx7_iface}"),
    ("TP_SOCKET_IFNAME", "{cx7_iface}"),
    ("MN_IF_NAME", "{cx7_iface}"),
    ("NCCL_NVLS_ENABLE", "0"),
    ("NCCL_CROSS_NIC", "0"),
    ("NCCL_IB_MERGE_NICS", "0"),
    ("NCCL_CUMEM_ENABLE", "0"),
    ("NCCL_IGNORE_CPU_AFFINITY", "1"),
    ("NCCL_DEBUG", "WARN"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
)

_NVFP4_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--served-model-name", "{served_model_name}"),
    ("--host", "{host}"),
    ("--port", "{port}"),
    ("--trust-remote-code", None),
    ("--tensor-parallel-size", "{tensor_parallel_size}"),
    ("--pipeline-parallel-size", "{pipeline_parallel_size}"),
    ("--gpu-memory-utilization", "{gpu_memory_utilization}"),
    ("--max-model-len", "{max_model_len}"),
    ("--max-num-seqs", "6"),
    ("--block-size", "2304"),
    ("--moe-backend", "marlin"),
    ("--speculative-config", "{speculative_config}"),
    ("--kv-cache-dtype", "fp8_e4m3"),
    ("--kv-cache-memory-bytes", "{kv_cache_memory_bytes}"),
    ("--enforce-eager", None),
    ("--max-num-batched-tokens", "8192"),
    ("--tool-call-parser", "glm47"),
    ("--enable-auto-tool-choice", None),
    ("--reasoning-parser", "glm45"),
    ("--default-chat-template-kwargs", "{default_chat_template_kwargs}"),
    ("--distributed-executor-backend", "mp"),
    ("--nnodes", "{nnodes}"),
    ("--node-rank", "{node_rank}"),
    ("--master-addr", "{master_addr}"),
    ("--master-port", "{master_port}"),
    ("--distributed-timeout-seconds", "{distributed_timeout_seconds}"),
)

_VOLUMES: tuple[str, ...] = ("{model_path}:{model_path}:ro", "{cache_path}:/cache")

GLM53_FLASH_NVFP4 = Profile(
    name="glm53_flash_nvfp4",
    description="GLM-5.3-Flash NVFP4 (RedHatAI) on the pre-patched sm121 image: the recipe's docker run.",
    settings=_settings(
        image="ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8",
        model_path="/var/tmp/models/GLM-5.3-Flash-NVFP4-redhat",
        max_model_len=262144,
        speculative_config='{"method":"mtp","num_speculative_tokens":4}',
    ),
    env=_NVFP4_ENV,
    args=_NVFP4_ARGS,
    volumes=_VOLUMES,
    gpus="all",
    devices=("/dev/infiniband:/dev/infiniband",),
    ulimits=("memlock:-1:-1",),
    capabilities=("IPC_LOCK",),
)

# The lab: the same path with what a CPU-only, RDMA-less node cannot have left out.
# - no GPUs, no /dev/infiniband, NCCL's IB transport off (NCCL_IB_DISABLE=1; the CPU engine never loads NCCL);
#   NCCL_IB_HCA and NCCL_IB_GID_INDEX stay, so the values preflight detects from the lab's recorded ConnectX-7
#   sysfs trees are visible in each node's container env, as on a Spark (NCCL_IB_HCA only when known);
# - no CUDA/FlashInfer arch lists, no NCCL_NET and no other IB tuning;
# - no memlock ulimit: raising the hard limit needs CAP_SYS_RESOURCE, which lab nodes lack, and pinned
#   memory only matters for RDMA;
# - no MTP drafting (the tiny model has no MTP layers), no marlin MoE backend, no fp8 KV, no 2304 blocks;
# - KV size: on CPU, --gpu-memory-utilization is a fraction of host RAM; 0.1 (≈ 1.75 GiB of the lab's
#   machine) lets vLLM auto-size the KV cache (`Auto set (X/Y) GiB`, ≈ 1.2 GiB per rank), which is the estimate
#   the launch role's calibration reads back before it relaunches with --kv-cache-memory-bytes.
# - the CPU engine's first request across two ranks compiles small kernels through torch inductor even with
#   --enforce-eager (≈ 40 s on the lab's 2 cores): its cache lives in the node's cache volume, not the
#   container's /tmp, so a relaunch on the same node loads them instead (≈ 17 s).
_LAB_DROPPED_ENV = frozenset({
    "TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST", "NCCL_NET", "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE", "NCCL_IB_MERGE_NICS",
})
_LAB_ENV_VALUES = MappingProxyType({"NCCL_IB_DISABLE": "1"})
_LAB_DROPPED_ARGS = frozenset({"--speculative-config", "--moe-backend", "--kv-cache-dtype", "--block-size"})

LAB_CPU = Profile(
    name="lab_cpu",
    description="The two-node CPU lab: real vLLM (CPU build) and a tiny GLM-architecture model.",
    settings=_settings(
        image="ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0",
        model_path="/var/tmp/models/tiny-glm53",
        max_model_len=4096,
        gpu_memory_utilization=0.1,
        shm_size="1g",
    ),
    env=tuple((name, _LAB_ENV_VALUES.get(name, value)) for name, value in _NVFP4_ENV
              if name not in _LAB_DROPPED_ENV) + (
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
        ("TMPDIR", "/tmp"),
        ("TORCHINDUCTOR_CACHE_DIR", "/cache/torchinductor"),
    ),
    args=tuple(item for item in _NVFP4_ARGS if item[0] not in _LAB_DROPPED_ARGS),
    volumes=_VOLUMES,
    capabilities=("IPC_LOCK",),
    optional_env=frozenset({"NCCL_IB_HCA"}),
)

PROFILES: Mapping[str, Profile] = MappingProxyType({
    GLM53_FLASH_NVFP4.name: GLM53_FLASH_NVFP4,
    LAB_CPU.name: LAB_CPU,
})

DEFAULT_PROFILE = GLM53_FLASH_NVFP4.name
