# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the group guard's SSH key may do on the workers (module_utils/_guard_access.py): the addresses it is accepted
from, its forced command, its authorized_keys options, the sudoers rule, and the check of what the nodes hold."""
from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard_access as A
from helpers.programs import load_program

ROOT = Path(__file__).resolve().parents[4]
WORKER = ROOT / "roles" / "guard" / "files" / "dgxspark_guard_worker.py"
PROGRAM = "/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm2y0kqLhS5cQ3xv0m1W0b9p6Zp2uQ0r7Y5t2m0d3Xk dgxspark-guard@spark1"
COMMAND = ["/usr/bin/sudo", "-n", "/usr/bin/python3", "-I", PROGRAM, "--container", "vllm_glm53"]


def plan(**over):
    args = dict(head="spark1", given="10.77.0.11", resolved="10.77.0.11", cx7_ip="10.77.1.11", extra=[],
                user="dgxspark-guard", python="/usr/bin/python3", program=PROGRAM, container="vllm_glm53")
    args.update(over)
    return A.plan(**args)


def options(text: str) -> dict:
    """authorized_keys options as sshd reads them: comma-separated, a value in double quotes may hold commas."""
    found = {}
    for match in re.finditer(r'([A-Za-z-]+)(?:="([^"]*)")?(?:,|$)', text):
        assert match.group(1) not in found, text
        found[match.group(1)] = match.group(2)
    assert ",".join(k if v is None else f'{k}="{v}"' for k, v in found.items()) == text
    return found


# ------------------------------------------------------------------------------------------------ the plan

def test_the_plan_for_the_lab():
    access = plan()
    assert access == {
        "user": "dgxspark-guard",
        "program": PROGRAM,
        "from": ["10.77.0.11", "10.77.1.11"],
        "command": COMMAND,
        "key_options": 'restrict,from="10.77.0.11,10.77.1.11",command="/usr/bin/sudo -n /usr/bin/python3 -I '
                       '/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py --container vllm_glm53"',
        "sudoers": access["sudoers"],
    }
    assert access["sudoers"].splitlines()[-3:] == [
        "Cmnd_Alias DGXSPARK_GUARD_WORKER = /usr/bin/python3 -I /usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py "
        "--container vllm_glm53",
        'Defaults!DGXSPARK_GUARD_WORKER env_keep += "SSH_ORIGINAL_COMMAND", !syslog, !pam_session',
        "dgxspark-guard ALL = (root) NOPASSWD: DGXSPARK_GUARD_WORKER",
    ]
    assert all(line.startswith("#") for line in access["sudoers"].splitlines()[:-3])
    assert access["sudoers"].endswith("\n")


def test_the_key_may_do_nothing_but_its_forced_command_from_the_head():
    """restrict: no port forwarding (ssh -L/-R/-D), no agent or X11 forwarding, no pty, no ~/.ssh/rc; nothing turns
    one of them back on; from= the head's addresses only; the forced command, whatever the client asks to run."""
    found = options(plan(extra=["192.168.1.0/24"])["key_options"])
    assert list(found) == ["restrict", "from", "command"]
    assert found["restrict"] is None
    assert found["from"] == "10.77.0.11,10.77.1.11,192.168.1.0/24"
    assert found["command"] == " ".join(COMMAND)
    assert not set(found) & {"port-forwarding", "permitopen", "permitlisten", "agent-forwarding", "X11-forwarding",
                             "pty", "user-rc", "no-touch-required", "environment", "tunnel"}


def test_the_sudoers_rule_allows_exactly_the_forced_command():
    access = plan()
    alias = [line for line in access["sudoers"].splitlines() if line.startswith("Cmnd_Alias")][0]
    assert alias.split(" = ", 1)[1] == " ".join(access["command"][2:])       # sudo -n runs exactly this line
    assert access["command"][:2] == ["/usr/bin/sudo", "-n"]                    # never waits for a password


