# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group guard's SSH access is removed by the entry point that teardown and dgxspark_vllm_guard: false run: every
file, folder and account roles/guard/tasks/access.yml puts on a node, disarm.yml removes (rendered with the role's
defaults and vars), and both callers run disarm."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.dgxspark.vllm.plugins.module_utils._service_state import parse_show, unit_state

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


# the role's vars that read a task's result (the read's cache_flush_read) or a caller's switch, not paths
RUNTIME_VARS = {"__guard_follow_state", "__guard_disarm_account", "__guard_disarm_worker_found", "__guard_disarm_etc",
                "__guard_disarm_worker_removals"}


def _variables() -> dict:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.globals["query"] = _query
    variables = dict(_load(ROOT / "roles" / "guard" / "defaults" / "main.yml"))
    # what vars/main.yml reads of the play: the resolved configuration's head, and the head's facts (none here)
    variables.update(dgxspark_vllm_config={"head": "lab-head"}, hostvars={"lab-head": {}})
    for key, value in _load(ROOT / "roles" / "guard" / "vars" / "main.yml").items():
        if key in RUNTIME_VARS:
            variables[key] = value   # it reads a task's result: evaluated where a test needs it (_runs)
            continue
        variables[key] = env.from_string(value).render(**variables) if isinstance(value, str) else value
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
            loop = task.get("loop") or [None]
            if isinstance(loop, str):   # a list of the role's vars, named in the loop's expression
                loop = next(variables[name] for name in re.findall(r"__guard_\w+", loop) if name in variables)
            for item in (loop if raw else []):
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
    assert all("found" in item for item in raw["__guard_disarm_worker_removals"])


@pytest.mark.parametrize("passwd, found", [
    ("root:x:0:0::/root:/bin/bash\ndgxspark-guard:x:998:998::/var/lib/dgxspark-guard:/bin/sh\n", True),
    ("root:x:0:0::/root:/bin/bash\nxdgxspark-guard:x:1:1::/:/bin/sh\ndgxspark-guards:x:2:2::/:/bin/sh\n", False),
    (None, False),   # no passwd read (the head)
])
def test_disarm_finds_the_account_by_its_line_in_passwd(passwd, found: bool) -> None:
    expression = _load(ROOT / "roles" / "guard" / "vars" / "main.yml")["__guard_disarm_account"]
    by_name = {} if passwd is None else {"passwd": {"exists": True, "content": passwd}}
    variables = {"cache_flush_read": {"also": {"by_name": by_name}}, "guard_ssh_user": "dgxspark-guard"}
    assert Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression)) is found


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


