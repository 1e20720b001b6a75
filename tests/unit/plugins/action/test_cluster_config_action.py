# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The config step as ansible-playbook runs it: inventory (group_vars, host_vars), play vars and extra vars read,
the fact published on every host, every problem listed, no node contacted (the hosts do not exist)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.inventories import INVENTORIES, filled_copy

ROOT = Path(__file__).resolve().parents[4]
HOSTS = {"spark_cluster": {"children": {
    "spark_head": {"hosts": {"spark-a": {"dgxspark_vllm_cx7_ip": "192.168.100.11"}}},
    "spark_workers": {"hosts": {"spark-b": {"dgxspark_vllm_cx7_ip": "192.168.100.12"}}},
}}}
# An address nothing answers on (reserved, not a documentation range: the config step refuses those as the example
# inventory's placeholders): a task that tried to reach a node would fail the run.
GROUP = {"ansible_host": "240.0.0.1", "ansible_user": "spark", "dgxspark_vllm_profile": "lab_cpu",
         "dgxspark_vllm_cx7_subnet": "192.168.100.0/24", "dgxspark_vllm_api_key": "k-not-in-the-fact"}
PLAYBOOK = """
- hosts: spark_cluster
  gather_facts: false
  vars: {play_vars}
  roles:
    - role: dgxspark.vllm.dgxspark_vllm
  tasks:
    - name: Write the fact as each host sees it
      ansible.builtin.copy:
        content: "{{{{ dgxspark_vllm_config | to_json }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.json"
        mode: "0600"
      delegate_to: localhost
"""


