# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secrets (the HF token, the API key) in files only their owner can read: written, read back, removed.

A secret that a task hands to a module as an argument ends up in every file Ansible writes for that task: the
module file of an async job (kept on the node for the job's whole life), the job's result file, and a non-pipelined
module's temporary file. So a task that runs in the background gets the path of a file instead, written by
`dgxspark.vllm.secret_file` (whose own arguments travel on the pipelined connection only) and read here by the
module that needs it. The file is written as a new file of mode 0600 (never widened, never reusing an existing
file's mode) and renamed into place; a reader refuses a file that group or others could read or write, one owned
by another user than itself or root, and anything but a regular file (a symlink is not followed).
"""
from __future__ import annotations

import os
import re
import shlex
import stat
import tempfile
from collections.abc import Mapping

MODE = 0o600
DIR_MODE = 0o700
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretFileError(Exception):
    """A secret file that cannot be used as it is, with what to do about it."""


def _mode_text(mode: int) -> str:
    return "%04o" % stat.S_IMODE(mode)


def check_private(st: os.stat_result, path: str, euid: int | None = None) -> None:
    """Raise SecretFileError unless st is a regular file that only its owner (this user, or root) can use."""
    me = os.geteuid() if euid is None else euid
    if not stat.S_ISREG(st.st_mode):
        raise SecretFileError("%s is not a regular file: a secret file must be one (written by "
                              "dgxspark.vllm.secret_file)" % path)
    if st.st_mode & 0o077:
        raise SecretFileError("%s has mode %s: group or others can use it, so the secret in it is no longer "
                              "private. Run `chmod 600 %s` (and consider the secret exposed), or let "
                              "dgxspark.vllm.secret_file write it" % (path, _mode_text(st.st_mode), path))
    if st.st_uid not in (me, 0):
        raise SecretFileError("%s belongs to uid %d, not to this user (uid %d) or root: another user could have "
                              "replaced the secret in it; remove it and let dgxspark.vllm.secret_file write it"
                              % (path, st.st_uid, me))


def read_secret(path: str, euid: int | None = None) -> str:
    """The secret in path (surrounding whitespace and the trailing newline removed); '' for an empty file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise SecretFileError("cannot open the secret file %s: %s" % (path, exc.strerror or exc)) from exc
    try:
        check_private(os.fstat(fd), path, euid)
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SecretFileError("the secret file %s is not UTF-8 text" % path) from exc


def render_env(env: Mapping[str, object]) -> str:
    """Shell assignments (`NAME='value'`, one a line) of the names whose value is set; '' when none is."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.match(str(name)):
            raise SecretFileError("%r is not an environment variable name" % (name,))
        if value is None or str(value) == "":
            continue
        text = str(value)
        if "\n" in text or "\r" in text or "\0" in text:
            raise SecretFileError("the value of %s contains a line break or a NUL byte" % name)
        lines.append("%s=%s\n" % (name, shlex.quote(text)))
    return "".join(lines)


def _same(path: str, data: bytes, uid: int | None, gid: int | None) -> bool:
    """Whether path already is a private regular file with exactly data, owned as asked."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != MODE:
            return False
        if (uid is not None and st.st_uid != uid) or (gid is not None and st.st_gid != gid):
            return False
        if st.st_size != len(data):
            return False
        return os.read(fd, len(data) + 1) == data
    finally:
        os.close(fd)


def write_secret(path: str, content: str, uid: int | None = None, gid: int | None = None,
                 check_mode: bool = False) -> bool:
    """Make path a 0600 file holding content (owned by uid/gid when given); True when it changed.

    A missing folder for it is created with mode 0700 (and the same owner); that folder's parent must exist.
    The content goes into a new file,
    created 0600 in the same folder, which then replaces path: nobody can read it while it is written, and a
    file that was there (whatever its mode) is replaced, not rewritten.
    """
    data = content.encode("utf-8")
    if _same(path, data, uid, gid):
        return False
    if check_mode:
        return True
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        os.mkdir(folder, DIR_MODE)
        os.chmod(folder, DIR_MODE)   # mkdir's mode is filtered by the umask
        if uid is not None or gid is not None:
            os.chown(folder, -1 if uid is None else uid, -1 if gid is None else gid)
    fd, tmp = tempfile.mkstemp(prefix=".dgxspark-secret-", dir=folder)   # created 0600
    try:
        if uid is not None or gid is not None:
            os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
        os.fchmod(fd, MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise
    return True


def remove_secret(path: str, check_mode: bool = False) -> bool:
    """Remove path (a file or a symlink; never a folder); True when it existed."""
    if not os.path.lexists(path):
        return False
    if os.path.isdir(path) and not os.path.islink(path):
        raise SecretFileError("%s is a folder, not a secret file: nothing was removed" % path)
    if not check_mode:
        os.unlink(path)
    return True
