# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group guard's SSH access is removed by the entry point that teardown and dgxspark_vllm_guard: false run: every
file, folder and account roles/guard/tasks/access.yml puts on a node, disarm.yml removes (rendered with the role's
defaults and vars), and both callers run disarm."""
from __future__ import annotations

import posixpath
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "roles" / "guard" / "tasks"


def _load(path: Path) -> list:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _query(name: str, program: str, dest: str, read_as: str = "") -> list:
    """The dgxspark.vllm.node_program lookup (the one vars/main.yml calls), over the collection's own files."""
    from ansible_collections.dgxspark.vllm.plugins.module_utils._program_files import node_files, read_items
    assert name == "dgxspark.vllm.node_program"
    utils = ROOT / "plugins" / "module_utils"
    entries = node_files(program, (ROOT / "roles" / "guard" / "files" / program).read_text(encoding="utf-8"), dest,
                         lambda util: (utils / util).read_text(encoding="utf-8") if (utils / util).is_file() else None)
    return read_items(entries, read_as) if read_as else entries


def _variables() -> dict:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.globals["query"] = _query
    variables = dict(_load(ROOT / "roles" / "guard" / "defaults" / "main.yml"))
    # what vars/main.yml reads of the play: the resolved configuration's head, and the head's facts (none here)
    variables.update(dgxspark_vllm_config={"head": "lab-head"}, hostvars={"lab-head": {}})
    for key, value in _load(ROOT / "roles" / "guard" / "vars" / "main.yml").items():
        try:
            variables[key] = env.from_string(value).render(**variables) if isinstance(value, str) else value
        except (jinja2.UndefinedError, jinja2.TemplateRuntimeError, jinja2.TemplateAssertionError):
            variables[key] = value   # it reads a task's result or an Ansible filter: rendered where a test needs it
    # what access.yml takes from dgxspark.vllm.guard_config's plan: the role's own paths and account (prepare.yml)
    variables["__guard_plan"] = {"access": {"user": variables["guard_ssh_user"],
                                            "program": variables["__guard_worker_program"]}}
    return variables


def _render(value: str, variables: dict) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["dirname"] = posixpath.dirname
    return env.from_string(value).render(**variables)


MODULES = ("ansible.builtin.file", "ansible.builtin.copy", "ansible.builtin.template", "ansible.builtin.user",
           "ansible.builtin.command")


def _touched(tasks: list, variables: dict, removing: bool) -> tuple[set, set]:
    """(paths, accounts) the tasks remove (state absent) when `removing`, else those they create."""
    paths, accounts = set(), set()
    for task in tasks:
        for module, args in ((m, task[m]) for m in MODULES if isinstance(task.get(m), dict)):
            if (args.get("state") == "absent") != removing:
                continue
            if module == "ansible.builtin.user":
                accounts.add(_render(args["name"], variables))
                continue
            raw = args.get("dest") or args.get("path") or args.get("creates")
            for item in ((task.get("loop") or [None]) if raw else []):
                if isinstance(item, dict):   # {path, found}: what the item removes, and whether the read found it
                    item = {"path": _render(item["path"], variables)}
                elif item:
                    item = _render(item, variables)
                paths.add(_render(raw, dict(variables, item=item)))
    return paths, accounts


def test_disarm_removes_everything_the_access_puts_on_the_nodes():
    variables = _variables()
    made, accounts = _touched(_load(TASKS / "access.yml"), variables, removing=False)
    removed, gone = _touched(_load(TASKS / "disarm.yml"), variables, removing=True)
    assert accounts == gone == {"dgxspark-guard"}
    left = {path for path in made if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in removed)}
    # the worker program's folder stays (empty); the head's program, configuration and state stay for status.yml
    assert left == {"/usr/local/lib/dgxspark-guard"}
    assert {"/etc/dgxspark/guard/id_ed25519", "/etc/sudoers.d/dgxspark-guard",
            "/var/lib/dgxspark-guard/.ssh/authorized_keys",
            "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"} <= made
    assert removed == {"/etc/dgxspark/guard", "/etc/sudoers.d/dgxspark-guard", "/var/lib/dgxspark-guard",
                       "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"}


def test_disarm_removes_the_power_first_and_runs_after_the_guard_stopped():
    names = [task["name"] for task in _load(TASKS / "disarm.yml")]
    stop = names.index("Stop the guard and keep it from starting at boot")
    order = [next(i for i, name in enumerate(names) if word in name)
             for word in ("sudo rule", "Remove the account the guard's key logs in as", "authorized_keys", "SSH key")]
    assert stop < order[0] and order == sorted(order)


