"""A two-node lab cluster as the KV calibration's key takes it, and the CPU engines' auto-sized KV reports."""
from typing import Any

HW = {"gpu_name": None, "driver": None, "gpu_memory": None, "mem_total_bytes": 25000000000}
BASE: dict[str, Any] = {
    "command": ["/m", "--max-model-len", "4096", "--gpu-memory-utilization", "0.1"],
    "model_path": "/m",
    "model_revision": "abc",
    "nodes": [{"name": "head", "image_id": "sha256:1", "hardware": HW},
              {"name": "worker", "image_id": "sha256:1", "hardware": HW}],
}
AUTO = {"head": {"suggestions": [], "cpu_kv_cache": {"kv_gib": 1.5, "total_gib": 23, "mode": "auto", "numa_node": 0}},
        "worker": {"suggestions": [], "cpu_kv_cache": {"kv_gib": 1.25, "total_gib": 23, "mode": "auto", "numa_node": 0}}}