def _trusted(value):
    """YAML as Ansible loads a role's own files: its strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


def _runs(tasks: list, variables: dict) -> dict:
    """What Ansible would run of these tasks on one node: {task name: [the items (their path) it runs for, or True]},
    each `when` evaluated by Ansible's own Templar with the task's vars and each loop item."""
    ran = {}
    for task in tasks:
        scope = dict(variables, **_trusted(task.get("vars", {})))
        when = task.get("when", [])
        when = when if isinstance(when, list) else [when]
        items = Templar(loader=DataLoader(), variables=scope).template(_trusted(task["loop"])) if "loop" in task else [None]
        done = []
        for item in items:
            templar = Templar(loader=DataLoader(), variables=dict(scope, item=item))
            if all(templar.evaluate_conditional(_trusted(condition)) for condition in when):
                done.append(item["path"] if isinstance(item, dict) else True)
        if done:
            ran[task["name"]] = done
    return ran


ACTIVE = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
AT_REST = "LoadState=loaded\nActiveState=inactive\nUnitFileState=disabled\n"
NOT_FOUND = "LoadState=not-found\nActiveState=inactive\nUnitFileState=\n"
PASSWD = "root:x:0:0::/root:/bin/bash\ndgxspark-guard:x:998:998::/var/lib/dgxspark-guard:/bin/sh\n"


def _disarm_on(host: str, found: set, unit: str = NOT_FOUND, passwd: str = "root:x:0:0::/root:/bin/bash\n") -> dict:
    variables = _trusted(_variables())
    names = [item["name"] for item in _load(ROOT / "roles" / "guard" / "vars" / "main.yml")[
        "__guard_disarm_head_read" if host == "lab-head" else "__guard_disarm_worker_read"]["files"]]
    by_name = {name: {"exists": name in found or name == "passwd"} for name in names}
    if "passwd" in by_name:
        by_name["passwd"]["content"] = passwd
    units = {"dgxspark-group-guard.service": unit_state("dgxspark-group-guard.service", parse_show(unit))}
    variables.update(inventory_hostname=host, ansible_check_mode=False, ansible_play_name="teardown",
                     dgxspark_vllm_config={"head": "lab-head", "workers": ["lab-worker"]},
                     cache_flush_read={"also": {"by_name": by_name, "units": units if host == "lab-head" else {}}})
    return _runs(_load(TASKS / "disarm.yml")[1:], variables)


RECORD = "Record the guard as disarmed"
STOP = "Stop the guard and keep it from starting at boot"
SUDO = "Remove the sudo rule that lets the guard's account run the worker program as root, on each worker"
ACCOUNT = "Remove the account the guard's key logs in as, on each worker"
HOME = "Remove the account's home with its authorized_keys, and the worker program, on each worker"
ETC = "Remove the guard's SSH key, its known hosts and its ssh_config from the head"


def test_disarm_on_nodes_without_the_guard_runs_nothing_after_its_read():
    assert _disarm_on("lab-head", set()) == {}
    assert _disarm_on("lab-worker", set()) == {}


def test_disarm_on_a_guarded_cluster_stops_and_removes_everything():
    assert _disarm_on("lab-head", {"program", "public_key", "known_hosts", "ssh_config"}, ACTIVE) == {
        RECORD: [True], STOP: [True], ETC: [True]}
    assert _disarm_on("lab-worker", {"sudoers", "authorized_keys", "program"}, passwd=PASSWD) == {
        SUDO: [True], ACCOUNT: [True], HOME: ["/var/lib/dgxspark-guard", "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"]}


@pytest.mark.parametrize("found, unit, ran", [
    # disarmed before: the program stays (status.yml), the unit at rest; the folder is looked at again (a key may be
    # left without the files read)
    ({"program"}, AT_REST, {RECORD: [True], ETC: [True]}),
    # a unit that runs or would start at boot is stopped, whatever the files
    (set(), ACTIVE, {STOP: [True]}),
    (set(), "LoadState=loaded\nActiveState=activating\nUnitFileState=disabled\n", {STOP: [True]}),
    (set(), "LoadState=loaded\nActiveState=inactive\nUnitFileState=enabled\n", {STOP: [True]}),
    (set(), "LoadState=bad-setting\nActiveState=active\nUnitFileState=enabled\n", {STOP: [True]}),
    # the webhook's file alone is enough to remove the folder
    ({"webhook"}, NOT_FOUND, {ETC: [True]}),
])
def test_disarm_on_the_head_does_what_the_read_found(found: set, unit: str, ran: dict):
    assert _disarm_on("lab-head", found, unit) == ran


@pytest.mark.parametrize("found, passwd, ran", [
    # the account alone (an install that stopped after creating it): the account and its home
    (set(), PASSWD, {ACCOUNT: [True], HOME: ["/var/lib/dgxspark-guard"]}),
    ({"sudoers"}, "root:x:0:0::/root:/bin/bash\n", {SUDO: [True], HOME: ["/var/lib/dgxspark-guard"]}),
    ({"program"}, "root:x:0:0::/root:/bin/bash\n", {HOME: [
        "/var/lib/dgxspark-guard", "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"]}),
])
def test_disarm_on_a_worker_removes_what_the_read_found(found: set, passwd: str, ran: dict):
    assert _disarm_on("lab-worker", found, passwd=passwd) == ran


def _follow_variables(state: str, unit: str, stale: bool = False) -> dict:
    variables = _trusted(dict(_load(ROOT / "roles" / "cache_flush" / "defaults" / "main.yml")))
    read = dict(unit_state("f.service", parse_show(unit)), stale=stale)   # the module's: files newer than its process
    variables.update(cache_flush_follow_state=state, ansible_check_mode=False,
                     cache_flush_read={"current": False, "unit": read})
    return variables


@pytest.mark.parametrize("unit, stops", [
    (ACTIVE, True), (AT_REST, False), (NOT_FOUND, False),
    ("LoadState=loaded\nActiveState=failed\nUnitFileState=enabled\n", True),     # it would start at boot
    ("LoadState=loaded\nActiveState=activating\nUnitFileState=disabled\n", True),  # a restart loop's wait
])
def test_the_follow_mode_stop_runs_where_the_unit_is_installed_and_not_at_rest(unit: str, stops: bool):
    tasks = _load(ROOT / "roles" / "cache_flush" / "tasks" / "follow.yml")
    stop = [task for task in tasks if "ansible.builtin.systemd_service" in task]
    assert len(stop) == 1
    assert bool(_runs(stop, _follow_variables("stopped", unit))) is stops
    assert _runs(stop, _follow_variables("started", unit)) == {}


def _follow_install(state: str, unit: str, stale: bool, program: bool, unit_file: bool) -> tuple[list, dict]:
    """follow_install.yml's systemd tasks, and the variables after its writes (the program, the unit file changed or
    not; the configuration not) on a node whose read found the unit as given."""
    tasks = [task for task in _load(ROOT / "roles" / "cache_flush" / "tasks" / "follow_install.yml")
             if "ansible.builtin.systemd_service" in task]
    variables = _follow_variables(state, unit, stale)
    variables.update(_trusted(_load(ROOT / "roles" / "cache_flush" / "vars" / "main.yml")))
    variables.update(__cache_flush_program={"changed": program}, __cache_flush_follow_config={"changed": False},
                     __cache_flush_follow_unit={"changed": unit_file})
    return tasks, variables


@pytest.mark.parametrize("unit, program, unit_file, stale, ran", [
    # installed only: a running unit whose program or unit changed is restarted (with a reload when its unit changed)
    (ACTIVE, True, False, False, ["restarted", False]),
    (ACTIVE, False, True, False, ["restarted", True]),
    ("LoadState=loaded\nActiveState=activating\nUnitFileState=enabled\n", True, False, False, ["restarted", False]),
    # a stopped unit stays stopped: its new unit file is loaded (a later start takes it), a new program waits for it
    (AT_REST, False, True, False, [None, True]),
    (AT_REST, True, False, False, None),
    (ACTIVE, False, False, False, None),
    # nothing written now, but the running process is older than its files (an install whose restart did not happen)
    (ACTIVE, False, False, True, ["restarted", True]),
])
def test_installed_only_restarts_a_running_follow_mode_unit_whose_files_changed(unit, program, unit_file, stale, ran):
    tasks, variables = _follow_install("installed", unit, stale, program, unit_file)
    done = _runs(tasks, variables)
    assert list(done) == ([] if ran is None else [tasks[1]["name"]])   # never the start of the started state
    if ran is not None:
        args = Templar(loader=DataLoader(), variables=variables).template(
            _trusted({key: tasks[1]["ansible.builtin.systemd_service"][key] for key in ("daemon_reload",)}))
        state = tasks[1]["ansible.builtin.systemd_service"]["state"]
        rendered = Templar(loader=DataLoader(), variables=dict(variables, omit=None)).template(_trusted(state))
        assert [rendered or None, args["daemon_reload"]] == ran


@pytest.mark.parametrize("stale, program, ran", [
    (False, False, ["started", False]),
    (True, False, ["restarted", True]),    # older than its files: restarted, its unit file reloaded
    (False, True, ["restarted", False]),   # a new program written now
])
def test_started_restarts_a_follow_mode_unit_older_than_its_files(stale: bool, program: bool, ran: list) -> None:
    """A unit whose running process predates its files (an earlier install whose restart did not happen) would be left
    running the old program by a plain start: the read's stale restarts it."""
    tasks, variables = _follow_install("started", ACTIVE, stale, program, False)
    assert list(_runs(tasks, variables)) == [tasks[0]["name"]]
    module = tasks[0]["ansible.builtin.systemd_service"]
    rendered = Templar(loader=DataLoader(), variables=variables).template(
        _trusted({key: module[key] for key in ("state", "daemon_reload")}))
    assert [rendered["state"], rendered["daemon_reload"]] == ran


