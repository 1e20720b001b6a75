# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group guard's forced command on each worker (role dgxspark.vllm.guard): what the guard's SSH key can do.

The worker's sshd runs it for the head's guard key and for nothing else: the key's authorized_keys entry carries
``restrict`` (no forwarding of any kind, no pty), ``from=`` the head's addresses and
``command="/usr/bin/sudo -n PYTHON -I THIS_FILE --container NAME"``; one sudoers rule lets the guard's account run
exactly that command line as root (the account is in no docker group) and keeps SSH_ORIGINAL_COMMAND, the
operation the head asked for. This program allows the group guard's own Docker operations on the one serve
container NAME, and nothing else:

    inspect --format '{{json .State}}' NAME       the container's state (running, paused, started at, exit code)
    logs --timestamps NAME                         its log (the last lines of a failed restore)
    logs --timestamps --since STARTED_AT NAME      its log since a start (STARTED_AT: Docker's RFC 3339 time)
    start NAME                                     start the existing container
    stop --time SECONDS NAME                       stop it (SECONDS: 0 to 3600)
    kill NAME                                      kill it (SIGKILL, Docker's default)
    unpause NAME                                   unpause a frozen container before it is stopped
    meminfo                                        the node's /proc/meminfo (memory back before a start)
    drop-caches                                    sync, then 3 into /proc/sys/vm/drop_caches (the page cache)

The request is split like a shell would split it (shlex), but no shell ever runs: each word must be the literal
word of one of these forms, or a value of its kind, and the real ``docker`` then replaces this process with exactly
that argument list (exec, PATH fixed); the two node operations run in this program (no docker, no shell).
Anything else - another operation (``run``, ``exec``, ``system
dial-stdio``), a shell, another container, an extra flag, a character no form uses, an empty request - is refused
with one line on stderr naming why and exit status 126; refusals and the operations that change the container go
to the auth log (the reads, every few seconds, do not).

Standard library only, Python 3.8 or later. Exit status: docker's own (it replaces this process), 126 refused,
127 no docker CLI, 2 a bad --container.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import string
import sys

PROG = "dgxspark-guard-worker"
EXIT_CONFIG, EXIT_REFUSED, EXIT_NO_DOCKER = 2, 126, 127
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# the placeholders of the forms: the container's name, a stop grace in seconds, a start time
NAME, SECONDS, STARTED_AT = "NAME", "SECONDS", "STARTED_AT"
OPERATIONS = {
    "inspect": (("--format", "{{json .State}}", NAME),),
    "logs": (("--timestamps", NAME), ("--timestamps", "--since", STARTED_AT, NAME)),
    "start": ((NAME,),),
    "stop": (("--time", SECONDS, NAME),),
    "kill": ((NAME,),),
    "unpause": ((NAME,),),
}
# the node's own memory, read or its page cache dropped by this program itself: one word, no argument
NODE_OPERATIONS = ("meminfo", "drop-caches")
MUTATING = frozenset(("start", "stop", "kill", "unpause", "drop-caches"))
MEMINFO_PATH = "/proc/meminfo"
DROP_CACHES_PATH = "/proc/sys/vm/drop_caches"
MAX_STOP_SECONDS = 3600
MAX_REQUEST = 512
# every character the forms above use (the quote: shlex's quoting of '{{json .State}}'); nothing else gets through
REQUEST_CHARS = frozenset(string.ascii_letters + string.digits + " '._:+-{}")
CONTAINER_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")   # Docker's container names
SECONDS_RE = re.compile(r"[0-9]{1,4}")
STARTED_AT_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})")


class Refused(ValueError):
    """A request this key may not run; the message says why."""


def forms(container: str) -> list:
    """Every allowed request, as text, for container (the placeholders SECONDS and STARTED_AT left in)."""
    return [shlex.join([verb] + [container if word == NAME else word for word in shape])
            for verb, shapes in OPERATIONS.items() for shape in shapes]


def _fits(want: str, word: str) -> bool:
    if want == NAME:
        return CONTAINER_RE.fullmatch(word) is not None
    if want == SECONDS:
        return SECONDS_RE.fullmatch(word) is not None and int(word) <= MAX_STOP_SECONDS
    if want == STARTED_AT:
        return STARTED_AT_RE.fullmatch(word) is not None
    return word == want