def run(tmp_path: Path, group: dict[str, Any] | None = None, host_vars: dict[str, Any] | None = None,
        play_vars: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
        verbosity: str = "", hosts: dict[str, Any] | None = None, limit: str = "",
        groups: dict[str, dict[str, Any]] | None = None) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True, exist_ok=True)
    (inventory / "host_vars").mkdir(exist_ok=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts or HOSTS))
    for name, values in (groups or {}).items():
        (inventory / "group_vars" / f"{name}.yml").write_text(yaml.safe_dump(values))
    (inventory / "group_vars" / "spark_cluster.yml").write_text(yaml.safe_dump(dict(GROUP, **(group or {}))))
    for host, values in (host_vars or {}).items():
        (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(play_vars=json.dumps(play_vars or {}), out=out))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if extra:
        argv += ["-e", json.dumps(extra)]
    if verbosity:
        argv.append(verbosity)
    if limit:
        argv += ["--limit", limit]
    return subprocess.run(argv, cwd=ROOT, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


def ansible_env(tmp_path: Path) -> dict[str, str]:
    """Where ansible-playbook finds dgxspark.vllm: a checkout's ansible.cfg (its collections path links back to the
    checkout), or the collections path the built collection is installed in."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_CONNECTION="local")
    if (ROOT / "ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    else:
        env.pop("ANSIBLE_CONFIG", None)
        env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT.parents[2])
    return env


def facts(tmp_path: Path, hosts: tuple[str, ...] = ("spark-a", "spark-b")) -> dict[str, Any]:
    return {host: json.loads((tmp_path / "out" / f"{host}.json").read_text()) for host in hosts}


def test_the_fact_is_resolved_once_and_set_on_every_host(tmp_path: Path) -> None:
    result = run(tmp_path, group={"dgxspark_vllm_settings": {"max_model_len": 2048}},
                 host_vars={"spark-b": {"dgxspark_vllm_cx7_iface": "enP2p1s0f1np1"}}, verbosity="-v")
    assert result.returncode == 0, result.stdout + result.stderr
    seen = facts(tmp_path)
    assert seen["spark-a"] == seen["spark-b"]
    config = seen["spark-a"]
    assert config["image"] == "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0"     # the profile's
    assert config["settings"]["max_model_len"] == 2048                          # dgxspark_vllm_settings
    assert config["nodes"]["spark-b"]["cx7_iface"] == "enP2p1s0f1np1"            # host_vars
    assert config["kit_user"] == "spark"
    assert "k-not-in-the-fact" not in result.stdout + json.dumps(seen)
    # -v shows where each value came from
    assert "max_model_len = 2048 (dgxspark_vllm_settings)" in result.stdout
    assert "image = 'ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0' (profile lab_cpu)" in result.stdout


def test_play_vars_and_extra_vars_count_for_every_host(tmp_path: Path) -> None:
    result = run(tmp_path, play_vars={"dgxspark_vllm_served_model_name": "from-the-play"},
                 extra={"dgxspark_vllm_port": 8123})
    assert result.returncode == 0, result.stdout + result.stderr
    for config in facts(tmp_path).values():
        assert (config["served_model_name"], config["port"]) == ("from-the-play", 8123)


def test_a_broken_inventory_lists_every_problem_and_runs_nothing_else(tmp_path: Path) -> None:
    result = run(tmp_path, group={"dgxspark_vllm_image": "ghcr.io/org/untagged", "dgxspark_vllm_node_rank": 1,
                                  "dgxspark_vllm_served_model_name": ""},
                 host_vars={"spark-a": {"dgxspark_vllm_master_port": 29600}})
    assert result.returncode != 0
    text = result.stdout
    assert "the inventory has 4 problem(s); nothing was started, pulled or downloaded" in text, text
    for expected in ("dgxspark_vllm_node_rank (on spark-a, spark-b) is not a variable",
                     "dgxspark_vllm_master_port differs between hosts (spark-a: 29600; spark-b: not set)",
                     "'ghcr.io/org/untagged' has no tag or digest",
                     "dgxspark_vllm_served_model_name must be a non-empty string"):
        assert expected in text, expected
    assert not (tmp_path / "out" / "spark-a.json").exists()   # the play stopped at the check


@pytest.mark.parametrize("profile", [
    {"tiny_alias": {"extends": "lab_cpu", "settings": {"served_model_name": "tiny-alias"}}},
])
def test_a_profile_from_the_inventory(tmp_path: Path, profile: dict[str, Any]) -> None:
    result = run(tmp_path, group={"dgxspark_vllm_profiles": profile, "dgxspark_vllm_profile": "tiny_alias"})
    assert result.returncode == 0, result.stdout + result.stderr
    config = facts(tmp_path)["spark-a"]
    assert config["profile_name"] == "tiny_alias" and config["served_model_name"] == "tiny-alias"
    assert config["profile"]["source"] == "inventory (dgxspark_vllm_profiles)"


# --------------------------------------------------------------------------- several clusters in one inventory

PAIRS = {"spark_cluster": {"children": {
    "spark_head": {"hosts": {"a1": {"dgxspark_vllm_cx7_ip": "192.168.100.11"},
                             "b1": {"dgxspark_vllm_cx7_ip": "192.168.101.11"}}},
    "spark_workers": {"hosts": {"a2": {"dgxspark_vllm_cx7_ip": "192.168.100.12"},
                                "b2": {"dgxspark_vllm_cx7_ip": "192.168.101.12"}}},
    "pair_a": {"hosts": {"a1": {}, "a2": {}}},
    "pair_b": {"hosts": {"b1": {}, "b2": {}}},
}}}
PAIR_VARS = {"pair_a": {"dgxspark_vllm_cx7_subnet": "192.168.100.0/24"},
             "pair_b": {"dgxspark_vllm_cx7_subnet": "192.168.101.0/24", "dgxspark_vllm_served_model_name": "model-b",
                        "dgxspark_vllm_port": 8001}}


@pytest.mark.parametrize("limit, hosts, head, served", [
    ("pair_a", ("a1", "a2"), "a1", "glm-5.3-flash"),
    ("pair_b", ("b1", "b2"), "b1", "model-b"),
])
def test_each_cluster_is_selected_with_limit_and_gets_its_own_settings(
        tmp_path: Path, limit: str, hosts: tuple[str, ...], head: str, served: str) -> None:
    result = run(tmp_path, group={"dgxspark_vllm_clusters": ["pair_a", "pair_b"], "dgxspark_vllm_cx7_subnet": None},
                 hosts=PAIRS, groups=PAIR_VARS, limit=limit)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = facts(tmp_path, hosts)
    config = seen[head]
    assert all(other == config for other in seen.values())
    assert (config["cluster"], config["head"], config["served_model_name"]) == (limit, head, served)
    assert sorted(config["nodes"]) == sorted(hosts)
    assert sorted(path.stem for path in (tmp_path / "out").glob("*.json")) == sorted(hosts)


def test_a_run_over_both_clusters_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = run(tmp_path, group={"dgxspark_vllm_clusters": ["pair_a", "pair_b"]}, hosts=PAIRS, groups=PAIR_VARS)
    assert result.returncode != 0
    assert "this run's hosts belong to the clusters pair_a, pair_b: a run serves one cluster" in result.stdout
    assert "--limit pair_a" in result.stdout
    assert not list((tmp_path / "out").glob("*.json"))


def run_inventory(tmp_path: Path, inventory: Path, limit: str = "") -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(play_vars="{}", out=out))
    # a key given: without one, the role reads (or makes) the cluster's generated key on the head, and these
    # inventories' nodes are not there (the generated key has its own tests, and the lab's scenarios use it)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), str(playbook),
            "-e", '{"ansible_become": false, "dgxspark_vllm_api_key": "a-key-given-by-the-test-0123"}']
    if limit:
        argv += ["--limit", limit]
    return subprocess.run(argv, cwd=ROOT, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("limit, head, served, subnet", [
    ("pair_a", "spark-a1", "glm-5.3-flash", "192.168.100.0/24"),
    ("pair_b", "spark-b1", "qwen3-coder", "192.168.101.0/24"),
])
def test_the_example_pairs_inventory_serves_two_models(tmp_path: Path, limit: str, head: str, served: str,
                                                       subnet: str) -> None:
    result = run_inventory(tmp_path, filled_copy("example_pairs", tmp_path / "inventories"), limit)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    config = json.loads((out / f"{head}.json").read_text())
    assert (config["cluster"], config["head"], config["served_model_name"], config["cx7_subnet"]) == (
        limit, head, served, subnet)
    assert len(list(out.glob("*.json"))) == 2


# --------------------------------------------------------------------------- the inventories the collection holds

# every inventory of inventories/ (the lab's only in a checkout), with the --limit of each cluster it holds
RUNS = {"example": [""], "example_pairs": ["pair_a", "pair_b"], "lab": [""], "lab4": [""], "lab_exl3": [""],
        "lab_pairs": ["pair_a", "pair_b"]}


def test_every_inventory_is_checked_here() -> None:
    assert sorted(path.name for path in INVENTORIES.iterdir() if path.is_dir()) == sorted(
        name for name in RUNS if (INVENTORIES / name).is_dir())


@pytest.mark.parametrize("name, limit", [(name, limit) for name, limits in RUNS.items() for limit in limits])
def test_every_inventory_resolves(tmp_path: Path, name: str, limit: str) -> None:
    """The lab's inventories as they are, the examples once their placeholders are filled in."""
    if not (INVENTORIES / name).is_dir():
        pytest.skip(f"inventories/{name} is the lab's: only a checkout holds it, the built collection does not")
    inventory = filled_copy(name, tmp_path / "inventories") if name.startswith("example") else INVENTORIES / name
    result = run_inventory(tmp_path, inventory, limit)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert list((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize("name, limit, expected", [
    ("example", "", [
        "ansible_user on spark-a, spark-b holds '<YOUR_USER>': a placeholder of the example inventory",
        "ansible_host on spark-a holds '192.0.2.10': in 192.0.2.0/24, a range reserved for documentation (RFC 5737)",
        "ansible_host on spark-b holds '192.0.2.11': in 192.0.2.0/24",
        "dgxspark_vllm_cx7_ip on spark-a holds '198.51.100.1': in 198.51.100.0/24",
        "dgxspark_vllm_cx7_ip on spark-b holds '198.51.100.2': in 198.51.100.0/24",
        "dgxspark_vllm_cx7_subnet on spark-a, spark-b holds '198.51.100.0/24': in 198.51.100.0/24",
    ]),
    ("example_pairs", "pair_b", [
        "ansible_user on spark-b1, spark-b2 holds '<YOUR_USER>'",
        "ansible_host on spark-b1 holds '192.0.2.20'",
        "ansible_host on spark-b2 holds '192.0.2.21'",
        "dgxspark_vllm_cx7_ip on spark-b1 holds '203.0.113.1': in 203.0.113.0/24",
        "dgxspark_vllm_cx7_ip on spark-b2 holds '203.0.113.2'",
        "dgxspark_vllm_cx7_subnet on spark-b1, spark-b2 holds '203.0.113.0/24'",
    ]),
])
def test_the_example_inventories_as_shipped_are_refused_naming_every_placeholder(
        tmp_path: Path, name: str, limit: str, expected: list[str]) -> None:
    result = run_inventory(tmp_path, INVENTORIES / name, limit)
    assert result.returncode != 0
    text = result.stdout
    assert f"the inventory has {len(expected)} problem(s); nothing was started, pulled or downloaded" in text, text
    for line in expected:
        assert line in text, line
    assert not list((tmp_path / "out").glob("*.json"))   # the play stopped at the check
