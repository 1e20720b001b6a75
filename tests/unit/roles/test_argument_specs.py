# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every role's entry points: meta/argument_specs.yml against defaults/main.yml and the task files, and the roles
talking through entry points (the API key's header built in one place; no role reading another's internals).

A role with defaults/main.yml and meta/argument_specs.yml is checked. Its `main` entry point documents every
default; a role without tasks/main.yml (only `tasks_from` entry points, as dgxspark.vllm.cluster) documents each
default in at least one entry point.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"

SPEC_TYPES = {
    "str": (str,), "path": (str,), "int": (int,), "float": (float, int), "bool": (bool,),
    "list": (list,), "dict": (dict,), "raw": (object,),
}


def roles_with_specs() -> list:
    return sorted(path.name for path in ROLES.iterdir()
                  if (path / "defaults" / "main.yml").is_file() and (path / "meta" / "argument_specs.yml").is_file())


def load_specs(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))["argument_specs"]


def _type_ok(value, spec_type):
    if value is None or (isinstance(value, str) and "{{" in value):
        return True  # unset, or decided at run time: nothing to compare statically
    if spec_type in ("int", "float") and isinstance(value, bool):
        return False
    return isinstance(value, SPEC_TYPES[spec_type])


def spec_problems(defaults: dict, specs: dict, has_main: bool = True) -> list:
    """Drift between a role's defaults and its argument_specs, as readable messages (empty: they agree).

    Every default must be an option of `main` (of any entry point when the role has no `main`) with a matching type;
    every option of any entry point must have a default unless it is required; a spec `default` must equal the
    defaults/ value and sit in `choices`.
    """
    problems = []
    main = (specs.get("main") or {}).get("options") or {}
    if has_main and not main:
        problems.append("no `main` entry point with options")
    if has_main:
        documented, where_documented = set(main), "the main entry point"
    else:
        documented = {name for spec in specs.values() for name in ((spec or {}).get("options") or {})}
        where_documented = "any entry point"
    for name in sorted(set(defaults) - documented):
        problems.append("%s is in defaults/main.yml but not an option of %s" % (name, where_documented))
    for entry, spec in sorted(specs.items()):
        for name, option in sorted(((spec or {}).get("options") or {}).items()):
            where = "%s.%s" % (entry, name)
            spec_type = option.get("type", "str")
            if spec_type not in SPEC_TYPES:
                problems.append("%s has unknown type %r" % (where, spec_type))
                continue
            if name not in defaults:
                if not option.get("required", False):
                    problems.append("%s is neither required nor in defaults/main.yml" % where)
                continue
            value = defaults[name]
            if not _type_ok(value, spec_type):
                problems.append("%s is type %s but defaults/main.yml has %r (%s)" % (where, spec_type, value, type(value).__name__))
            if "default" in option and option["default"] != value:
                problems.append("%s default %r differs from defaults/main.yml %r" % (where, option["default"], value))
            templated = isinstance(value, str) and "{{" in value   # decided at run time
            if "choices" in option and not templated and value not in option["choices"]:
                problems.append("%s default %r is not among choices %r" % (where, value, option["choices"]))
    return problems


@pytest.mark.parametrize("role", [role for role in roles_with_specs() if role != "dgxspark_vllm"])
def test_argument_specs_match_defaults(role):
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text(encoding="utf-8")) or {}
    has_main = (ROLES / role / "tasks" / "main.yml").is_file()
    assert spec_problems(defaults, load_specs(role), has_main=has_main) == []


@pytest.mark.parametrize("role", sorted(path.name for path in ROLES.iterdir() if (path / "meta" / "argument_specs.yml").is_file()))
def test_every_entry_point_is_a_task_file(role):
    """An entry point is what `tasks_from: <name>` runs: tasks/<name>.yml (a spec for anything else is never checked)."""
    missing = [entry for entry in load_specs(role) if not (ROLES / role / "tasks" / ("%s.yml" % entry)).is_file()]
    assert missing == []


