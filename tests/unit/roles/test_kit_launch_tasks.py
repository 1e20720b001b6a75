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
