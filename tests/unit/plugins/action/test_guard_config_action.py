# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard_config action: the document carries the install's fingerprint (the guard's files, the module_utils it
imports, the install settings), and `current` says whether the head's installed configuration is that document."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.guard_config import ActionModule
from helpers.action_runner import run_action

CONFIG = {"head": "spark1", "workers": ["spark2"], "container_name": "vllm_glm53", "port": 8000,
          "served_model_name": "glm-5", "nodes": {"spark1": {"cx7_ip": "10.77.1.11"}, "spark2": {"cx7_ip": "10.77.1.12"}}}
MODULE_UTILS = ["_guard.py", "_startup.py"]


def _run(tmp_path: Path, installed: str | None = None, **extra: Any) -> dict[str, Any]:
    program = tmp_path / "dgxspark_group_guard.py"
    if not program.exists():
        program.write_text("print('guard')\n", encoding="utf-8")
    args: dict[str, Any] = {"config": CONFIG, "payload": [str(program)], "module_utils": MODULE_UTILS,
                            "install": {"python": "/usr/bin/python3"}}
    args.update(extra)
    if installed is not None:
        args["installed"] = installed
    result = run_action(ActionModule, args)
    if result.get("failed"):
        raise AnsibleActionFail(result["msg"])
    return result


def _as_written(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"   # the guard role's to_nice_json(indent=2)


def test_the_installed_document_is_current_and_any_change_is_not(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert len(first["document"]["_install"]) == 64
    assert first["current"] is False                       # nothing installed was given
    assert _run(tmp_path, _as_written(first["document"]))["current"] is True
    # the guard program changed (a collection upgrade): the fingerprint moves, the install runs
    (tmp_path / "dgxspark_group_guard.py").write_text("print('guard 2')\n", encoding="utf-8")
    second = _run(tmp_path, _as_written(first["document"]))
    assert second["current"] is False
    assert second["document"]["_install"] != first["document"]["_install"]
    # an install setting or a tunable changed
    assert _run(tmp_path, _as_written(second["document"]), install={"python": "/opt/py"})["current"] is False
    assert _run(tmp_path, _as_written(second["document"]), tunables={"grace_seconds": 5})["current"] is False


def test_the_module_utils_are_the_collections_own(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert _run(tmp_path, module_utils=MODULE_UTILS + ["_metrics.py"])["document"]["_install"] != first["document"]["_install"]


def test_a_missing_file_fails_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match=r"the group guard's file .*/nope\.py cannot be read"):
        _run(tmp_path, payload=[str(tmp_path / "nope.py")])
    with pytest.raises(AnsibleActionFail, match=r"_no_such_util\.py cannot be read"):
        _run(tmp_path, module_utils=["_no_such_util.py"])


def test_two_files_of_one_name_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "dgxspark_group_guard.py").write_text("print('other')\n", encoding="utf-8")
    (tmp_path / "dgxspark_group_guard.py").write_text("print('guard')\n", encoding="utf-8")
    with pytest.raises(AnsibleActionFail, match=r"share the name dgxspark_group_guard\.py"):
        _run(tmp_path, payload=[str(tmp_path / "dgxspark_group_guard.py"), str(other / "dgxspark_group_guard.py")])


T1 = "2027-01-15T09:00:00.000000001Z"
SERVING = {"spark1": T1, "spark2": T1}


def _armed(baseline: dict[str, str], status: str = "armed") -> str:
    return json.dumps({"status": status, "since": 1.0, "detail": "armed by launch.yml", "baseline": baseline,
                       "attempts": []})


def test_arm_is_skipped_only_when_the_installed_guard_keeps_this_group(tmp_path: Path) -> None:
    installed = _as_written(_run(tmp_path)["document"])
    quiet = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING))
    assert (quiet["current"], quiet["arm"]) == (True, False)
    assert "arming changes nothing" in quiet["arm_reason"]
    # the launch started the group in this run: it gives no container starts
    assert _run(tmp_path, installed, armed_state=_armed(SERVING))["arm"] is True
    # the guard keeps an older group, is disarmed, has no state, or a maintenance lock is left
    assert _run(tmp_path, installed, serving=SERVING, armed_state=_armed({"spark1": T1, "spark2": "x"}))["arm"] is True
    assert _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING, "disarmed"))["arm"] is True
    assert _run(tmp_path, installed, serving=SERVING)["arm_reason"] == "the guard has no state file yet"
    held = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING), maintenance_held=True)
    assert (held["arm"], held["arm_reason"]) == (True, "a maintenance lock is held")
    # a guard installed in this run is armed, whatever its state file says
    fresh = _run(tmp_path, serving=SERVING, armed_state=_armed(SERVING))
    assert (fresh["current"], fresh["arm"], fresh["arm_reason"]) == (False, True, "the guard is installed in this run")