def test_the_forced_command_is_what_the_worker_program_takes(monkeypatch):
    worker = load_program(WORKER, "dgxspark_guard_worker")
    access = plan(container="vllm_other")
    assert access["command"][2:5] == ["/usr/bin/python3", "-I", PROGRAM] and access["program"] == PROGRAM
    execs = []
    rc = worker.main(access["command"][5:], environ={"SSH_ORIGINAL_COMMAND": "kill vllm_other"},
                     execute=lambda argv, env: execs.append(argv) or 0, which=lambda name, path: "/usr/bin/docker",
                     stderr=io.StringIO(), audit=lambda *_: None)
    assert (rc, execs) == (0, [["/usr/bin/docker", "kill", "vllm_other"]])


def test_the_authorized_keys_file_is_one_line():
    access = plan()
    assert A.authorized_keys_text(access["key_options"], KEY + "\n") == access["key_options"] + " " + KEY + "\n"


# ------------------------------------------------------------------------------------------------ addresses

@pytest.mark.parametrize("given, resolved, extra, sources", [
    ("10.77.0.11", "10.77.0.11", [], ["10.77.0.11", "10.77.1.11"]),
    ("spark1.lab", "10.77.0.11", [], ["10.77.0.11", "10.77.1.11"]),
    ("10.77.0.11", "10.77.0.11", ["10.77.0.11", "10.9.0.5", "10.9.0.0/16", "10.9.3.4/16", "fd00::1/128"],
     ["10.77.0.11", "10.77.1.11", "10.9.0.5", "10.9.0.0/16", "fd00::1"]),
    ("fd00::11", "fd00:0::11", [], ["fd00::11", "10.77.1.11"]),
])
def test_the_key_is_accepted_from_the_heads_management_and_cx7_addresses_and_the_extra_ones(given, resolved, extra, sources):
    assert A.source_addresses("spark1", given, resolved, "10.77.1.11", extra) == (sources, [])


@pytest.mark.parametrize("given, resolved, problem", [
    ("spark1", "", "the head spark1: its ansible_host 'spark1' does not resolve to an IP address on the controller, "
                   "so the workers cannot accept the guard's key from it: set the head's ansible_host to its management "
                   "address, or give the address it reaches the workers from in guard_ssh_from"),
    ("localhost", "127.0.0.1", "the head spark1: its ansible_host 'localhost' is 127.0.0.1, not an address the workers "
                               "see its connections from: set the head's ansible_host"),
    ("::1", "::1", "its ansible_host '::1' is ::1, not an address the workers see"),
    ("0.0.0.0", "0.0.0.0", "its ansible_host '0.0.0.0' is 0.0.0.0"),
])
def test_a_head_address_the_workers_cannot_see_is_refused(given, resolved, problem):
    sources, problems = A.source_addresses("spark1", given, resolved, "10.77.1.11", [])
    assert sources == ["10.77.1.11"]
    assert len(problems) == 1 and problem in problems[0], problems
    with pytest.raises(A.GuardAccessError) as info:
        plan(given=given, resolved=resolved)
    assert info.value.problems == problems


def test_every_problem_at_once():
    with pytest.raises(A.GuardAccessError) as info:
        plan(resolved="", cx7_ip="cx7", extra=["10.0.0.0/33", "spark2"], user="Guard", python="/usr/bin/python 3",
             program='/opt/"x".py', container="-x")
    assert info.value.problems == [
        "the head spark1: its ansible_host '10.77.0.11' does not resolve to an IP address on the controller, so the "
        "workers cannot accept the guard's key from it: set the head's ansible_host to its management address, or give "
        "the address it reaches the workers from in guard_ssh_from",
        "the head spark1: its dgxspark_vllm_cx7_ip 'cx7' is not an IP address",
        "guard_ssh_from: '10.0.0.0/33' is neither an IP address nor a network (e.g. 192.168.1.10 or 192.168.1.0/24)",
        "guard_ssh_from: 'spark2' is neither an IP address nor a network (e.g. 192.168.1.10 or 192.168.1.0/24)",
        "guard_python must be an absolute path of letters, digits and ._+-/ only, got '/usr/bin/python 3'",
        "the worker program's path must be an absolute path of letters, digits and ._+-/ only, got '/opt/\"x\".py'",
        "the serve container's name '-x' is not a Docker container name",
        "guard_ssh_user 'Guard' is not an account name (lower-case letters, digits, _ and -)",
    ]
    assert str(info.value) == "; ".join(info.value.problems)


