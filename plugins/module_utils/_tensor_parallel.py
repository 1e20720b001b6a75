# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a tensor-parallel size fits the model, decided before anything starts.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

vLLM splits a model's attention heads across the tensor-parallel ranks: it refuses to start when the attention
heads (config.json's ``num_attention_heads``) do not divide by the tensor-parallel size, and it shares the KV heads
(``num_key_value_heads``) out the same way - each rank a whole number of them, or, when the ranks outnumber them,
each KV head copied to a whole number of ranks (vLLM's QKVParallelLinear). Three Sparks give a tensor-parallel
size of 3, which divides neither GLM-5.3-Flash's 64 heads nor the lab's 2: the engine would fail on every node
after the image pull, the checkpoint download and the load. `check` says so first, with the node counts that fit.
"""
from __future__ import annotations

from dataclasses import dataclass

# How many nodes a cluster of Sparks may have (a head and at least one worker), for the counts that fit.
MIN_NODES = 2
MAX_NODES = 8


@dataclass(frozen=True)
class Model:
    """The shape of the model the tensor-parallel ranks split (its config.json's head counts)."""

    attention_heads: int
    kv_heads: int


def misfits(tensor_parallel_size: int, model: Model) -> list[str]:
    """Why vLLM cannot split the model over this many ranks (empty: it can)."""
    size = tensor_parallel_size
    out = []
    if model.attention_heads % size:
        out.append(f"its {model.attention_heads} attention heads do not divide by {size}")
    if model.kv_heads % size and size % model.kv_heads:
        out.append(f"its {model.kv_heads} KV heads neither divide by {size} nor divide {size} (vLLM gives each rank "
                   "a share of them, or one of them to a whole number of ranks)")
    return out


def fits(tensor_parallel_size: int, model: Model) -> bool:
    return tensor_parallel_size >= 1 and not misfits(tensor_parallel_size, model)


def node_counts_that_fit(model: Model, gpus_per_node: int = 1, pipeline_parallel_size: int = 1,
                         most: int = MAX_NODES) -> list[int]:
    """The cluster sizes (MIN_NODES..most nodes) whose tensor-parallel size, nodes x GPUs / pipeline, fits."""
    return [nodes for nodes in range(MIN_NODES, most + 1)
            if (nodes * gpus_per_node) % pipeline_parallel_size == 0
            and fits(nodes * gpus_per_node // pipeline_parallel_size, model)]


def check(tensor_parallel_size: int, nodes: int, model: Model, size_variable: str, explicit: bool,
          gpus_per_node: int = 1, pipeline_parallel_size: int = 1) -> list[str]:
    """The problem (none, or one naming the size, the head counts and the node counts that fit) of serving the
    model with this tensor-parallel size. ``explicit``: the size was set (``size_variable``), else derived from the
    ``nodes``."""
    why = misfits(tensor_parallel_size, model)
    if not why:
        return []
    if explicit:
        origin = f"{size_variable} {tensor_parallel_size}"
    else:
        origin = (f"the tensor-parallel size {tensor_parallel_size} ({nodes} nodes x {gpus_per_node} GPU"
                  f"{'s' if gpus_per_node > 1 else ''} per node"
                  f"{f', pipeline-parallel size {pipeline_parallel_size}' if pipeline_parallel_size > 1 else ''})")
    counts = node_counts_that_fit(model, gpus_per_node, pipeline_parallel_size)
    fitting = (f"node counts that fit: {', '.join(map(str, counts))} (the head and the hosts of spark_workers)"
               if counts else f"no cluster of {MIN_NODES} to {MAX_NODES} nodes fits it")
    return [f"{origin} does not fit the model: vLLM splits its attention across the ranks, and {'; '.join(why)}; "
            f"{fitting}"]