def test_the_steps_after_the_plan_follow_from_the_read(tmp_path: Path) -> None:
    """What the role's prepare and arm carry out (prepare_steps, arm_steps) comes from this plan and the read passed in:
    a re-run that finds the guard installed, running and keeping this group leaves both empty."""
    installed = _as_written(_run(tmp_path)["document"])
    runs = {"running": True, "enabled": True}
    quiet = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING), state_exists=True, unit_read=runs)
    assert (quiet["prepare_steps"], quiet["arm_steps"]) == ([], [])
    mine = _run(tmp_path, installed, serving=SERVING, armed_state=_armed(SERVING), state_exists=True, unit_read=runs,
                lock_mine=True)
    assert (mine["prepare_steps"], mine["arm_steps"]) == ([], ["release"])
    started = _run(tmp_path, installed, armed_state=_armed(SERVING), state_exists=True, unit_read=runs, lock_mine=True)
    assert (started["prepare_steps"], started["arm_steps"]) == ([], ["arm"])
    fresh = _run(tmp_path, state_exists=False, unit_read={"running": False, "enabled": False})
    assert (fresh["prepare_steps"], fresh["arm_steps"]) == (["install"], ["start", "arm"])
    only = _run(tmp_path, state_exists=True, install_only=True)
    assert (only["prepare_steps"], only["arm_steps"]) == (["install"], ["arm"])
    args = {"config": CONFIG, "payload": [str(tmp_path / "dgxspark_group_guard.py")], "module_utils": MODULE_UTILS,
            "install": {"python": "/usr/bin/python3"}, "state_exists": True, "lock_mine": True}
    check = run_action(ActionModule, args, check_mode=True)
    assert (check["prepare_steps"], check["arm_steps"]) == (["install"], [])


# ------------------------------------------------------------------------------------------------ the SSH access

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm2y0kqLhS5cQ3xv0m1W0b9p6Zp2uQ0r7Y5t2m0d3Xk dgxspark-guard@spark1\n"


@pytest.fixture(autouse=True)
def resolver():
    """The controller's resolver: the head's inventory name is its management address (the tests' hostvars are empty)."""
    names = {"spark1": "10.77.0.11"}

    def lookup(host, *_args, **_kwargs):
        if host not in names:
            raise OSError("Name or service not known")
        return [(2, 1, 6, "", (names[host], 0))]

    with mock.patch("socket.getaddrinfo", side_effect=lookup) as patched:
        yield patched


def _with_worker_program(tmp_path: Path, text: str = "print('worker')\n") -> Path:
    program = tmp_path / "dgxspark_guard_worker.py"
    program.write_text(text, encoding="utf-8")
    return program


def _held(access: dict[str, Any], program: Path, removed: tuple = ()) -> list[dict[str, Any]]:
    """What the install leaves on a worker, as the guard role reads it there (its files, with the SSH host key), less
    the files `removed`."""
    texts = [("/etc/ssh/ssh_host_ed25519_key.pub", "ssh-ed25519 AAAAhost root@spark2\n"),
             ("/var/lib/dgxspark-guard/.ssh/authorized_keys", access["key_options"] + " " + KEY),
             ("/etc/sudoers.d/dgxspark-guard", access["sudoers"])]
    files = [{"path": path, "exists": True, "content": text, "sha256": hashlib.sha256(text.encode()).hexdigest()}
             for path, text in texts]
    files.append({"path": access["program"], "exists": True, "content": None,
                  "sha256": hashlib.sha256(program.read_bytes()).hexdigest()})
    for entry in files:
        if entry["path"] in removed:
            entry.update(exists=False, content=None, sha256=None)
    return files


