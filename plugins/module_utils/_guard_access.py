# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the group guard's SSH key may do on the workers, decided once: its forced command, its authorized_keys entry
(``restrict``, ``from=`` the head's addresses), the sudoers rule that lets its account run that command as root, and
whether what the nodes hold now is exactly that.

Private to the collection; may change at any time. Pure, standard library only; the guard_config action (on the
controller) calls it, the guard role writes what it returns. On each worker, the forced command is the guard's worker
program (roles/guard/files/dgxspark_guard_worker.py), which allows the guard's few Docker operations on the serve
container and nothing else; the account the key logs in as is in no docker group and may run, through sudo, that one
command line and no other.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any

SUDO = "/usr/bin/sudo"
SUDOERS_ALIAS = "DGXSPARK_GUARD_WORKER"
KEPT_VARIABLE = "SSH_ORIGINAL_COMMAND"

_PATH = re.compile(r"/[A-Za-z0-9._+/-]{1,4095}")   # nothing sshd, sudoers or a shell would read as syntax
_CONTAINER = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PUBLIC_KEY = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|ssh-rsa) "
                         r"[A-Za-z0-9+/=]{16,16384}( [\x21-\x7e]{0,200})?")


class GuardAccessError(ValueError):
    """The guard's access cannot be planned: ``problems`` lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def source_addresses(head: str, given: str, resolved: str, cx7_ip: str, extra: list[str]) -> tuple[list[str], list[str]]:
    """(the addresses the workers accept the guard's key from, problems): the head's management address as Ansible
    reaches it (``given``, its ansible_host; ``resolved`` by the controller, "" when it did not resolve), its CX7
    address, then ``extra`` (guard_ssh_from: addresses or networks, for a head whose connections reach the workers
    from yet another address). Each appears once, in that order."""
    problems: list[str] = []
    found: list[str] = []
    fix = ("set the head's ansible_host to its management address, or give the address it reaches the workers from "
           "in guard_ssh_from")
    try:
        address = ipaddress.ip_address(resolved)
    except ValueError:
        problems.append(f"the head {head}: its ansible_host {given!r} does not resolve to an IP address on the controller, "
                        f"so the workers cannot accept the guard's key from it: {fix}")
    else:
        if address.is_loopback or address.is_unspecified:
            problems.append(f"the head {head}: its ansible_host {given!r} is {address}, not an address the workers see "
                            f"its connections from: {fix}")
        else:
            found.append(str(address))
    try:
        found.append(str(ipaddress.ip_address(cx7_ip)))
    except ValueError:
        problems.append(f"the head {head}: its dgxspark_vllm_cx7_ip {cx7_ip!r} is not an IP address")
    for item in extra:
        try:
            network = ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            problems.append(f"guard_ssh_from: {item!r} is neither an IP address nor a network (e.g. 192.168.1.10 or "
                            "192.168.1.0/24)")
            continue
        found.append(str(network.network_address) if network.num_addresses == 1 else str(network))
    return list(dict.fromkeys(found)), problems


def forced_command(python: str, program: str, container: str) -> tuple[list[str], list[str]]:
    """(the command line sshd runs for the guard's key on a worker, problems): sudo, non-interactive, runs the worker
    program as root with its container fixed; the sudoers rule allows exactly this line."""
    problems = [f"{name} must be an absolute path of letters, digits and ._+-/ only, got {value!r}"
                for name, value in (("guard_python", python), ("the worker program's path", program))
                if not _PATH.fullmatch(value)]
    if not _CONTAINER.fullmatch(container):
        problems.append(f"the serve container's name {container!r} is not a Docker container name")
    return [SUDO, "-n", python, "-I", program, "--container", container], problems


def key_options(sources: list[str], command: list[str]) -> str:
    """The authorized_keys options of the guard's key: ``restrict`` (no port, agent or X11 forwarding, no pty, no
    ~/.ssh/rc), ``from=`` the head's addresses, ``command=`` the forced command (the request in SSH_ORIGINAL_COMMAND)."""
    return 'restrict,from="%s",command="%s"' % (",".join(sources), " ".join(command))


def authorized_keys_text(options: str, public_key: str) -> str:
    """The guard account's whole authorized_keys file: one line, the options and the head's public key."""
    return "%s %s\n" % (options, public_key.strip())


def sudoers_text(user: str, command: list[str]) -> str:
    """The sudoers drop-in that lets `user` run exactly `command` (its arguments included: sudo allows no other) as root,
    keeping only SSH_ORIGINAL_COMMAND of its environment. sudo does not log these runs (the guard asks every few
    seconds): the worker program logs the operations that change the container and every refusal itself."""
    cmnd = " ".join(command[2:])   # without sudo -n
    return (
        "# Managed by Ansible (role dgxspark.vllm.guard): local changes are overwritten; removed by teardown.\n"
        "# The group guard's account runs this one command line as root and nothing else: the guard's worker program,\n"
        "# which allows the guard's Docker operations on the serve container only (its forced command in\n"
        "# authorized_keys). It keeps SSH_ORIGINAL_COMMAND, the operation asked for; the program logs what changes\n"
        "# the container and every refusal to the auth log, so sudo logs nothing of these runs.\n"
        f"Cmnd_Alias {SUDOERS_ALIAS} = {cmnd}\n"
        f'Defaults!{SUDOERS_ALIAS} env_keep += "{KEPT_VARIABLE}", !syslog, !pam_session\n'
        f"{user} ALL = (root) NOPASSWD: {SUDOERS_ALIAS}\n"
    )


def plan(head: str, given: str, resolved: str, cx7_ip: str, extra: list[str], user: str, python: str, program: str,
         container: str) -> dict[str, Any]:
    """The guard's access on the workers: ``user``, ``program`` (the worker program's path), ``from`` (the addresses),
    ``command``, ``key_options``, ``sudoers``; GuardAccessError lists every problem."""
    sources, problems = source_addresses(head, given, resolved, cx7_ip, extra)
    command, more = forced_command(python, program, container)
    problems += more
    if not _USER.fullmatch(user):
        problems.append(f"guard_ssh_user {user!r} is not an account name (lower-case letters, digits, _ and -)")
    if problems:
        raise GuardAccessError(problems)
    return {"user": user, "program": program, "from": sources, "command": command,
            "key_options": key_options(sources, command), "sudoers": sudoers_text(user, command)}


def worker_read(files: list[dict[str, Any]], authorized_keys: str, sudoers: str, program: str) -> dict[str, Any]:
    """What one worker holds of the access, from the files read there (dgxspark.vllm.service_files_info: ``path``,
    ``exists``, ``sha256``, ``content``): ``authorized_keys`` and ``sudoers`` (their texts) and ``program_sha256``,
    each None when absent (or not read)."""
    by_path = {entry.get("path"): entry for entry in files if isinstance(entry, dict) and entry.get("exists")}
    return {"authorized_keys": (by_path.get(authorized_keys) or {}).get("content"),
            "sudoers": (by_path.get(sudoers) or {}).get("content"),
            "program_sha256": (by_path.get(program) or {}).get("sha256")}


def problems_on_nodes(access: dict[str, Any], head_public_key: str | None, workers: dict[str, dict[str, Any]],
                      program_sha256: str) -> list[str]:
    """Why the access the nodes hold (as read in this run) is not `access`, empty when it is: the head's public key
    (None: absent), and per worker its authorized_keys and sudoers texts (None: absent) and the worker program's
    SHA-256 (None: absent). A teardown removes them all; the next install puts them back."""
    if not head_public_key:
        return ["the head has no guard key"]
    if not _PUBLIC_KEY.fullmatch(head_public_key.strip()):
        return ["the head's guard key is not one public key"]
    expected = authorized_keys_text(access["key_options"], head_public_key)
    problems = []
    for host in sorted(workers):
        read = workers[host]
        for what, have, want in (("authorized_keys", read.get("authorized_keys"), expected),
                                 ("sudoers rule", read.get("sudoers"), access["sudoers"]),
                                 ("worker program", read.get("program_sha256"), program_sha256)):
            if have is None:
                problems.append(f"{host}: the guard's {what} is absent")
            elif have != want:
                problems.append(f"{host}: the guard's {what} is not the planned one")
    return problems
