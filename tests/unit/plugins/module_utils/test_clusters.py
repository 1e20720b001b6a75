# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several clusters in one inventory: which cluster a run serves, and every inventory that is refused."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import (
    ConfigError,
    Inputs,
    resolve,
    select_cluster,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

# Two pairs: a1 heads pair_a (a2), b1 heads pair_b (b2); spark_head and spark_workers hold every cluster's.
GROUPS: dict[str, list[str]] = {
    "all": ["a1", "a2", "b1", "b2"],
    "spark_cluster": ["a1", "b1", "a2", "b2"],
    "spark_head": ["a1", "b1"],
    "spark_workers": ["a2", "b2"],
    "pair_a": ["a1", "a2"],
    "pair_b": ["b1", "b2"],
}
NAMES = ["pair_a", "pair_b"]


def declared(value: Any = None, **per_host: Any) -> dict[str, Any]:
    out = {host: (NAMES if value is None else value) for host in ("a1", "a2", "b1", "b2")}
    out.update(per_host)
    return out


def refused(groups: dict[str, list[str]], given: dict[str, Any], play: list[str]) -> str:
    with pytest.raises(ConfigError) as failure:
        select_cluster(groups, given, play)
    return "\n".join(failure.value.problems)


def test_one_cluster_when_the_inventory_names_none() -> None:
    groups = {"spark_head": ["h"], "spark_workers": ["w1", "w2", "w3"]}
    cluster = select_cluster(groups, {}, ["h", "w1", "w2", "w3"])
    assert (cluster.name, cluster.head, cluster.workers) == ("", ["h"], ["w1", "w2", "w3"])


@pytest.mark.parametrize("play, name, head, workers", [
    (["a1", "a2"], "pair_a", ["a1"], ["a2"]),          # --limit pair_a
    (["b1", "b2"], "pair_b", ["b1"], ["b2"]),          # --limit pair_b
    (["b1"], "pair_b", ["b1"], ["b2"]),                # a play over spark_head, limited to pair_b
])
def test_the_run_serves_the_cluster_of_its_hosts(play: list[str], name: str, head: list[str],
                                                 workers: list[str]) -> None:
    cluster = select_cluster(GROUPS, declared(), play)
    assert (cluster.name, cluster.head, cluster.workers) == (name, head, workers)


def test_workers_keep_the_inventory_order_of_spark_workers() -> None:
    groups = dict(GROUPS, spark_workers=["a3", "a2", "b2"], pair_a=["a2", "a1", "a3"])
    cluster = select_cluster(groups, dict(declared(), a3=NAMES), ["a1", "a2", "a3"])
    assert (cluster.head, cluster.workers) == (["a1"], ["a3", "a2"])


def test_a_run_over_two_clusters_is_refused_with_the_limit_to_use() -> None:
    text = refused(GROUPS, declared(), ["a1", "b1", "a2", "b2"])
    assert "this run's hosts belong to the clusters pair_a, pair_b: a run serves one cluster" in text
    assert "--limit pair_a" in text and "may go at the same time" in text


def test_a_host_in_two_clusters_is_refused() -> None:
    groups = dict(GROUPS, pair_b=["b1", "b2", "a2"])
    text = refused(groups, declared(), ["a1", "a2"])
    assert "a2 is in the clusters pair_a and pair_b: a node serves one cluster" in text


def test_a_node_outside_every_cluster_is_refused() -> None:
    groups = dict(GROUPS, spark_workers=["a2", "b2", "c2"])
    text = refused(groups, dict(declared(), c2=NAMES), ["a1", "a2"])
    assert "c2 is in spark_workers but in none of the clusters dgxspark_vllm_clusters names (pair_a, pair_b)" in text


def test_a_cluster_member_that_is_neither_head_nor_worker_is_refused() -> None:
    groups = dict(GROUPS, pair_a=["a1", "a2", "x"])
    text = refused(groups, declared(), ["a1", "a2"])
    assert "x is in the cluster pair_a but in neither spark_head nor spark_workers" in text


@pytest.mark.parametrize("value, message", [
    (["pair_a", "pair_c"], "names 'pair_c', which is not a group of the inventory; did you mean pair_b?"),
    (["spark_head"], "names 'spark_head', which is not a group of the inventory"),
    ("pair_a", "must be a list of the inventory groups that are clusters, got 'pair_a'"),
    ([], "must be a list of the inventory groups that are clusters, got []"),
])
def test_a_bad_list_of_clusters_is_named(value: Any, message: str) -> None:
    assert message in refused(GROUPS, declared(value), ["a1", "a2"])


def test_the_list_is_one_for_the_whole_inventory() -> None:
    text = refused(GROUPS, declared(b1=["pair_b"]), ["a1", "a2"])
    assert "dgxspark_vllm_clusters differs between hosts" in text and "b1: ['pair_b']" in text


def test_every_problem_at_once() -> None:
    groups = dict(GROUPS, pair_b=["b1", "b2", "a2"], spark_workers=["a2", "b2", "c2"])
    text = refused(groups, dict(declared(), c2=NAMES), ["a1", "a2", "b1", "b2"])
    assert "a2 is in the clusters" in text and "c2 is in spark_workers" in text and "this run's hosts" in text


def test_each_cluster_resolves_its_own_settings_and_ranks() -> None:
    """Two pairs, two models: each run resolves its cluster only, with its group's values and ranks 0..1."""
    shared = {"dgxspark_vllm_cx7_subnet": "192.168.100.0/24", "dgxspark_vllm_clusters": NAMES}
    per_cluster = {"pair_a": {"dgxspark_vllm_profile": "glm53_flash_nvfp4"},
                   "pair_b": {"dgxspark_vllm_profile": "glm53_flash_nvfp4", "dgxspark_vllm_port": 8001,
                              "dgxspark_vllm_served_model_name": "second-model"}}
    ips = {"a1": "192.168.100.11", "a2": "192.168.100.12", "b1": "192.168.100.13", "b2": "192.168.100.14"}
    seen = {}
    for name in NAMES:
        cluster = select_cluster(GROUPS, declared(), GROUPS[name])
        hostvars = {host: dict(shared, **per_cluster[name], dgxspark_vllm_cx7_ip=ips[host]) for host in GROUPS[name]}
        seen[name] = resolve(Inputs(hostvars, cluster.head, cluster.workers, builtin_profile_data(), "spark",
                                    cluster=cluster.name))
    a, b = seen["pair_a"], seen["pair_b"]
    assert (a["cluster"], a["head"], a["workers"], a["served_model_name"], a["port"]) == (
        "pair_a", "a1", ["a2"], "glm-5.3-flash", 8000)
    assert (b["cluster"], b["head"], b["workers"], b["served_model_name"], b["port"]) == (
        "pair_b", "b1", ["b2"], "second-model", 8001)
    assert {host: node["rank"] for host, node in b["nodes"].items()} == {"b1": 0, "b2": 1}
    assert b["head_cx7_ip"] == "192.168.100.13"


def test_a_cluster_without_worker_names_the_cluster() -> None:
    hostvars = {"a1": {"dgxspark_vllm_cx7_ip": "192.168.100.11"}}
    with pytest.raises(ConfigError) as failure:
        resolve(Inputs(hostvars, ["a1"], [], builtin_profile_data(), "spark", cluster="pair_a"))
    assert "the cluster pair_a holds no host of spark_workers" in "\n".join(failure.value.problems)