def test_disarm_reads_each_node_once_and_removes_only_what_the_read_found():
    """A node with nothing of the guard on it costs disarm one read (a launch with the guard off, a teardown of a
    cluster never guarded): every removal and stop waits on that read, which looks at each thing removed."""
    variables = _variables()
    tasks = _load(TASKS / "disarm.yml")
    read = tasks[0]
    assert read["ansible.builtin.import_role"] == {"name": "dgxspark.vllm.cache_flush", "tasks_from": "follow"}
    assert read["vars"]["cache_flush_follow_state"] == "stopped"
    assert "__guard_disarm_head_read" in read["vars"]["cache_flush_read_also"]
    assert "__guard_disarm_worker_read" in read["vars"]["cache_flush_read_also"]
    raw = _load(ROOT / "roles" / "guard" / "vars" / "main.yml")
    looked = {_render(item["path"], variables) for side in ("__guard_disarm_head_read", "__guard_disarm_worker_read")
              for item in raw[side]["files"]}
    removed, accounts = _touched(tasks, variables, removing=True)
    for path in removed:   # the file itself, or a file the install puts in the folder
        assert any(seen == path or seen.startswith(path + "/") for seen in looked), path
    assert "/etc/passwd" in looked and accounts == {"dgxspark-guard"}
    assert raw["__guard_disarm_head_read"]["units"] == ["{{ guard_service_name }}.service"]
    for task in tasks[1:]:
        when = task["when"] if isinstance(task["when"], list) else [task["when"]]
        assert any(word in condition for condition in when
                   for word in ("cache_flush_read", "__guard_disarm_", "item.found")), task["name"]
    loop = [task for task in tasks if "loop" in task][0]
    assert all("found" in item for item in loop["loop"])


@pytest.mark.parametrize("passwd, found", [
    ("root:x:0:0::/root:/bin/bash\ndgxspark-guard:x:998:998::/var/lib/dgxspark-guard:/bin/sh\n", True),
    ("root:x:0:0::/root:/bin/bash\nxdgxspark-guard:x:1:1::/:/bin/sh\ndgxspark-guards:x:2:2::/:/bin/sh\n", False),
])
def test_disarm_finds_the_account_by_its_line_in_passwd(passwd: str, found: bool) -> None:
    from ansible.plugins.filter.core import regex_escape
    from ansible.plugins.test.core import match
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["regex_escape"] = regex_escape
    env.tests["match"] = match
    expression = _load(ROOT / "roles" / "guard" / "vars" / "main.yml")["__guard_disarm_account"]
    read = {"also": {"by_name": {"passwd": {"content": passwd}}}}
    assert env.from_string(expression).render(cache_flush_read=read, guard_ssh_user="dgxspark-guard") == str(found)


def test_teardown_and_a_guard_turned_off_run_disarm():
    teardown = _load(ROOT / "roles" / "operations" / "tasks" / "teardown.yml")
    assert teardown[0]["ansible.builtin.include_role"] == {"name": "dgxspark.vllm.guard", "tasks_from": "disarm",
                                                           "apply": {"tags": ["teardown"]}}
    # the launch's playbook (before the launch), and the upgrade's relaunch (before it stops the group)
    launch = [task for play in _load(ROOT / "playbooks" / "launch.yml") for task in play.get("tasks", [])]
    relaunch = _load(ROOT / "roles" / "upgrade" / "tasks" / "relaunch.yml")
    for tasks in (launch, relaunch):
        off = [task for task in tasks if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "disarm"]
        assert [task["when"] for task in off] == ["not dgxspark_vllm_config.guard"]


def test_the_webhook_url_file_is_root_only_no_log_what_the_next_read_compares_and_under_the_removed_folder():
    """install.yml writes guard_webhook_url, no_log, 0600 root, with the text _guard.webhook_file_text makes (the next
    run compares its SHA-256), at the path prepare.yml reads and passes to guard_config; disarm.yml's removal of the
    guard's folder takes it along."""
    from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard as G
    variables = _variables()
    tasks = {task["name"]: task for task in _load(TASKS / "install.yml")}
    write = tasks["Write the URL the guard notifies, root's only (guard_webhook_url)"]
    copy = write["ansible.builtin.copy"]
    assert (copy["owner"], copy["group"], copy["mode"]) == ("root", "root", "0600")
    assert write["no_log"] == "{{ dgxspark_vllm_config.secure_logging }}"
    url = "https://hooks.example/sekrit"
    ansible_like = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)   # as a task's args
    assert ansible_like.from_string(copy["content"]).render(guard_webhook_url=url) == G.webhook_file_text(url)
    assert copy["dest"] == "{{ __guard_plan.webhook.path }}"
    prepare = _load(TASKS / "prepare.yml")
    plan = next(task for task in prepare if "dgxspark.vllm.guard_config" in task)["dgxspark.vllm.guard_config"]
    assert plan["webhook_path"] == "{{ __guard_webhook_path }}" and plan["webhook_url"] == "{{ guard_webhook_url }}"
    path = _render("{{ __guard_webhook_path }}", variables)
    removed = [_render(task["ansible.builtin.file"]["path"], variables) for task in _load(TASKS / "disarm.yml")
               if task.get("ansible.builtin.file", {}).get("state") == "absent" and "loop" not in task]
    assert posixpath.dirname(path) in removed
