# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_clusters as ansible-playbook runs it on the router's hosts: every cluster of the inventory resolved as its
own runs resolve it (its group_vars, its profile), no node contacted (the hosts do not exist)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.inventories import filled_copy

ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK = """
- hosts: spark_router
  gather_facts: false
  tasks:
    - name: Resolve every cluster
      dgxspark.vllm.router_clusters:
      run_once: true
      register: clusters
    - name: Write what the router sees
      ansible.builtin.copy:
        content: "{{{{ clusters | to_json }}}}"
        dest: "{out}/clusters.json"
        mode: "0600"
      delegate_to: localhost
      run_once: true
"""


def run(tmp_path: Path, router: str, router_vars: dict) -> tuple[subprocess.CompletedProcess[str], Path]:
    inventory = filled_copy("example_pairs", tmp_path / "inventories")
    (inventory / "router.yml").write_text(yaml.safe_dump({"spark_router": {"hosts": {router: router_vars}}}))
    out = tmp_path / "out"
    out.mkdir()
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(out=out))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_CONNECTION="local",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), str(playbook)]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False), out


@pytest.mark.parametrize(("router", "router_vars", "host_ports"), [
    ("router-1", {"ansible_host": "240.0.0.9"}, {}),
    ("spark-a1", {}, {"spark-a1": 8000}),   # a head as the router's host: its cluster's API port is taken there
])
def test_every_cluster_is_resolved_with_its_own_settings(tmp_path: Path, router: str, router_vars: dict,
                                                         host_ports: dict) -> None:
    result, out = run(tmp_path, router, router_vars)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads((out / "clusters.json").read_text())
    assert [(c["name"], c["head"], c["model"], c["port"], c["key_generated"]) for c in seen["clusters"]] == [
        ("pair_a", "spark-a1", "glm-5.3-flash", 8000, True), ("pair_b", "spark-b1", "qwen3-coder", 8000, True)]
    heads = yaml.safe_load((tmp_path / "inventories" / "example_pairs" / "hosts.yml").read_text())
    head_hosts = heads["spark_cluster"]["children"]["spark_head"]["hosts"]
    addresses = [head_hosts["spark-a1"]["ansible_host"], head_hosts["spark-b1"]["ansible_host"]]
    assert [c["address"] for c in seen["clusters"]] == addresses
    assert seen["clusters"][0]["health_url"] == f"http://{head_hosts['spark-a1']['ansible_host']}:8000/health"
    assert seen["clusters"][0]["nodes"] == ["spark-a1", "spark-a2"]
    assert seen["host_ports"] == host_ports
    assert seen["keys"] == {}


def test_a_key_the_inventory_sets_is_the_clusters_key(tmp_path: Path) -> None:
    result, out = run(tmp_path, "router-1", {"ansible_host": "240.0.0.9"})
    assert result.returncode == 0
    inventory = tmp_path / "inventories" / "example_pairs"
    (inventory / "group_vars" / "pair_b.yml").write_text(
        (inventory / "group_vars" / "pair_b.yml").read_text() + "\ndgxspark_vllm_api_key: pair-b-key-0123456789\n")
    (out / "clusters.json").unlink()
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_CONNECTION="local",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
            str(tmp_path / "play.yml")]
    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    seen = json.loads((out / "clusters.json").read_text())
    assert seen["keys"] == {"pair_b": "pair-b-key-0123456789"}
    assert [c["key_generated"] for c in seen["clusters"]] == [True, False]


PLAN = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Plan the router
      dgxspark.vllm.router_plan:
        clusters: [{name: pair_a, head: a1, address: 192.0.2.10, port: 8000, model: glm-5.3-flash}]
        keys: {pair_a: key-a-0123456789}
        router_key: router-key-0123456789
        allowed_cidrs: [192.0.2.0/24]
        probes: {router-1: [{item: {name: pair_a}, url: "http://192.0.2.10:8000/health", status: STATUS, msg: MSG}]}
      register: planned
      ignore_errors: true
    - name: Write the result
      ansible.builtin.copy:
        content: "{{ planned | to_json }}"
        dest: "OUT/plan.json"
        mode: "0600"
"""


CASES = [(200, "OK (unknown bytes)", False), (-1, "Connection refused", True)]


@pytest.mark.parametrize(("status", "msg", "failed"), CASES)
def test_the_plan_runs_through_its_action_and_refuses_an_unreachable_cluster(
        tmp_path: Path, status: int, msg: str, failed: bool) -> None:
    playbook = tmp_path / "plan.yml"
    playbook.write_text(PLAN.replace("STATUS", str(status)).replace("MSG", msg).replace("OUT", str(tmp_path)))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "plan.json").read_text())
    assert bool(result.get("failed")) is failed, result
    if failed:
        assert "router-1 -> cluster pair_a at http://192.0.2.10:8000/health: no answer (Connection refused)" in result["msg"]
    else:
        assert "server pair_a 192.0.2.10:8000 check" in result["config"]
