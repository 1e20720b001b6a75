# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a container's log text on this node with ``docker logs --timestamps``.

Private module: may change at any time. The command runs through a callable passed in (a module passes
``module.run_command``), so tests use a fake. ``docker logs`` replays the container's stdout on its stdout
and the container's stderr on its stderr: vLLM logs to stdout, Python tracebacks go to stderr. The two are
merged back into one stream by their Docker timestamps (stable: stdout first on a tie).
"""
from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Sequence

RunCommand = Callable[[Sequence[str]], tuple[int, str, str]]

_TS_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\S* ")
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


def _keyed(text: str) -> list[tuple[tuple[str, str], str]]:
    key = ("", "")
    out = []
    for line in text.splitlines(keepends=True):
        match = _TS_RE.match(line)
        if match:
            key = (match.group(1), (match.group(2) or "").ljust(9, "0"))
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
