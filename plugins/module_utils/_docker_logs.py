# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a container's log text on this node with ``docker logs --timestamps``.

Private module: may change at any time. The command runs through a callable passed in (a module passes
``module.run_command``), so tests use a fake. ``docker logs`` replays the container's stdout on its stdout
and the container's stderr on its stderr: vLLM logs to stdout, Python tracebacks go to stderr. The two are
merged back into one stream by their Docker timestamps (stable: stdout first on a tie).

`LogFollower` follows a running container's new lines (``docker logs --follow``) so that a poll loop
sleeps until its next interval or until a line it cares about is written, whichever comes first.
"""
from __future__ import annotations

import heapq
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Sequence

RunCommand = Callable[[Sequence[str]], tuple[int, str, str]]

# Docker's times (RFC 3339 in UTC, up to nanoseconds, trailing zeros cut): at the start of a --timestamps line, or a
# whole State.StartedAt / State.FinishedAt
_TIME = r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?"
_TS_RE = re.compile("^" + _TIME + r"\S* ")
_STATE_TIME_RE = re.compile(_TIME + "Z$")
_NOT_FOUND = ("No such container",)
_UNREACHABLE = (
    "Cannot connect to the Docker daemon",
    "Is the docker daemon running",
    "permission denied while trying to connect to the Docker daemon",
    "error during connect",
)


class DockerLogsError(Exception):
    """``docker logs`` failed."""


class ContainerNotFoundError(DockerLogsError):
    """The container does not exist on this node."""


class DockerUnreachableError(DockerLogsError):
    """The docker CLI is missing or cannot talk to the daemon."""


def docker_logs_argv(name: str, since: str | None = None, docker: str = "docker") -> list[str]:
    """The command line: ``docker logs --timestamps [--since S] NAME``."""
    argv = [docker, "logs", "--timestamps"]
    if since:
        argv += ["--since", since]
    argv.append(name)
    return argv


def _time_key(match: re.Match[str]) -> tuple[str, str]:
    return match.group(1), (match.group(2) or "").ljust(9, "0")


def time_key(value: str) -> tuple[str, str] | None:
    """A sort key of one of Docker's State times (``StartedAt``, ``FinishedAt``), the one the log lines are merged by;
    None when ``value`` is not such a time."""
    match = _STATE_TIME_RE.match(value)
    return _time_key(match) if match else None


def _keyed(text: str) -> list[tuple[tuple[str, str], str]]:
    key = ("", "")
    out = []
    for line in text.splitlines(keepends=True):
        match = _TS_RE.match(line)
        if match:
            key = _time_key(match)
        out.append((key, line if line.endswith("\n") else line + "\n"))
    return out


def merge_streams(stdout: str, stderr: str) -> str:
    """Interleave two ``--timestamps`` streams by time; a line without a timestamp keeps its predecessor's."""
    merged = heapq.merge(_keyed(stdout), _keyed(stderr), key=lambda item: item[0])
    return "".join(line for _key, line in merged)


def read_container_logs(run_command: RunCommand, name: str, since: str | None = None, docker: str = "docker") -> str:
    """Return the container's log text (stdout and stderr merged), or raise a `DockerLogsError` subclass."""
    argv = docker_logs_argv(name, since, docker)
    try:
        rc, out, err = run_command(argv)
    except OSError as exc:
        raise DockerUnreachableError(
            f"cannot run {docker!r} on this node ({exc}): install the docker CLI or put it on PATH"
        ) from exc
    if rc == 0:
        return merge_streams(out, err)
    detail = " ".join((err or out or "").split()) or f"exit code {rc}"
    if any(marker in detail for marker in _NOT_FOUND):
        raise ContainerNotFoundError(
            f"container {name!r} does not exist on this node ({detail}); check the name with 'docker ps -a' "
            "or start the engine first"
        )
    if any(marker in detail for marker in _UNREACHABLE):
        raise DockerUnreachableError(
            f"docker is not reachable on this node ({detail}); start the docker service, or run the task with "
            "become: true or as a member of the docker group"
        )
    raise DockerLogsError(f"'{' '.join(argv)}' failed with rc={rc}: {detail}")


def docker_follow_argv(name: str, since: float | None = None, docker: str = "docker") -> list[str]:
    """The command line that prints the container's lines as they are written (``docker logs --follow``): those
    since the Unix time `since` (a poll's read, so that nothing written after it is missed), else only new ones."""
    argv = [docker, "logs", "--follow"]
    argv += ["--since", f"{since:.6f}"] if since is not None else ["--tail", "0"]
    return argv + [name]


class LogFollower:
    """A running container's new log lines as they come, to end a poll loop's sleep early.

    `wait(seconds)` returns True as soon as a new line (stdout or stderr) for which `notable(line)` is true was
    written, False once the seconds are over. When the follower cannot run or its stream ended (the docker CLI
    missing, the container stopped), it sleeps the rest of the interval: the poll loop works as without it.
    Lines are only looked at, never kept: the poll still reads the whole log, which stays the one source of truth."""

    _MAX_PARTIAL = 1 << 16   # a line longer than this is cut: only its start can hold a marker

    def __init__(self, argv: Sequence[str], notable: Callable[[str], bool],
                 popen: Callable[..., subprocess.Popen] | None = None, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        self._notable = notable
        self._clock, self._sleep = clock or time.monotonic, sleep or time.sleep
        popen = popen or subprocess.Popen
        self._partial: dict[int, bytes] = {}
        try:
            self._proc: subprocess.Popen | None = popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            self._proc = None
        self._open = [self._proc.stdout.fileno(), self._proc.stderr.fileno()] if self._proc is not None else []

    @property
    def alive(self) -> bool:
        """Whether it still follows (its process runs or its streams are not drained)."""
        return bool(self._open)

    def wait(self, seconds: float) -> bool:
        deadline = self._clock() + seconds
        while True:
            left = deadline - self._clock()
            if left <= 0:
                return False
            if not self._open:
                self._sleep(left)
                return False
            ready, _w, _x = select.select(self._open, [], [], left)
            seen = False
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._open.remove(fd)
                    continue
                *lines, rest = (self._partial.get(fd, b"") + chunk).replace(b"\r", b"\n").split(b"\n")
                self._partial[fd] = rest[:self._MAX_PARTIAL]
                seen = seen or any(self._notable(line.decode("utf-8", "replace")) for line in lines if line.strip())
            if seen:
                return True

    def close(self) -> None:
        """Stop following (the docker CLI's process ends; the container is not touched)."""
        self._open = []
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