@pytest.mark.parametrize(("defaults", "specs", "problem"), [
    ({"r_a": 1, "r_b": 2}, {"main": {"options": {"r_a": {"type": "int"}}}}, "r_b is in defaults/main.yml but not an option"),
    ({"r_a": 1}, {"main": {"options": {"r_a": {"type": "int"}, "r_c": {"type": "str"}}}}, "main.r_c is neither required nor in defaults"),
    ({"r_a": "5"}, {"main": {"options": {"r_a": {"type": "int"}}}}, "main.r_a is type int but defaults/main.yml has '5'"),
    ({"r_a": True}, {"main": {"options": {"r_a": {"type": "int"}}}}, "main.r_a is type int"),
    ({"r_a": 1}, {"main": {"options": {"r_a": {"type": "bool"}}}}, "main.r_a is type bool"),
    ({"r_a": 1}, {"main": {"options": {"r_a": {"type": "int", "default": 2}}}}, "main.r_a default 2 differs"),
    ({"r_a": "x"}, {"main": {"options": {"r_a": {"choices": ["y"]}}}}, "main.r_a default 'x' is not among choices"),
    ({"r_a": 1}, {"main": {"options": {"r_a": {"type": "int"}}}, "start": {"options": {"r_a": {"type": "str"}}}}, "start.r_a is type str"),
    ({"r_a": 1}, {"main": {"options": {"r_a": {"type": "integer"}}}}, "unknown type 'integer'"),
    ({"r_a": 1}, {"start": {"options": {"r_a": {"type": "int"}}}}, "no `main` entry point"),
])
def test_spec_checker_catches_drift(defaults, specs, problem):
    assert any(problem in message for message in spec_problems(defaults, specs)), spec_problems(defaults, specs)


@pytest.mark.parametrize(("defaults", "specs", "problem"), [
    ({"r_a": 1, "r_b": 2}, {"stop": {"options": {"r_a": {"type": "int"}}}}, "r_b is in defaults/main.yml but not an option of any entry point"),
    ({"r_a": "x"}, {"stop": {"options": {"r_a": {"type": "int"}}}}, "stop.r_a is type int"),
    ({"r_a": 1}, {"stop": {"options": {"r_a": {"type": "int"}}}, "copy": {"options": {"r_b": {"type": "str"}}}}, "copy.r_b is neither required"),
])
def test_spec_checker_without_main_catches_drift(defaults, specs, problem):
    assert any(problem in message for message in spec_problems(defaults, specs, has_main=False)), spec_problems(defaults, specs, has_main=False)


def test_spec_checker_accepts_required_and_templated():
    specs = {"main": {"options": {"r_a": {"type": "int"}, "r_req": {"type": "str", "required": True}, "r_p": {"type": "path"}}}}
    assert spec_problems({"r_a": "{{ other | int }}", "r_p": None}, specs) == []


def test_spec_checker_accepts_entry_points_without_main():
    specs = {"stop": {"options": {"r_a": {"type": "int"}}}, "copy": {"options": {"r_b": {"type": "str"}, "r_c": {"type": "path", "required": True}}}}
    assert spec_problems({"r_a": 1, "r_b": "x"}, specs, has_main=False) == []


def test_the_config_roles_options_are_the_variables_the_config_step_knows():
    """dgxspark_vllm documents exactly the variables cluster_config resolves (its defaults hold only the secrets)."""
    from ansible_collections.dgxspark.vllm.plugins.module_utils._config import PREFIX, VARIABLES

    options = load_specs("dgxspark_vllm")["main"]["options"]
    assert sorted(options) == sorted(PREFIX + name for name in VARIABLES)
    assert all(option["type"] == "raw" for option in options.values())   # the config step checks types itself
    defaults = yaml.safe_load((ROLES / "dgxspark_vllm" / "defaults" / "main.yml").read_text(encoding="utf-8"))
    assert defaults == {"dgxspark_vllm_api_key": "", "dgxspark_vllm_hf_token": ""}
    assert {name for name in options if options[name].get("no_log")} == set(defaults)


# ---------------------------------------------------------------- roles of entry points only: cluster, operations

ENTRY_POINT_ROLES = {
    "cluster": {"stop", "api_headers", "api_check", "cx7_copy", "follow_job"},
    "operations": {"status", "logs", "teardown", "benchmark", "releases", "baseline"},
}


