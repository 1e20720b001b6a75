# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch a reader can follow: the launch role ends when the group serves (the guard is the playbook's, before and
after it), one start loop over the planner's attempts, and a short include chain."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import jinja2
import pytest
import yaml
from ansible.module_utils.parsing.convert_bool import boolean

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"
LAUNCH = ROLES / "launch" / "tasks"
INCLUDES = ("import_tasks", "include_tasks")
ROLE_INCLUDES = ("import_role", "include_role")


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or []


def _tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every task of a task list, those in blocks (and their rescue and always) too, each block before its tasks."""
    for task in items or []:
        yield task
        for part in ("block", "rescue", "always"):
            yield from _tasks(task.get(part, []))


def _action(task: dict[str, Any]) -> tuple[str, Any]:
    for key, value in task.items():
        if key.rpartition(".")[2] in INCLUDES + ROLE_INCLUDES:
            return key.rpartition(".")[2], value
    return "", None


def _edges(path: Path) -> list[Path]:
    """The task files one task file imports or includes (tasks_from, or the role's main)."""
    out = []
    for task in _tasks(_load(path)):
        kind, value = _action(task)
        if kind in INCLUDES:
            out.append(path.parent / (value["file"] if isinstance(value, dict) else value))
        elif kind in ROLE_INCLUDES:
            name = value["name"].rpartition(".")[2]
            out.append(ROLES / name / "tasks" / f"{value.get('tasks_from', 'main')}.yml")
    return out


def _chain(path: Path, seen: tuple[Path, ...] = ()) -> tuple[int, set[Path]]:
    """The longest include chain from a file (a file that includes itself counts once) and every file it reaches."""
    if path in seen:
        return 0, {path}
    depth, files = 0, {path}
    for target in _edges(path):
        below, reached = _chain(target, seen + (path,))
        depth, files = max(depth, below + 1), files | reached
    return depth, files


def test_a_launch_reaches_few_files_three_includes_deep_and_none_of_the_guard() -> None:
    # the launch playbook runs the role's two entry points apart (the guard's lock between them); main is both
    main = [_action(task)[1] for task in _load(LAUNCH / "main.yml")]
    assert main == ["render.yml", "run_plan.yml"]
    depth, files = 0, set()
    for entry in ("render.yml", "run_plan.yml"):
        below, reached = _chain(LAUNCH / entry)
        depth, files = max(depth, below), files | reached
    names = sorted(str(path.relative_to(ROLES)) for path in files)
    assert depth <= 3, names
    # render, node_facts, plan, run_plan, attempt, served; cluster stop, follow_job, api_check, api_headers;
    # cache_flush start, stop
    assert len(files) <= 12, names
    assert not [name for name in names if name.startswith("guard/")], names


def test_one_start_loop_over_the_planners_attempts() -> None:
    run_plan = _load(LAUNCH / "run_plan.yml")
    includes = [task for task in _tasks(run_plan) if _action(task)[0] in INCLUDES + ROLE_INCLUDES]
    attempts = [task for task in includes if "attempt.yml" in str(_action(task)[1])]
    assert len(attempts) == 1
    loop = attempts[0]
    assert loop["loop"] == "{{ launch_plan.attempts }}"
    assert loop["loop_control"]["loop_var"] == "__launch_attempt"
    # a loop's condition is judged for every item before the first runs: only what no turn changes may be in it
    assert "launch_plan" not in str(loop.get("when", ""))
    assert not (LAUNCH / "start.yml").exists() and not (LAUNCH / "start_group.yml").exists()


def test_a_turn_is_judged_once_then_runs_the_start_and_the_diagnosis() -> None:
    first, turn = _load(LAUNCH / "attempt.yml")[:2]
    assert first["ansible.builtin.set_fact"] == {"__launch_turn": "{{ launch_plan.step in __launch_starts }}"}
    # the plan changes inside the turn: its tasks must not ask launch_plan.step whether to run, the turn flag does
    assert turn["when"] == "__launch_turn | bool"
    names = [task.get("name", "") for task in turn["block"]]
    assert names[-1] == "Fail with the diagnosis" and "Plan what follows this start" in names
    assert len(_load(LAUNCH / "attempt.yml")) == 2


def test_the_launch_playbook_keeps_the_guard_out_then_arms_it_in_its_own_play() -> None:
    plays = _load(ROOT / "playbooks" / "launch.yml")
    assert [play["hosts"] for play in plays] == ["spark_cluster"] * 2
    launch, after = plays

    def entries(play: dict[str, Any], role: str) -> list[str]:
        return [_action(task)[1].get("tasks_from", "main") for task in _tasks(play["tasks"])
                if _action(task)[0] == "include_role" and _action(task)[1]["name"] == f"dgxspark.vllm.{role}"]

    # disarmed first (the guard off); the lock between the read and the start; released only in the rescue
    assert entries(launch, "guard") == ["disarm", "maintenance", "release"]
    assert entries(launch, "launch") == ["render", "run_plan"]
    block = launch["tasks"][1]["block"]
    order = [(_action(task)[1]["name"].rpartition(".")[2], _action(task)[1].get("tasks_from", "main"))
             if _action(task)[0] == "include_role" else "report" for task in block]
    assert order == [("launch", "render"), ("guard", "maintenance"), ("launch", "run_plan"), "report",
                     ("kit_launch", "main")]
    # the planner decides whether run_plan has anything to do; a group found serving as planned gets the report only
    carry, report = block[2], block[3]
    assert carry["when"][-1] == "launch_plan.carry_out" and report["when"][-1] == "not launch_plan.carry_out"
    assert report["ansible.builtin.debug"] == {"msg": "{{ launch_plan.message }}"} and report["run_once"] is True
    lock = block[1]
    assert lock["when"][0] == "dgxspark_vllm_config.guard"
    give_back = [task for task in launch["tasks"][1]["rescue"] if _action(task)[0] == "include_role"][0]
    assert _action(give_back)[1]["tasks_from"] == "release"
    assert "launch_plan.attempt | default(0) == 0" in give_back["when"][0]
    assert give_back["vars"] == {"guard_release_any": True}   # the run's lock, whichever step took it
    assert entries(after, "guard") == ["main"]
    arm = [task for task in _tasks(after["tasks"]) if _action(task)[0] == "include_role"][0]
    # a failed upgrade's launch is the rollback's: no guard armed with it
    assert "upgrade_failure is not defined" in arm["when"]
    assert arm["vars"] == {"guard_serving": "{{ launch_plan.serving }}"}


@pytest.mark.parametrize("launcher, attempts, guard, taken", [
    ("docker_run", [], True, False),           # a no-op (or a refusal): no lock taken, none to give back
    ("docker_run", [1], True, True),           # a start with a known KV budget
    ("docker_run", [1, 2], True, True),        # a calibration and its start
    ("docker_run", [1], False, False),         # the guard off: disarmed instead
    ("exl3_kit", None, True, True),            # the kit plans in its own role: the lock before it, always
])
def test_the_lock_is_taken_only_when_the_plan_starts_something(
        launcher: str, attempts: Any, guard: bool, taken: bool) -> None:
    block = _load(ROOT / "playbooks" / "launch.yml")[0]["tasks"][1]["block"]
    when = block[1]["when"]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    variables: dict[str, Any] = {"dgxspark_vllm_config": {"guard": guard, "launcher": launcher}}
    if attempts is not None:
        variables["launch_plan"] = {"attempts": attempts}
    assert all(boolean(env.compile_expression(condition)(**variables)) for condition in when) is taken


def test_the_guard_only_starts_containers_that_exist_so_the_lock_may_follow_the_read() -> None:
    """The launch reads the nodes before it takes the lock: safe only while the guard never makes a container (a
    restore is `docker start` of those it finds, which the read saw, and the first start stops them)."""
    import ast
    files = ROLES / "guard" / "files"
    program = ast.parse((files / "dgxspark_group_guard.py").read_text(encoding="utf-8"))
    verbs = {call.args[0].value for call in ast.walk(program)
             if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "run"
             and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)}
    assert "start" in verbs and not verbs & {"run", "create", "compose", "container"}, verbs
    worker = ast.parse((files / "dgxspark_guard_worker.py").read_text(encoding="utf-8"))
    forms = [node.value for node in ast.walk(worker) if isinstance(node, ast.Assign)
             and any(isinstance(target, ast.Name) and target.id == "OPERATIONS" for target in node.targets)]
    assert len(forms) == 1 and isinstance(forms[0], ast.Dict)
    mutating = {key.value for key in forms[0].keys if isinstance(key, ast.Constant)}   # every docker verb it lets through
    assert "start" in mutating and not mutating & {"run", "create"}, mutating


