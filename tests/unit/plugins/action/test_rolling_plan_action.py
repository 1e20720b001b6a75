# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""rolling_plan as ansible-playbook runs it on the controller: the example inventory's two pairs resolved as their own
runs resolve them, the rolling run's own inventory and extra variables forwarded to each cluster's run, the refusals
before anything is drained. No node is contacted (the hosts do not exist)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from helpers.inventories import filled_copy

ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Plan the rolling change
      dgxspark.vllm.rolling_plan:
        clusters: "{{{{ rolling_clusters | default([]) }}}}"
        allow_downtime: "{{{{ rolling_allow_downtime | default(false) }}}}"
        playbook: /collection/playbooks/site.yml
        log_dir: /logs
      register: planned
      ignore_errors: true
    - name: Write the plan
      ansible.builtin.copy:
        content: "{{{{ planned | to_json }}}}"
        dest: "{out}/plan.json"
        mode: "0600"
"""


def run(tmp_path: Path, *extra: str, pair_b: dict | None = None) -> dict:
    inventory = filled_copy("example_pairs", tmp_path / "inventories")
    (inventory / "router.yml").write_text(yaml.safe_dump({"spark_router": {"hosts": {"router-1": {
        "ansible_host": "240.0.0.9", "router_drain_timeout": 700}}}}))
    if pair_b:
        group_vars = inventory / "group_vars" / "pair_b.yml"
        group_vars.write_text(yaml.safe_dump({**yaml.safe_load(group_vars.read_text()), **pair_b}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(out=tmp_path))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
            "-c", "local", *extra, str(playbook)]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp_path / "plan.json").read_text())


def test_each_cluster_gets_its_run_with_the_rolling_runs_inventory_and_extra_variables(tmp_path: Path) -> None:
    extra = '{"rolling_allow_downtime": true, "rolling_clusters": ["pair_b", "pair_a"]}'
    plan = run(tmp_path, "-e", extra)
    assert not plan.get("failed"), plan.get("msg")
    assert plan["changed_names"] == ["pair_b", "pair_a"]
    assert plan["drain_timeout"] == 700
    assert plan["routers"][0]["socket"] == "/run/dgxspark-router/admin.sock"
    assert plan["routers"][0]["map_file"] == "/etc/dgxspark/router/models.map"
    assert plan["routers"][0]["state_file"] == "/etc/dgxspark/router/server-state"
    step = plan["steps"][0]
    inventory = str(tmp_path / "inventories" / "example_pairs")
    assert step["argv"][1:] == ["/collection/playbooks/site.yml", "--limit", "pair_b", "--skip-tags", "router",
                                "--inventory", inventory, "--extra-vars", extra, "--connection", "local"]
    assert os.path.basename(step["argv"][0]) == "ansible-playbook"
    assert step["model"] == "qwen3-coder" and step["head"] == "spark-b1"
    assert plan["chdir"] == str(ROOT)


def test_the_pairs_of_different_models_are_refused_without_downtime_allowed(tmp_path: Path) -> None:
    plan = run(tmp_path)
    assert plan["failed"]
    assert "no cluster was drained or changed" in plan["msg"]
    assert [p.split(":")[0] for p in plan["problems"]] == ["pair_a is the only cluster serving glm-5.3-flash",
                                                           "pair_b is the only cluster serving qwen3-coder"]


def test_one_model_name_served_with_two_settings_is_refused(tmp_path: Path) -> None:
    plan = run(tmp_path, pair_b={"dgxspark_vllm_profile": "glm53_flash_nvfp4", "dgxspark_vllm_max_model_len": 4096})
    assert plan["failed"]
    assert len(plan["problems"]) == 1
    assert plan["problems"][0].startswith("pair_a and pair_b both serve glm-5.3-flash with different settings "
                                          "(max_model_len: pair_a ")
