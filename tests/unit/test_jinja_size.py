# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jinja stays small in the YAML of roles/, playbooks/ and extensions/molecule/: no expression over
MAX_EXPRESSION characters and no message template over MAX_MESSAGE (whitespace collapsed). An expression you have
to scroll is a function that belongs in Python (a module's return value, module_utils), or, where it only selects,
a few named vars.

Measured: every ``{{ ... }}`` in a YAML file; every bare condition (``when``, ``that``, ``failed_when``,
``changed_when``, ``until``: Jinja without braces); every ``msg``/``fail_msg``/``success_msg`` value holding Jinja.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TREES = ("roles", "playbooks", "extensions/molecule")
MAX_EXPRESSION = 200
MAX_MESSAGE = 400
CONDITIONS = ("when", "that", "failed_when", "changed_when", "until")
MESSAGES = ("msg", "fail_msg", "success_msg")
EXPRESSION = re.compile(r"\{\{.*?\}\}", re.S)

# Files over the limits, each naming what is over: the scenarios that run on request only, whose YAML changes when
# they run next in the lab. Empty it as they are fixed (the test fails when a file listed here is no longer over, so
# the list cannot go stale).
PENDING: dict[str, list[str]] = {}


def collapsed(text: str) -> str:
    return " ".join(text.split())


def _strings(node: Any, key: str | None = None) -> Iterator[tuple[str | None, str]]:
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _strings(value, str(name))
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, key)
    elif isinstance(node, str):
        yield key, node


def over_limits(text: str) -> list[str]:
    """What in one YAML file's text is over the limits, worded for the failure."""
    found = []
    for match in EXPRESSION.finditer(text):
        size = len(collapsed(match.group(0)))
        if size > MAX_EXPRESSION:
            found.append(f"expression of {size} characters at line {text[:match.start()].count(chr(10)) + 1}")
    for document in yaml.safe_load_all(text):
        for key, value in _strings(document):
            size = len(collapsed(value))
            if key in CONDITIONS and "{{" not in value and size > MAX_EXPRESSION:
                found.append(f"condition ({key}) of {size} characters: {collapsed(value)[:60]}...")
            if key in MESSAGES and "{{" in value and size > MAX_MESSAGE:
                found.append(f"message template ({key}) of {size} characters: {collapsed(value)[:60]}...")
    return found


def yaml_files() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for tree in TREES for pattern in ("*.yml", "*.yaml")
                  for path in (ROOT / tree).rglob(pattern))


def test_the_trees_hold_yaml() -> None:
    assert len(yaml_files()) > 100


@pytest.mark.parametrize("name", yaml_files())
def test_jinja_within_limits(name: str) -> None:
    found = over_limits((ROOT / name).read_text(encoding="utf-8"))
    if name in PENDING:
        assert found == PENDING[name], f"{name}: update PENDING (or remove the entry) to what is over now: {found}"
    else:
        assert found == [], f"{name}: Jinja over the limits (move the computing into Python): {found}"


def test_pending_files_exist() -> None:
    assert all((ROOT / name).is_file() for name in PENDING)


@pytest.mark.parametrize(("text", "expected"), [
    ("x: \"{{ a }}\"\n", []),
    ("x: \"{{ " + "a " * 99 + "}}\"\n", ["expression of 203 characters at line 1"]),
    ("- when: " + "a and " * 40 + "b\n", ["condition (when) of 241 characters: " + ("a and " * 10)[:60] + "..."]),
    ("msg: \"" + "word " * 80 + "{{ a }}\"\n", ["message template (msg) of 407 characters: " + ("word " * 12)[:60] + "..."]),
    ("msg: \"" + "word " * 90 + "\"\n", []),                           # no Jinja: not a template
    ("x: >-\n  {{ a\n     }}\n", []),                                  # whitespace collapsed
])
def test_measure(text: str, expected: list[str]) -> None:
    assert over_limits(text) == expected
