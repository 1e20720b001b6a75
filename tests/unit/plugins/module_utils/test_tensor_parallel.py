# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tensor-parallel size against the model's attention and KV heads, as vLLM splits them."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._tensor_parallel import (
    Model,
    check,
    fits,
    misfits,
    node_counts_that_fit,
)

GLM = Model(attention_heads=64, kv_heads=64)        # GLM-5.3-Flash
TINY = Model(attention_heads=2, kv_heads=2)         # the lab's two-node model
TINY4 = Model(attention_heads=4, kv_heads=4)        # the four-node lab's
QWEN = Model(attention_heads=32, kv_heads=4)        # Qwen3-Coder-30B-A3B (grouped-query attention)
GLM45 = Model(attention_heads=96, kv_heads=8)       # GLM-4.5


@pytest.mark.parametrize("size, model, expected", [
    (1, GLM, True), (2, GLM, True), (3, GLM, False), (4, GLM, True), (8, GLM, True), (6, GLM, False),
    (2, TINY, True), (3, TINY, False), (4, TINY, False),
    (4, TINY4, True), (2, TINY4, True), (3, TINY4, False),
    (8, QWEN, True),      # 4 KV heads over 8 ranks: each copied to two ranks
    (16, QWEN, True),
    (3, GLM45, False),    # 96 heads divide by 3, the 8 KV heads neither divide by 3 nor divide 3
    (6, GLM45, False),
    (12, GLM45, False),   # 96 / 12 = 8, but 8 KV heads over 12 ranks: neither divides the other
    (16, GLM45, True),
    (0, GLM, False),
])
def test_fits(size: int, model: Model, expected: bool) -> None:
    assert fits(size, model) is expected


@pytest.mark.parametrize("size, model, expected", [
    (3, GLM, ["its 64 attention heads do not divide by 3",
              "its 64 KV heads neither divide by 3 nor divide 3 (vLLM gives each rank a share of them, or one of them "
              "to a whole number of ranks)"]),
    (3, GLM45, ["its 8 KV heads neither divide by 3 nor divide 3 (vLLM gives each rank a share of them, or one of "
                "them to a whole number of ranks)"]),
    (4, Model(attention_heads=6, kv_heads=2), ["its 6 attention heads do not divide by 4"]),
    (2, GLM, []),
])
def test_misfits_name_both_numbers(size: int, model: Model, expected: list[str]) -> None:
    assert misfits(size, model) == expected


@pytest.mark.parametrize("model, gpus, pipeline, expected", [
    (GLM, 1, 1, [2, 4, 8]),
    (TINY, 1, 1, [2]),
    (TINY4, 1, 1, [2, 4]),
    (QWEN, 1, 1, [2, 4, 8]),
    (TINY4, 2, 1, [2]),           # two GPUs a node: TP = 2 x nodes, 4 only with two nodes
    (GLM, 1, 2, [2, 4, 8]),       # pipeline 2: TP = nodes / 2
    (Model(attention_heads=5, kv_heads=5), 1, 1, [5]),
    (Model(attention_heads=7, kv_heads=1), 1, 1, [7]),
])
def test_node_counts_that_fit(model: Model, gpus: int, pipeline: int, expected: list[int]) -> None:
    assert node_counts_that_fit(model, gpus, pipeline) == expected


def test_three_sparks_are_refused_naming_the_size_the_heads_and_the_counts_that_fit() -> None:
    assert check(3, 3, GLM, "dgxspark_vllm_tensor_parallel_size", explicit=False) == [
        "the tensor-parallel size 3 (3 nodes x 1 GPU per node) does not fit the model: vLLM splits its attention "
        "across the ranks, and its 64 attention heads do not divide by 3; its 64 KV heads neither divide by 3 nor "
        "divide 3 (vLLM gives each rank a share of them, or one of them to a whole number of ranks); node counts "
        "that fit: 2, 4, 8 (the head and the hosts of spark_workers)"]


def test_a_size_set_explicitly_is_named_by_its_variable() -> None:
    found = check(4, 4, TINY, "dgxspark_vllm_tensor_parallel_size", explicit=True)
    assert len(found) == 1
    assert found[0].startswith("dgxspark_vllm_tensor_parallel_size 4 does not fit the model: vLLM splits its "
                               "attention across the ranks, and its 2 attention heads do not divide by 4")
    assert found[0].endswith("node counts that fit: 2 (the head and the hosts of spark_workers)")


def test_a_model_no_cluster_fits_says_so() -> None:
    found = check(2, 2, Model(attention_heads=11, kv_heads=11), "tp", explicit=False)
    assert found[0].endswith("no cluster of 2 to 8 nodes fits it")


@pytest.mark.parametrize("size, nodes, model", [(2, 2, GLM), (4, 4, GLM), (2, 2, TINY), (4, 4, TINY4), (8, 8, QWEN)])
def test_what_fits_is_not_refused(size: int, nodes: int, model: Model) -> None:
    assert check(size, nodes, model, "tp", explicit=False) == []