def test_the_access_is_planned_from_the_heads_addresses_and_the_container(tmp_path: Path) -> None:
    result = _run(tmp_path, access={"python": "/usr/bin/python3", "program": "/opt/guard/dgxspark_guard_worker.py",
                                    "ssh_from": ["10.9.0.0/16"]},
                  ssh_config="/etc/g/ssh_config")
    access = result["access"]
    assert access["from"] == ["10.77.0.11", "10.77.1.11", "10.9.0.0/16"]
    assert access["program"] == "/opt/guard/dgxspark_guard_worker.py"
    assert access["command"] == ["/usr/bin/sudo", "-n", "/usr/bin/python3", "-I", "/opt/guard/dgxspark_guard_worker.py",
                                 "--container", "vllm_glm53"]
    assert access["key_options"].startswith('restrict,from="10.77.0.11,10.77.1.11,10.9.0.0/16",command="/usr/bin/sudo -n ')
    assert access["user"] == "dgxspark-guard" and "drift" not in access
    assert result["document"]["ssh_config"] == "/etc/g/ssh_config"
    assert result["document"]["ranks"][1]["ssh_host"] == result["workers"][0]["alias"] == "dgxspark-guard-spark2"
    # the defaults: the role's
    assert _run(tmp_path)["access"]["program"] == "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"


def test_a_head_address_that_does_not_resolve_fails_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match=r"the group guard's SSH access cannot be planned: the head spark9: its "
                                                r"ansible_host 'spark9' does not resolve .* guard_ssh_from"):
        _run(tmp_path, config=dict(CONFIG, head="spark9", nodes=dict(CONFIG["nodes"], spark9={"cx7_ip": "10.77.1.19"})))


def test_another_head_address_reinstalls_the_access(tmp_path: Path) -> None:
    installed = _as_written(_run(tmp_path)["document"])
    assert _run(tmp_path, installed)["current"] is True
    assert _run(tmp_path, installed, access={"ssh_from": ["10.9.0.5"]})["current"] is False


def test_the_install_is_current_only_while_the_nodes_hold_the_access(tmp_path: Path) -> None:
    program = _with_worker_program(tmp_path)
    payload = [str(tmp_path / "dgxspark_group_guard.py"), str(program)]
    (tmp_path / "dgxspark_group_guard.py").write_text("print('guard')\n", encoding="utf-8")
    first = _run(tmp_path, payload=payload)
    installed, access = _as_written(first["document"]), first["access"]
    read = {"head_public_key": KEY, "workers": {"spark2": _held(access, program)}}
    done = _run(tmp_path, installed, payload=payload, access_read=read, serving=SERVING, armed_state=_armed(SERVING))
    assert (done["current"], done["access"]["drift"], done["arm"]) == (True, [], False)
    # after teardown (or dgxspark_vllm_guard: false): no key on the head, nothing on the worker
    removed = ("/var/lib/dgxspark-guard/.ssh/authorized_keys", "/etc/sudoers.d/dgxspark-guard", access["program"])
    gone = _run(tmp_path, installed, payload=payload, serving=SERVING, armed_state=_armed(SERVING, "disarmed"),
                access_read={"head_public_key": None, "workers": {"spark2": _held(access, program, removed)}})
    assert (gone["current"], gone["access"]["drift"]) == (False, ["the head has no guard key"])
    assert (gone["arm"], gone["arm_reason"]) == (True, "the guard is installed in this run")
    gone = _run(tmp_path, installed, payload=payload, access_read=dict(read, workers={"spark2": _held(access, program, removed)}))
    assert gone["access"]["drift"] == ["spark2: the guard's authorized_keys is absent",
                                       "spark2: the guard's sudoers rule is absent",
                                       "spark2: the guard's worker program is absent"]
    # a worker not read at all holds nothing as far as the plan knows
    assert _run(tmp_path, installed, payload=payload, access_read=dict(read, workers={}))["access"]["drift"][0] == (
        "spark2: the guard's authorized_keys is absent")
    # the worker's copy of the program is not the collection's (an upgrade, a change by hand)
    _with_worker_program(tmp_path, "print('worker 2')\n")
    stale = _run(tmp_path, _as_written(_run(tmp_path, payload=payload)["document"]), payload=payload, access_read=read)
    assert (stale["current"], stale["access"]["drift"]) == (False, ["spark2: the guard's worker program is not the planned one"])


def test_the_nodes_access_is_compared_with_the_worker_program_of_the_payload(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail, match=r"the group guard's payload has no dgxspark_guard_worker\.py"):
        _run(tmp_path, access_read={"head_public_key": KEY, "workers": {}})