@pytest.mark.parametrize("python", ["python3", "/usr/bin/python3,ALL", "/usr/bin/python3 ALL", "/usr/bin/py\\thon",
                                    "/usr/bin/python3:x", "/usr/bin/python3=x", "/usr/bin/python3\n"])
def test_a_path_sudoers_or_sshd_would_read_as_syntax_is_refused(python):
    with pytest.raises(A.GuardAccessError, match="guard_python must be an absolute path"):
        plan(python=python)


# ------------------------------------------------------------------------------------------------ the nodes

SHA = hashlib.sha256(b"program").hexdigest()


def held(access, **over):
    read = {"authorized_keys": A.authorized_keys_text(access["key_options"], KEY), "sudoers": access["sudoers"],
            "program_sha256": SHA}
    read.update(over)
    return read


def test_the_access_the_nodes_hold_is_current_only_when_it_is_the_planned_one():
    access = plan()
    workers = {"spark2": held(access), "spark3": held(access)}
    assert A.problems_on_nodes(access, KEY + "\n", workers, SHA) == []
    # what teardown removes: the head's key, each worker's authorized_keys, sudoers rule and program
    assert A.problems_on_nodes(access, None, workers, SHA) == ["the head has no guard key"]
    assert A.problems_on_nodes(access, "", workers, SHA) == ["the head has no guard key"]
    gone = {"spark2": held(access, authorized_keys=None, sudoers=None, program_sha256=None), "spark3": held(access)}
    assert A.problems_on_nodes(access, KEY, gone, SHA) == [
        "spark2: the guard's authorized_keys is absent", "spark2: the guard's sudoers rule is absent",
        "spark2: the guard's worker program is absent"]
    # changed on a node, or planned differently now (another head address, container, program)
    other = plan(extra=["10.9.0.5"])
    assert A.problems_on_nodes(other, KEY, workers, SHA) == [
        "spark2: the guard's authorized_keys is not the planned one", "spark3: the guard's authorized_keys is not the planned one"]
    assert A.problems_on_nodes(plan(container="x"), KEY, {"spark2": held(access)}, SHA) == [
        "spark2: the guard's authorized_keys is not the planned one", "spark2: the guard's sudoers rule is not the planned one"]
    assert A.problems_on_nodes(access, KEY, {"spark2": held(access)}, "0" * 64) == [
        "spark2: the guard's worker program is not the planned one"]
    # a new head key (another head, a key made again) is not the one the workers accept
    assert A.problems_on_nodes(access, KEY.replace("AAAAC3", "AAAAC4"), {"spark2": held(access)}, SHA) == [
        "spark2: the guard's authorized_keys is not the planned one"]
    assert A.problems_on_nodes(access, KEY + "\nssh-ed25519 AAAA x", workers, SHA) == ["the head's guard key is not one public key"]


def test_what_a_worker_holds_is_read_by_path():
    files = [{"path": "/etc/ssh/ssh_host_ed25519_key.pub", "exists": True, "sha256": "1", "content": "ssh-ed25519 A"},
             {"path": "/home/g/.ssh/authorized_keys", "exists": True, "sha256": "2", "content": "line\n"},
             {"path": "/etc/sudoers.d/g", "exists": False, "sha256": None, "content": None},
             {"path": "/opt/w.py", "exists": True, "sha256": "3", "matches": None}]
    assert A.worker_read(files, "/home/g/.ssh/authorized_keys", "/etc/sudoers.d/g", "/opt/w.py") == {
        "authorized_keys": "line\n", "sudoers": None, "program_sha256": "3"}
    assert A.worker_read([], "/a", "/b", "/c") == dict.fromkeys(("authorized_keys", "sudoers", "program_sha256"))
