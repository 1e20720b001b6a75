# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's profile and inventories carry the head counts of the tiny models lab/tiny_model.py builds.

The config step checks the tensor-parallel size against the head counts a profile or inventory gives; in the lab
these must be the tiny models' (read here from lab/tiny_model.py without running it: it needs torch), or the check
would pass or refuse for the wrong reason.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
# the hub's repository of each build (bin/lab: --tp 2 is dgxspark-lab/tiny-glm53, --tp 4 ...-tp4)
REPOS = {2: "dgxspark-lab/tiny-glm53", 4: "dgxspark-lab/tiny-glm53-tp4"}


def tiny_shapes() -> dict[int, dict[str, int]]:
    tree = ast.parse((ROOT / "lab" / "tiny_model.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [target.id for target in node.targets] == ["SHAPES"]:
            shapes = {}
            for key, value in zip(node.value.keys, node.value.values):
                fields = {keyword.arg: ast.literal_eval(keyword.value) for keyword in value.keywords}
                shapes[ast.literal_eval(key)] = {
                    "attention_heads": fields["num_attention_heads"], "kv_heads": fields["num_key_value_heads"]}
            return shapes
    raise AssertionError("lab/tiny_model.py has no SHAPES")


def load(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


def test_the_lab_profile_carries_the_two_node_models_heads() -> None:
    settings = load("profiles/lab_cpu.yml")["settings"]
    assert settings["model_repo"] == REPOS[2]
    assert {key: settings[key] for key in ("attention_heads", "kv_heads")} == tiny_shapes()[2]


def test_the_four_node_lab_carries_the_four_node_models_heads() -> None:
    four = load("inventories/lab4/group_vars/spark_cluster/10-four.yml")
    assert four["dgxspark_vllm_model_repo"] == REPOS[4] and four["dgxspark_vllm_tensor_parallel_size"] == 4
    assert {"attention_heads": four["dgxspark_vllm_attention_heads"],
            "kv_heads": four["dgxspark_vllm_kv_heads"]} == tiny_shapes()[4]
    shapes = tiny_shapes()[4]
    assert shapes["attention_heads"] % 4 == 0 and shapes["kv_heads"] % 4 == 0


def test_the_exl3_lab_carries_the_stand_in_checkpoints_heads() -> None:
    """The lab hub serves the two-node tiny model under the EXL3 checkpoint's name."""
    exl3 = load("inventories/lab_exl3/group_vars/spark_cluster/10-exl3.yml")
    assert {"attention_heads": exl3["dgxspark_vllm_attention_heads"],
            "kv_heads": exl3["dgxspark_vllm_kv_heads"]} == tiny_shapes()[2]


@pytest.mark.parametrize("inventory", ["lab", "lab_pairs"])
def test_the_other_lab_inventories_take_the_lab_profiles_heads(inventory: str) -> None:
    for path in (ROOT / "inventories" / inventory).rglob("*.yml"):
        values = load(str(path.relative_to(ROOT))) or {}
        assert not {"dgxspark_vllm_model_repo", "dgxspark_vllm_attention_heads", "dgxspark_vllm_kv_heads"} & set(values)
