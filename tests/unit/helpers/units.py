# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The systemd units the collection installs, rendered from their role templates with the role defaults.

Every ``roles/*/templates/*.{service,socket,timer,path,mount}.j2`` is rendered as ansible.builtin.template renders it
(trim_blocks on, the trailing newline kept, Ansible's own core filters `comment` and `dirname`; byte for byte the
same), with its role's defaults, under the name its role installs it as (the role's ``<template>_service_name``,
e.g. ``cache_flush_service_name`` for cache-flush.service.j2). The flush template is rendered a second time as the
follow-mode unit, with the variables the cache_flush role's follow_install.yml passes.
``python tests/unit/helpers/units.py DIR`` writes them to DIR, for ``systemd-analyze security --offline=true DIR/<unit>``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jinja2
import yaml
from ansible.plugins.filter.core import FilterModule

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"
ANSIBLE_MANAGED = "Ansible managed"
UNIT_KINDS = ("service", "socket", "timer", "path", "mount")


def role_defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text(encoding="utf-8")) or {}


def render(role: str, template: str, **variables) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    core = FilterModule().filters()
    env.filters.update({name: core[name] for name in ("comment", "dirname")})
    variables = {"ansible_managed": ANSIBLE_MANAGED, "dgxspark_vllm_config": {"firewall": True},
                 **role_defaults(role), **variables}
    # a default that is itself a template (guard_firewall_unit) is rendered first, as Ansible does
    variables = {key: env.from_string(value).render(**variables) if isinstance(value, str) and "{{" in value else value
                 for key, value in variables.items()}
    return env.from_string((ROLES / role / "templates" / template).read_text(encoding="utf-8")).render(**variables)


def unit_templates() -> list:
    """Every unit template of every role, as (role, template file name)."""
    return sorted((path.parts[-3], path.name) for kind in UNIT_KINDS
                  for path in ROLES.glob("*/templates/*.%s.j2" % kind))


def _variants(role: str, template: str, variables: dict) -> list:
    """(unit file name, variables) of each unit the role installs from `template`."""
    stem, kind = template[:-len(".j2")].rsplit(".", 1)
    name = variables.get(stem.replace("-", "_") + "_service_name", stem) + "." + kind
    out = [(name, variables)]
    if (role, template) == ("cache_flush", "cache-flush.service.j2"):   # follow mode: roles/cache_flush/tasks/follow_install.yml
        follow = {**variables, "__cache_flush_follow": True,
                  "cache_flush_config_path": variables["cache_flush_follow_config_path"],
                  "cache_flush_service_name": variables["cache_flush_follow_service_name"]}
        out.append((follow["cache_flush_service_name"] + "." + kind, follow))
    return out


def units(**overrides) -> dict:
    """{unit file name: text} of every unit the collection installs, with the role defaults (and `overrides`)."""
    out = {}
    for role, template in unit_templates():
        for name, variables in _variants(role, template, {**role_defaults(role), **overrides}):
            out[name] = render(role, template, **variables)
    return out


def write_units(directory: Path, **overrides) -> dict:
    """Write every unit to `directory`; {unit file name: path}."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in units(**overrides).items():
        paths[name] = directory / name
        paths[name].write_text(text, encoding="utf-8")
    return paths


if __name__ == "__main__":
    for written in write_units(Path(sys.argv[1])).values():
        print(written)