@pytest.mark.parametrize("role", sorted(ENTRY_POINT_ROLES))
def test_an_entry_point_role_is_checked_and_has_only_its_entry_points(role):
    assert role in roles_with_specs()
    assert set(load_specs(role)) == ENTRY_POINT_ROLES[role]
    assert not (ROLES / role / "tasks" / "main.yml").exists()   # no `main`: callers name the procedure
    assert {path.stem for path in (ROLES / role / "tasks").glob("*.yml")} == ENTRY_POINT_ROLES[role]


@pytest.mark.parametrize("role", sorted(ENTRY_POINT_ROLES))
def test_an_entry_point_roles_variables_are_prefixed(role):
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text(encoding="utf-8"))
    options = {name for spec in load_specs(role).values() for name in ((spec or {}).get("options") or {})}
    assert [name for name in set(defaults) | options if not name.startswith(role + "_")] == []
    tasks = "".join(path.read_text(encoding="utf-8") for path in (ROLES / role / "tasks").glob("*.yml"))
    internals = set(re.findall(r"\b(__[a-z][a-z0-9_]*)", tasks))
    assert [name for name in internals if not name.startswith("__%s_" % role)] == []
    # what the role publishes (register, set_fact) is its own: <role>_*, or __<role>_* inside it
    published = {name for path in (ROLES / role / "tasks").glob("*.yml")
                 for name in _published(yaml.safe_load(path.read_text(encoding="utf-8")) or [])}
    assert published and [name for name in published if not name.lstrip("_").startswith(role + "_")] == []


def _published(tasks: list):
    for task in tasks:
        if "register" in task:
            yield task["register"]
        yield from (task.get("ansible.builtin.set_fact") or {})
        for section in ("block", "rescue", "always"):
            yield from _published(task.get(section) or [])


@pytest.mark.parametrize(("role", "entry"), sorted((role, entry) for role, entries in ENTRY_POINT_ROLES.items() for entry in entries))
def test_every_entry_point_has_a_readme_section(role, entry):
    readme = (ROLES / role / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^## .*`%s`" % entry, readme, re.MULTILINE), "%s/README.md has no section for %s" % (role, entry)


@pytest.mark.parametrize(("playbook", "entry"), [("status", "status"), ("logs", "logs"), ("teardown", "teardown"),
                                                 ("benchmark", "benchmark")])
def test_the_operations_playbooks_are_short_plays_over_the_entry_points(playbook, entry):
    plays = yaml.safe_load((ROOT / "playbooks" / ("%s.yml" % playbook)).read_text(encoding="utf-8"))
    tasks = [task for play in plays for task in play.get("tasks", [])]
    # status.yml also shows the clusters behind the router, a play over spark_router with the router's own entry point
    router = [{"name": "dgxspark.vllm.router", "tasks_from": "status", "apply": {"tags": ["status"]}}] \
        if playbook == "status" else []
    assert [task["ansible.builtin.include_role"] for task in tasks] == [
        {"name": "dgxspark.vllm.operations", "tasks_from": entry, "apply": {"tags": [playbook]}}, *router]


def _yaml_files(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.yml"))


def test_the_api_key_header_is_built_in_one_place():
    """Only dgxspark.vllm.cluster's api_headers turns dgxspark_vllm_api_key into an Authorization header."""
    builders = sorted(str(path.relative_to(ROOT)) for path in _yaml_files("roles", "playbooks")
                      if re.search(r"Bearer\s*['\"]?\s*(~|\{\{)\s*dgxspark_vllm_api_key",
                                   path.read_text(encoding="utf-8")))
    assert builders == ["roles/cluster/tasks/api_headers.yml"]


def test_no_role_or_playbook_reads_another_roles_internals():
    """Roles talk through entry points and public outputs: __<role>_* belongs to <role> alone."""
    roles = sorted((path.name for path in ROLES.iterdir() if path.is_dir()), key=len, reverse=True)
    pattern = re.compile(r"\b__(%s)_[a-z0-9_]+" % "|".join(roles))
    found = set()
    for path in _yaml_files("roles", "playbooks"):
        relative = path.relative_to(ROOT)
        owner = relative.parts[1] if relative.parts[0] == "roles" else None
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            if match.group(1) != owner:
                found.add((str(relative), match.group(0)))
    assert sorted(found) == []