def test_the_metrics_endpoint_listens_on_the_heads_management_address_unless_told(tmp_path: Path) -> None:
    document = _run(tmp_path, tunables={"metrics_port": 9478})["document"]
    assert (document["metrics_address"], document["metrics_port"]) == ("10.77.0.11", 9478)
    document = _run(tmp_path, tunables={"metrics_port": 9478, "metrics_address": "127.0.0.1"})["document"]
    assert document["metrics_address"] == "127.0.0.1"
    assert "metrics_address" not in _run(tmp_path, tunables={"metrics_port": 0})["document"]


URL = "https://hooks.example/services/sekrit-token"


def test_a_webhook_url_is_checked_and_stays_out_of_the_result(tmp_path: Path) -> None:
    absent = {"path": "/etc/dgxspark/guard/webhook_url", "exists": False, "sha256": None}
    result = _run(tmp_path, webhook_url=URL, webhook_read=absent)
    assert result["document"]["webhook_url_file"] == "/etc/dgxspark/guard/webhook_url"
    assert result["webhook"] == {"path": "/etc/dgxspark/guard/webhook_url", "present": True, "current": False}
    assert "sekrit" not in json.dumps(result)
    # the head holds the document and the URL's file: current; another URL in that file: not
    written = dict(absent, exists=True, sha256=hashlib.sha256((URL + "\n").encode()).hexdigest())
    assert _run(tmp_path, _as_written(result["document"]), webhook_url=URL, webhook_read=written)["current"] is True
    other = dict(written, sha256=hashlib.sha256(b"https://hooks.example/other\n").hexdigest())
    assert _run(tmp_path, _as_written(result["document"]), webhook_url=URL, webhook_read=other)["current"] is False
    # no URL: no file named, and a file left behind is not current
    none = _run(tmp_path, webhook_read=absent)
    assert "webhook_url_file" not in none["document"] and none["webhook"]["present"] is False
    assert _run(tmp_path, _as_written(none["document"]), webhook_read=absent)["current"] is True
    assert _run(tmp_path, _as_written(none["document"]), webhook_read=written)["current"] is False


def test_a_webhook_url_that_is_not_http_fails_without_showing_it(tmp_path: Path) -> None:
    with pytest.raises(AnsibleActionFail) as info:
        _run(tmp_path, webhook_url="ftp://files.example/sekrit-token")
    assert str(info.value) == ("the group guard cannot be configured: the webhook URL must be an http:// or https:// "
                               "URL (it starts with 'ftp:')")


RUNNING_SINCE = {"name": "dgxspark-group-guard.service", "running": True, "started_at": 1000.0}


@pytest.mark.parametrize(("unit", "mtimes", "restart"), [
    (RUNNING_SINCE, (900.0, 950.0), False),                       # written, then the guard (re)started
    (RUNNING_SINCE, (1000.5, 950.0), True),                       # its configuration written after its start
    (RUNNING_SINCE, (900.0, 1200.0), True),                       # the webhook URL's file too
    (dict(RUNNING_SINCE, running=False, started_at=None), (1000.5, 1200.0), False),   # stopped: its start loads them
    (None, (1000.5, 1200.0), False),                              # the unit was not read
])
def test_restart_when_the_running_guard_is_older_than_the_files_an_install_writes_last(
        tmp_path: Path, unit: dict | None, mtimes: tuple, restart: bool) -> None:
    files = [{"path": "/etc/dgxspark/guard.json", "exists": True, "mtime": mtimes[0]},
             {"path": "/etc/dgxspark/guard/webhook_url", "exists": True, "mtime": mtimes[1]}]
    extra: dict[str, Any] = {"installed_read": files}
    if unit is not None:
        extra["unit_read"] = unit
    result = _run(tmp_path, **extra)
    assert result["restart"] is restart
    assert bool(result["restart_reason"]) is restart
    if restart:
        assert "an install whose restart did not happen" in result["restart_reason"]
    # an absent file (no webhook set) is never judged
    gone = [dict(files[0], mtime=900.0), {"path": "/etc/dgxspark/guard/webhook_url", "exists": False, "mtime": None}]
    assert _run(tmp_path, installed_read=gone, unit_read=RUNNING_SINCE)["restart"] is False