def test_only_the_step_that_took_the_maintenance_lock_releases_it() -> None:
    staging = _load(ROOT / "playbooks" / "staging.yml")
    holders = [task.get("vars", {}).get("guard_holder") for play in staging for task in _tasks(play.get("tasks", []))
               if _action(task)[0] == "include_role" and _action(task)[1]["name"] == "dgxspark.vllm.guard"]
    assert holders == ["staging", "staging"]
    release = _load(ROLES / "guard" / "tasks" / "release.yml")
    command = [task for task in release if "ansible.builtin.command" in task][0]
    assert "__guard_release_mine" in command["when"] and command["ansible.builtin.command"]["removes"]
    mine = command["vars"]["__guard_release_mine"]
    assert "__guard_held_by | length > 0" in mine and "guard_holder | default(ansible_play_name)" in mine
    assert "guard_release_any | bool or" in mine
    # nothing outside the guard reads its holder fact: the launch's rescue releases with guard_release_any
    outside = [path for folder in ("playbooks", "roles") for path in (ROOT / folder).rglob("*.yml")
               if "roles/guard/" not in path.as_posix()
               and "guard_maintenance_holder |" in path.read_text(encoding="utf-8")]
    assert outside == []
    # the holder is read in one place, the role's vars (every entry point: maintenance, release, arm, prepare)
    held_by = _load(ROLES / "guard" / "vars" / "main.yml")["__guard_held_by"]
    assert "hostvars[dgxspark_vllm_config.head].guard_maintenance_holder" in held_by
    names = ("maintenance.yml", "release.yml", "arm.yml", "arm_steps.yml", "prepare.yml", "prepare_steps.yml")
    tasks = "".join((ROLES / "guard" / "tasks" / name).read_text(encoding="utf-8") for name in names)
    assert "guard_maintenance_holder | default" not in tasks
    # the arm that is left out gives the lock back through release.yml, under whichever step of the run holds it
    # (guard_config's arm_steps: "release", decided from the holder as prepare read it)
    arm = _load(ROLES / "guard" / "tasks" / "arm_steps.yml")
    give_back = [task for task in arm if "ansible.builtin.include_tasks" in task]
    assert [task["ansible.builtin.include_tasks"]["file"] for task in give_back] == ["release.yml"]
    assert give_back[0]["vars"] == {"guard_release_any": True}
    assert give_back[0]["when"] == "'release' in __guard_plan.arm_steps"
    plan = next(task for task in _load(ROLES / "guard" / "tasks" / "prepare.yml") if "dgxspark.vllm.guard_config" in task)
    assert plan["dgxspark.vllm.guard_config"]["lock_mine"] == "{{ __guard_lock_mine }}"
    assert plan["vars"]["__guard_lock_mine"] == "{{ __guard_held_by | length > 0 }}"
    assert not [task for task in arm if "release" in str(task.get("ansible.builtin.command", {}).get("argv", []))]


