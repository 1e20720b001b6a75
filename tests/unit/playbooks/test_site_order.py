# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/site.yml runs the recipe's steps in order; the firewall comes before staging, whose fan-out and image
transfer use the CX7 link (a cluster grown from two nodes to four must admit its new nodes first)."""
from __future__ import annotations

import pathlib

import yaml

SITE = pathlib.Path(__file__).resolve().parents[3] / "playbooks" / "site.yml"


def _imported() -> list[str]:
    return [play["ansible.builtin.import_playbook"] for play in yaml.safe_load(SITE.read_text(encoding="utf-8"))
            if "ansible.builtin.import_playbook" in play]


def test_the_steps_run_in_the_recipes_order_with_the_firewall_before_staging() -> None:
    # the router last, over the hosts of spark_router: every cluster must answer it
    assert _imported() == ["preflight.yml", "firewall.yml", "staging.yml", "cache_flush.yml", "launch.yml",
                           "verify.yml", "router.yml"]


def test_a_rescue_that_hands_an_upgrades_failure_on_has_no_condition_of_its_block() -> None:
    """A block's condition applies to its rescue task by task: the rescue sets upgrade_failure, so a block condition
    on it would skip the rescue's last task (clear_host_errors) and leave the failed nodes out of the rollback."""
    found = 0
    for playbook in sorted(SITE.parent.glob("*.yml")):
        for play in yaml.safe_load(playbook.read_text(encoding="utf-8")) or []:
            for task in play.get("tasks") or []:
                rescue = task.get("rescue") or []
                if any((item.get("ansible.builtin.include_role") or {}).get("tasks_from") == "failure" for item in rescue):
                    found += 1
                    assert "when" not in task, f"{playbook.name}: {task['name']}"
    assert found >= 2   # launch.yml and verify.yml