@pytest.mark.parametrize("state, stale, ran", [
    ("started", False, ["started", False]),
    ("started", True, ["restarted", True]),
    ("stopped", True, ["stopped", True]),   # stopped either way
])
def test_the_load_window_service_is_restarted_when_it_runs_older_than_its_files(state: str, stale: bool, ran: list):
    task = [task for task in _load(ROOT / "roles" / "cache_flush" / "tasks" / "main_install.yml")
            if "ansible.builtin.systemd_service" in task][0]
    variables = {"cache_flush_state": state, "cache_flush_read": {"unit": {"stale": stale}}}
    rendered = Templar(loader=DataLoader(), variables=variables).template(
        _trusted({key: task["ansible.builtin.systemd_service"][key] for key in ("state", "daemon_reload")}))
    assert [rendered["state"], rendered["daemon_reload"]] == ran


@pytest.mark.parametrize("unit, restarts", [(ACTIVE, True), (AT_REST, False), (NOT_FOUND, False),
                                            ("LoadState=loaded\nActiveState=activating\nUnitFileState=enabled\n", True)])
def test_a_new_program_restarts_the_follow_mode_unit_where_it_runs(unit: str, restarts: bool):
    """The program is shared: the main install's new program restarts the follow-mode unit too, where it runs (its own
    read would find the program current afterwards, and it would run the old one until its next start)."""
    program = [task for task in _load(ROOT / "roles" / "cache_flush" / "tasks" / "program.yml") if "register" in task][0]
    assert "Restart the follow-mode flush service where it runs" in program["notify"]
    handlers = [task for task in _load(ROOT / "roles" / "cache_flush" / "handlers" / "main.yml")
                if task.get("listen") == "Restart the follow-mode flush service where it runs"]
    assert [next(iter(k for k in task if "." in k)) for task in handlers] == [
        "dgxspark.vllm.service_files_info", "ansible.builtin.systemd_service"]
    assert handlers[0]["dgxspark.vllm.service_files_info"]["unit"] == "{{ cache_flush_follow_service_name }}.service"
    variables = {"__cache_flush_handler_follow": {"unit": unit_state("f.service", parse_show(unit))}}
    assert bool(_runs(handlers[1:], variables)) is restarts