def test_the_guard_is_installed_before_the_launch_so_the_play_after_it_only_arms() -> None:
    """site.yml's step before the launch (cache_flush.yml) installs the guard, not armed: the launch's last play finds
    it installed, off the launch's critical path (bench/launch.sh times the install apart)."""
    site = [entry["ansible.builtin.import_playbook"] for entry in _load(ROOT / "playbooks" / "site.yml")
            if "ansible.builtin.import_playbook" in entry]
    assert site.index("cache_flush.yml") < site.index("launch.yml")
    plays = _load(ROOT / "playbooks" / "cache_flush.yml")
    assert [play["hosts"] for play in plays] == ["spark_cluster", "spark_cluster"]
    install = [task for task in _tasks(plays[1]["tasks"]) if _action(task)[0] == "include_role"]
    assert [(_action(task)[1]["name"], _action(task)[1]["tasks_from"]) for task in install] == [
        ("dgxspark.vllm.guard", "prepare")]
    assert install[0]["when"] == "dgxspark_vllm_config.guard"
    # no arm decided here (prepare's default guard_serving); nothing started: the guard's unit requires the firewall's,
    # which only the launch insists on (cache_flush.yml runs alone too), and the launch's last play starts it
    assert install[0]["vars"] == {"guard_install_only": True}
    # (guard_config's prepare_steps never holds "start" with install_only: test_guard.py)
    start = [task for task in _load(ROLES / "guard" / "tasks" / "prepare_steps.yml")
             if "ansible.builtin.systemd_service" in task and task["ansible.builtin.systemd_service"]["state"] == "started"]
    assert len(start) == 1 and "'start' in __guard_plan.prepare_steps" in start[0]["when"]
    plan = next(task for task in _load(ROLES / "guard" / "tasks" / "prepare.yml") if "dgxspark.vllm.guard_config" in task)
    assert plan["dgxspark.vllm.guard_config"]["install_only"] == "{{ guard_install_only | bool }}"
    # nor is the follow-mode flush service started: before the first launch it would follow that load beside the
    # launch's own flush service (the one the launch's verify reads); the arm's run of prepare starts it
    follow = [task for task in _load(ROLES / "guard" / "tasks" / "prepare.yml")
              if _action(task)[0] == "import_role" and _action(task)[1]["tasks_from"] == "follow"]
    assert len(follow) == 1 and follow[0]["vars"]["cache_flush_follow_state"] == "{{ __guard_follow_state }}"
    templates = jinja2.Environment(undefined=jinja2.StrictUndefined)
    templates.filters["bool"] = boolean
    state = templates.from_string(_load(ROLES / "guard" / "vars" / "main.yml")["__guard_follow_state"])
    assert [state.render(guard_install_only=value) for value in (True, False)] == ["installed", "started"]
    starts = [task for task in _load(ROLES / "cache_flush" / "tasks" / "follow_install.yml")
              if "ansible.builtin.systemd_service" in task]
    assert [task["when"][0] for task in starts] == [
        "cache_flush_follow_state == 'started'", "cache_flush_follow_state == 'installed'"]
    assert "'started'" not in starts[1]["ansible.builtin.systemd_service"]["state"]   # restarted where it runs, or none
    bench = (ROOT / "bench" / "launch.sh").read_text(encoding="utf-8")
    teardown = bench.index("playbooks/teardown.yml")
    install_run = bench.index('playbooks/cache_flush.yml >"$tmp/install.out"')
    assert teardown < install_run < bench.index("t0=$(date")