def parse_request(request: str | None, container: str) -> list:
    """The docker arguments (without ``docker``) for `request`, the head's SSH_ORIGINAL_COMMAND, on `container`.

    Raises Refused, saying why, for anything that is not exactly one of the forms in OPERATIONS on `container`."""
    if request is None or not request.strip():
        raise Refused("no operation asked (an empty command or a login): this key runs only the group guard's "
                      "Docker operations on %s" % container)
    if len(request) > MAX_REQUEST:
        raise Refused("the request is %d characters long; the guard's operations take at most %d"
                      % (len(request), MAX_REQUEST))
    bad = sorted(set(request) - REQUEST_CHARS)
    if bad:
        raise Refused("the request holds %s, which none of the guard's operations uses (no shell runs here)"
                      % ", ".join(repr(char) for char in bad))
    try:
        words = shlex.split(request)
    except ValueError as exc:
        raise Refused("the request's quoting does not parse (%s)" % exc) from exc
    if not words:
        raise Refused("no operation asked: this key runs only the group guard's Docker operations on %s" % container)
    verb, args = words[0], tuple(words[1:])
    if verb in NODE_OPERATIONS:
        if args:
            raise Refused("%r is not a form the guard uses: %s takes no argument" % (shlex.join(words), verb))
        return [verb]
    shapes = OPERATIONS.get(verb)
    if shapes is None:
        raise Refused("%r is not one of the group guard's operations (%s), each on %s only; or %s"
                      % (verb, ", ".join(OPERATIONS), container, ", ".join(NODE_OPERATIONS)))
    for shape in shapes:
        if len(shape) == len(args) and all(_fits(want, word) for want, word in zip(shape, args)):
            name = args[shape.index(NAME)]
            if name != container:
                raise Refused("this key acts on the serve container %s only, not on %r" % (container, name))
            return [verb] + list(args)
    allowed = [form for form in forms(container) if form.split(" ", 1)[0] == verb]
    raise Refused("%r is not a form the guard uses: %s takes exactly %s"
                  % (shlex.join(words), verb, " or ".join(repr(form) for form in allowed)))


def _audit(priority_name: str, message: str) -> None:
    """One line to the auth log (syslog's auth facility); nothing when there is no syslog."""
    try:
        import syslog   # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    syslog.openlog(PROG, syslog.LOG_PID, syslog.LOG_AUTH)
    syslog.syslog(getattr(syslog, priority_name), message)


def node_operation(verb: str, stdout, stderr, meminfo_path: str = MEMINFO_PATH,
                   drop_caches_path: str = DROP_CACHES_PATH) -> int:
    """meminfo: the node's /proc/meminfo on stdout. drop-caches: sync, then the page cache, dentries and inodes
    dropped (what the collection's flush service does). 0, or 1 with the reason on stderr."""
    try:
        if verb == "meminfo":
            with open(meminfo_path, encoding="ascii") as handle:
                stdout.write(handle.read())
        else:
            os.sync()
            with open(drop_caches_path, "w", encoding="ascii") as handle:
                handle.write("3\n")
    except OSError as exc:
        stderr.write("%s: %s failed: %s\n" % (PROG, verb, exc))
        return 1
    return 0


def _exec(argv: list, env: dict) -> int:
    os.execve(argv[0], argv, env)
    return EXIT_NO_DOCKER   # not reached: execve replaces this process or raises


def main(argv: list | None = None, environ: dict | None = None, execute=_exec, which=shutil.which,
         stderr=None, audit=_audit, stdout=None, node=node_operation) -> int:
    stderr = stderr or sys.stderr
    stdout = stdout or sys.stdout
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=PROG, description="The group guard's forced command on a worker: the "
                                     "guard's Docker operations on one container, read from SSH_ORIGINAL_COMMAND.")
    parser.add_argument("--container", required=True, help="the serve container, the only one this key acts on")
    args = parser.parse_args(argv)
    if CONTAINER_RE.fullmatch(args.container) is None:
        stderr.write("%s: --container %r is not a container name\n" % (PROG, args.container))
        return EXIT_CONFIG
    request = environ.get("SSH_ORIGINAL_COMMAND")
    who = environ.get("SUDO_USER") or "uid %d" % os.getuid()
    try:
        docker_args = parse_request(request, args.container)
    except Refused as exc:
        stderr.write("%s: refused: %s\n" % (PROG, exc))
        stderr.flush()
        audit("LOG_WARNING", "refused %r for %s: %s" % (request, who, exc))
        return EXIT_REFUSED
    if docker_args[0] in NODE_OPERATIONS:
        if docker_args[0] in MUTATING:
            audit("LOG_NOTICE", "%s for %s" % (docker_args[0], who))
        return node(docker_args[0], stdout, stderr)
    docker = which("docker", path=SAFE_PATH)
    if not docker:
        stderr.write("%s: no docker CLI on this node (looked in %s)\n" % (PROG, SAFE_PATH))
        return EXIT_NO_DOCKER
    if docker_args[0] in MUTATING:
        audit("LOG_NOTICE", "docker %s for %s" % (shlex.join(docker_args), who))
    stderr.flush()
    return execute([docker] + docker_args, {"PATH": SAFE_PATH})


if __name__ == "__main__":
    sys.exit(main())