@pytest.mark.parametrize("held_by, holder, release_any, released", [
    ("site.yml", "site.yml", False, True),          # the step that took it
    ("site.yml", "launch", False, False),           # a later step of the same run leaves it held
    ("site.yml", "launch", True, True),             # the launch's rescue, the arm left out: whichever step took it
    ("", "launch", True, False),                    # nothing held: nothing to release
])
def test_release_gives_back_only_the_lock_its_step_took_unless_any_is_asked(held_by, holder, release_any, released):
    tasks = _load(TASKS / "release.yml")
    variables = _trusted(_variables())
    variables.update(inventory_hostname="lab-head", ansible_check_mode=False, ansible_play_name="play",
                     dgxspark_vllm_config={"head": "lab-head", "workers": ["lab-worker"]},
                     hostvars={"lab-head": {"guard_maintenance_holder": held_by}},
                     guard_holder=holder, guard_release_any=release_any)
    variables["__guard_held_by"] = _trusted(_load(ROOT / "roles" / "guard" / "vars" / "main.yml")["__guard_held_by"])
    assert sorted(_runs(tasks, variables)) == (sorted(task["name"] for task in tasks) if released else [])


@pytest.mark.parametrize("host, steps, runs", [
    ("spark1", ["restart"], ["Restart"]),
    ("spark1", ["install", "restart", "start"], ["Install", "Restart", "Start"]),
    ("spark1", ["start"], ["Start"]),
    ("spark1", ["install"], ["Install"]),
    ("spark2", ["install", "restart", "start"], ["Install"]),   # the guard runs on the head; its access is installed
])                                                              # on every node (install.yml decides per node)
def test_prepare_carries_out_the_steps_guard_config_decided(host: str, steps: list, runs: list):
    """guard_config decides (prepare_steps) from the one read: the install when the installed guard is not the planned
    one, the restart of a guard older than the files an install writes last (the unit and the files an install writes
    last passed from that read), the start of a guard armed before that does not run; prepare carries out those, in
    that order, with the handlers flushed between the install and the restart, and skips them whole when there are
    none."""
    prepare = _load(TASKS / "prepare.yml")
    plan = next(task for task in prepare if "dgxspark.vllm.guard_config" in task)["dgxspark.vllm.guard_config"]
    assert plan["unit_read"] == "{{ __guard_head_also.units[guard_service_name ~ '.service'] }}"
    assert plan["installed_read"] == ["{{ __guard_head_also.by_name.config }}", "{{ __guard_head_also.by_name.webhook }}"]
    assert (plan["state_exists"], plan["install_only"], plan["lock_mine"]) == (
        "{{ __guard_head_also.by_name.state.exists }}", "{{ guard_install_only | bool }}", "{{ __guard_lock_mine }}")
    include = [task for task in prepare if "ansible.builtin.include_tasks" in task]
    assert [task["ansible.builtin.include_tasks"]["file"] for task in include] == ["prepare_steps.yml"]
    variables = {"inventory_hostname": host, "dgxspark_vllm_config": {"head": "spark1"},
                 "__guard_plan": {"prepare_steps": steps}}
    assert bool(_runs(include, variables)) and not _runs(include, dict(variables, __guard_plan={"prepare_steps": []}))
    tasks = _load(TASKS / "prepare_steps.yml")
    names = [task["name"] for task in tasks]
    assert names[1] == "Reload systemd and restart the guard when its program, configuration or unit changed"
    assert tasks[1] == {"name": names[1], "ansible.builtin.meta": "flush_handlers", "tags": ["guard"]}
    assert tasks[0]["ansible.builtin.include_tasks"]["file"] == "install.yml"
    assert tasks[2]["ansible.builtin.systemd_service"] == {
        "name": "{{ guard_service_name }}.service", "state": "restarted", "daemon_reload": True}
    assert tasks[3]["ansible.builtin.systemd_service"] == {
        "name": "{{ guard_service_name }}.service", "state": "started", "enabled": True}
    ran = [name.split()[0] for name in _runs([tasks[0], tasks[2], tasks[3]], variables)]
    assert ran == runs


