# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kit_launch role carries out what its planner (kit_launch_plan) decides: no Jinja expression it would have to
scroll, no message worded in a template, and how a start is watched read from the cluster's timing only."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "kit_launch"
EXPRESSION = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
MESSAGES = ("msg", "fail_msg", "success_msg")
TIMING = ("budgets", "poll_interval", "peer_grace_seconds", "api_timeout", "diagnosis_lines")


def _strings(node: Any, key: str = "") -> list[tuple[str, str]]:
    """Every string of a task file with the key it is the value of."""
    if isinstance(node, str):
        return [(key, node)]
    if isinstance(node, dict):
        return [found for name, value in node.items() for found in _strings(value, str(name))]
    if isinstance(node, list):
        return [found for value in node for found in _strings(value, key)]
    return []


def _task_strings() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        out += [(path.name, key, text) for key, text in _strings(yaml.safe_load(path.read_text(encoding="utf-8")))]
    return out


def test_no_jinja_expression_over_200_characters() -> None:
    long = [(name, len(expr), expr[:80]) for name, _key, text in _task_strings()
            for expr in EXPRESSION.findall(text) if len(" ".join(expr.split())) > 200]
    assert long == []


def test_no_message_template_over_400_characters() -> None:
    long = [(name, key, len(text)) for name, key, text in _task_strings()
            if key in MESSAGES and "{" in text and len(" ".join(text.split())) > 400]
    assert long == []


def test_the_watch_reads_the_clusters_timing_and_the_role_defines_none() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    assert [name for name in defaults if name.removeprefix("kit_launch_") in TIMING] == []
    texts = " ".join(text for _name, _key, text in _task_strings())
    assert "dgxspark_vllm_config.timing.budgets" in texts
    assert re.findall(r"kit_launch_(?:budgets|poll_interval|peer_grace_seconds|api_timeout|diagnosis_lines)", texts) == []


def _tasks(name: str) -> list[dict[str, Any]]:
    return yaml.safe_load((ROLE / "tasks" / name).read_text(encoding="utf-8"))


def test_the_watch_runs_the_planners_steps_and_judges_no_result_itself() -> None:
    """Each wait of a start runs when it is the planner's step, on the rank the planner names; no condition of the
    role reads a wait's verdict (``.ok``, ``.finished``, ``.rc``): the planner (kit_launch_plan) judges them."""
    start = _tasks("start.yml")
    steps = [task for task in start if set(task) & {"dgxspark.vllm.vllm_startup_wait", "ansible.builtin.async_status"}]
    assert len(steps) == 4
    for task in steps:
        assert task["when"].startswith("__kit_launch_step.step == '") and "__kit_launch_step.host" in task["when"]
    judges = [task for task in start if "dgxspark.vllm.kit_launch_plan" in task]
    assert len(judges) == 5 and all(task["register"] == "__kit_launch_step" for task in judges)
    conditions = [str(task.get("when", "")) for name in ("main.yml", "start.yml", "fail.yml", "prepare.yml")
                  for task in _tasks(name)]
    assert [text for text in conditions if re.search(r"\.(ok|finished|rc)\b", text)] == []


def test_the_record_and_the_cluster_check_are_the_planners() -> None:
    texts = " ".join(text for _name, _key, text in _task_strings())
    assert "now(" not in texts and "to_json" not in texts   # the record's text is the planner's (start_record)
    assert "difference(ansible_play_hosts_all)" not in texts   # the cluster check is the planner's (cluster_problem)
