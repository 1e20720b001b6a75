"""A rolling change's pure logic: the clusters and their order, every refusal, each cluster's run's command line."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _rolling as rl

SETTINGS = {"image": "nvcr.io/nvidia/vllm:25.11-py3", "model_repo": "z/GLM", "model_revision": "main",
            "max_model_len": 8192, "extra_args": ["--max-num-seqs", "8"], "port": 8000, "master_addr": "10.0.0.1",
            "served_model_name": "glm", "kv_cache_memory_bytes": 100, "gpu_memory_utilization": 0.9}
PARAMS = {"playbook": "/c/playbooks/site.yml", "log_dir": "/home/u/.dgxspark/rolling", "clusters": [],
          "allow_downtime": False}
ROUTERS = [{"host": "router-1", "socket": "/run/r.sock", "map_file": "/etc/r/models.map", "drain_timeout": 660,
            "request_timeout": 600}]


def config(**settings: object) -> dict:
    merged = dict(SETTINGS)
    merged.update(settings)
    return {"profile_name": "glm53", "image": merged["image"], "settings": merged}


def cluster(name: str, model: str = "glm", **settings: object) -> dict:
    return {"name": name, "model": model, "head": f"{name}-head", "api_url": f"http://{name}:8000",
            "identity": rl.identity(config(**settings))}


def problems(inventory: list[dict], routers: list[dict] | None = None, cli: dict | None = None, **params: object) -> list[str]:
    with pytest.raises(rl.RollingError) as caught:
        rl.plan(inventory, ROUTERS if routers is None else routers, {**PARAMS, **params}, cli or {}, ["/inv"], "ap")
    return caught.value.problems


def test_identity_leaves_placement_out_and_keeps_what_a_client_gets() -> None:
    seen = rl.identity(config())
    assert seen == {"profile": "glm53", "image": SETTINGS["image"], "model_repo": "z/GLM", "model_revision": "main",
                    "max_model_len": 8192, "extra_args": ["--max-num-seqs", "8"]}
    assert rl.identity(config(port=9000, master_addr="10.9.9.9", kv_cache_memory_bytes=5)) == seen


def test_two_pairs_of_one_model_are_changed_in_order_each_with_its_run() -> None:
    out = rl.plan([cluster("pair_a"), cluster("pair_b")], ROUTERS, PARAMS,
                  {"extra_vars": ('{"x": 1}', "@vars.yml"), "vault_password_files": ("pw",), "verbosity": 2,
                   "private_key_file": "~/.ssh/k", "become": True, "tags": ("all",)},
                  ["/inv/hosts.yml", "/inv/router.yml"], "/venv/bin/ansible-playbook")
    assert out["changed_names"] == ["pair_a", "pair_b"]
    assert out["drain_timeout"] == 660
    first = out["steps"][0]
    assert first["argv"] == ["/venv/bin/ansible-playbook", "/c/playbooks/site.yml", "--limit", "pair_a",
                             "--skip-tags", "router", "--inventory", "/inv/hosts.yml", "--inventory", "/inv/router.yml",
                             "--extra-vars", '{"x": 1}', "--extra-vars", "@vars.yml", "--vault-password-file", "pw",
                             "--private-key", "~/.ssh/k", "--become", "-vv"]
    assert first["log"] == "/home/u/.dgxspark/rolling/pair_a.log"
    assert first["api_url"] == "http://pair_a:8000"
    assert "pair_b serve(s) as before; not changed: pair_b" in first["failed"]
    assert "not changed" not in out["steps"][1]["failed"]
    assert "state=ready" in first["failed"]


def test_the_clusters_named_are_changed_in_the_order_named() -> None:
    out = rl.plan([cluster("pair_a"), cluster("pair_b"), cluster("pair_c")], ROUTERS,
                  {**PARAMS, "clusters": ["pair_c", "pair_a"]}, {}, [], "ap")
    assert out["changed_names"] == ["pair_c", "pair_a"]


def test_unknown_and_repeated_names_are_refused() -> None:
    found = problems([cluster("pair_a"), cluster("pair_b")], clusters=["pair_x", "pair_a", "pair_a"])
    assert found == ["rolling_clusters names pair_x, which the inventory's clusters (pair_a, pair_b) do not hold",
                     "rolling_clusters names pair_a more than once"]


def test_no_router_is_refused_naming_the_fix() -> None:
    found = problems([cluster("pair_a"), cluster("pair_b")], routers=[])
    assert len(found) == 1 and "no host in spark_router" in found[0] and "site.yml --limit <cluster>" in found[0]


def test_a_drain_shorter_than_the_longest_request_is_refused() -> None:
    found = problems([cluster("pair_a"), cluster("pair_b")], routers=[{**ROUTERS[0], "drain_timeout": 300}])
    assert found == ["router_drain_timeout of router-1 (300 s) is shorter than the longest request the clusters allow "
                     "through the router (router_request_timeout, 600 s): a drain would give up while a request may "
                     "still run; set router_drain_timeout to at least 600"]


def test_one_model_name_with_two_settings_is_refused_naming_each_value() -> None:
    found = problems([cluster("pair_a"), cluster("pair_b", max_model_len=4096, model_revision="v2")])
    assert found == ["pair_a and pair_b both serve glm with different settings (max_model_len: pair_a 8192, pair_b "
                     "4096; model_revision: pair_a main, pair_b v2): the router sends a request for glm to either, so "
                     "a client would get different answers from one name; give both clusters the same settings, or "
                     "serve one under another dgxspark_vllm_served_model_name"]


def test_a_cluster_alone_with_its_model_is_refused_unless_downtime_is_allowed() -> None:
    clusters = [cluster("pair_a"), cluster("pair_b", model="qwen")]
    found = problems(clusters)
    expected = ["pair_a is the only cluster serving glm", "pair_b is the only cluster serving qwen"]
    assert [p.split(":")[0] for p in found] == expected
    assert "rolling_allow_downtime: true" in found[0]
    assert rl.plan(clusters, ROUTERS, {**PARAMS, "allow_downtime": True}, {}, [], "ap")["changed_names"] == [
        "pair_a", "pair_b"]
    # only the clusters changed count: pair_b alone is not changed here, pair_a is alone with glm
    assert problems(clusters, clusters=["pair_a"])[0].startswith("pair_a is the only cluster serving glm")


@pytest.mark.parametrize(("cli", "expected"), [
    ({"ask_vault_pass": True}, "--ask-vault-pass: each cluster's run is started without a terminal and cannot ask"),
    ({"become_ask_pass": True}, "--ask-become-pass: each cluster's run is started without a terminal"),
    ({"ask_pass": True}, "--ask-pass: each cluster's run"),
    ({"subset": "pair_a"}, "--limit pair_a: a rolling change goes over the clusters itself"),
    ({"tags": ("verify",)}, "--tags and --skip-tags"),
    ({"skip_tags": ("verify",)}, "--tags and --skip-tags"),
])
def test_options_a_clusters_run_cannot_take_are_refused(cli: dict, expected: str) -> None:
    found = problems([cluster("pair_a"), cluster("pair_b")], cli=cli)
    assert len(found) == 1 and found[0].startswith(expected)


def test_every_problem_is_listed_at_once() -> None:
    found = problems([cluster("pair_a"), cluster("pair_b", model="qwen")], routers=[], cli={"subset": "x"})
    assert len(found) == 4


def servers(**states: str) -> list[dict]:
    return [{"cluster": name, "state": state} for name, state in states.items()]


def test_the_router_must_see_every_cluster_and_keep_each_model_served() -> None:
    clusters = [cluster("pair_a"), cluster("pair_b")]
    assert rl.router_problems({"router-1": servers(pair_a="up", pair_b="up")}, clusters, clusters, False) == []
    missing = rl.router_problems({"router-1": servers(pair_a="up")}, clusters, clusters, False)
    assert missing[0] == ("the router on router-1 has no server for pair_b: run playbooks/router.yml once the cluster "
                          "serves, then the rolling change")
    down = rl.router_problems({"router-1": servers(pair_a="up", pair_b="down")}, clusters, clusters, False)
    assert down == ["draining pair_a would leave glm without a cluster on the router on router-1 (pair_b down): bring "
                    "them back first (the guard restores a cluster; status.yml shows each), or set "
                    "rolling_allow_downtime: true"]
    assert rl.router_problems({"router-1": servers(pair_a="up", pair_b="down")}, clusters, clusters, True) == []
    # pair_b is the one changed: pair_a, up, keeps the model served
    assert rl.router_problems({"router-1": servers(pair_a="up", pair_b="down")}, clusters, clusters[1:], False) == []