@pytest.mark.parametrize("host, steps, runs", [
    ("spark1", ["arm"], ["Arm", "Forget"]),
    ("spark1", ["start", "arm"], ["Start", "Arm", "Forget"]),
    ("spark1", ["release"], ["Give"]),
    ("spark2", ["start", "arm"], ["Forget"]),   # the holder is a fact of the head, set once for the play
    ("spark2", ["release"], ["Give"]),          # release.yml decides per node (the head releases)
])
def test_arm_carries_out_the_steps_guard_config_decided_and_reports_them(host: str, steps: list, runs: list):
    """The arm's steps (arm_steps, decided in prepare): a guard never armed started, the arm (which gives the lock
    back, so the holder is forgotten), or instead the release of the lock this run holds; skipped whole when there are
    none, and guard_arm.armed says whether the arm ran."""
    arm = _load(TASKS / "arm.yml")
    assert [task["ansible.builtin.include_tasks"]["file"] for task in arm if "ansible.builtin.include_tasks" in task] == [
        "arm_steps.yml"]
    variables = {"inventory_hostname": host, "dgxspark_vllm_config": {"head": "spark1"},
                 "__guard_plan": {"arm_steps": steps, "arm_reason": "why"}}
    assert _runs(arm[:1], variables) and not _runs(arm[:1], dict(variables, __guard_plan={"arm_steps": []}))
    report = Templar(loader=DataLoader(), variables=variables).template(
        _trusted(arm[1]["ansible.builtin.set_fact"]["guard_arm"]))
    assert report == {"armed": "arm" in steps, "reason": "why"}
    tasks = _load(TASKS / "arm_steps.yml")
    assert [name.split()[0] for name in _runs(tasks, variables)] == runs
    give_back = next(task for task in tasks if "ansible.builtin.include_tasks" in task)
    assert (give_back["ansible.builtin.include_tasks"]["file"], give_back["vars"]) == (
        "release.yml", {"guard_release_any": True})
