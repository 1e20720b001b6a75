# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Folders root trusts (the model and cache trees): every level root's, no symlink, nobody else can write.

Private module: may change at any time. Stdlib only, no Ansible imports.

Rules (`level_problem`), for every existing level of a folder's path from ``/`` down to the folder itself:

- owned by root (or another trusted owner: the user the module runs as, a named owner such as the EXL3 kit's user,
  who is in the docker group and so root's equal already);
- not a symlink: root would follow it wherever its owner points it;
- a folder, not writable by the group or others: whoever can write in a level can rename what is below it and put
  their own folder or symlink in its place.

One exception, for ancestors only: a folder owned by a trusted owner with the sticky bit (``/tmp``, ``/var/tmp``:
root's, mode 1777) may be world-writable. The sticky bit lets only an entry's owner (or root) rename or remove it,
so a root-owned folder in it cannot be swapped; whoever creates the entry first owns it, which the next level's
owner check refuses. The recipe's paths under ``/var/tmp`` are safe that way. The folder itself may not be such a
folder (``/var/tmp`` is no model tree).

Missing levels are created one at a time (``ensure_folder``), each with ``mkdir`` relative to its parent's file
descriptor, mode 0755, owned by the user that runs (root on the nodes); a level that appears between the check and
the ``mkdir`` (a race) is checked again and refused if it is not safe.

`SafeTree` writes inside a checked folder without following any symlink: every path is walked from the folder's
descriptor, one component at a time with ``O_NOFOLLOW``; files are opened with ``O_NOFOLLOW``; unlink, rename and
symlink act on the entry itself (relative to its parent's descriptor), never on a resolved path.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, BinaryIO

DIR_MODE = 0o755
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(Exception):
    """A folder root would trust is not safe; the message names the path, what is wrong and the fix."""


def owner_name(uid: int) -> str:
    """The account name of uid, or the number when it has none."""
    try:
        import pwd  # pylint: disable=import-outside-toplevel
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def levels(path: str) -> list[str]:
    """Every level of an absolute path, from ``/`` down to the path (normalized, no ``..``)."""
    if not path.startswith("/"):
        raise UnsafePathError(f"{path!r} is not an absolute path: give the folder as an absolute path")
    norm = os.path.normpath(path)
    out = ["/"]
    current = ""
    for part in norm.split("/"):
        if part:
            current = f"{current}/{part}"
            out.append(current)
    return out


def level_problem(level: str, mode: int, uid: int, link_target: str | None, is_folder: bool,
                  trusted_uids: Collection[int]) -> str | None:
    """What is wrong with one existing level of a trusted folder's path ('is ...' / 'belongs to ...'), or None.

    ``is_folder``: the level is the folder itself (not an ancestor), where a sticky world-writable folder is refused.
    """
    owners = " or ".join(sorted({owner_name(u) for u in trusted_uids}, key=lambda n: (n != "root", n)))
    if stat.S_ISLNK(mode):
        return f"{level} is a symlink (to {link_target}): root would follow it wherever its owner points it"
    if not stat.S_ISDIR(mode):
        return f"{level} is not a folder"
    if uid not in trusted_uids:
        return (f"{level} belongs to {owner_name(uid)} (uid {uid}), not {owners}: its owner can replace what root "
                "downloads and serves below it")
    writable = mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (is_folder or not mode & stat.S_ISVTX):
        return (f"{level} has mode {stat.S_IMODE(mode):04o} (writable by the group or others): they can replace what "
                "root downloads and serves below it")
    return None


def level_fix(level: str, problem: str, variable: str, shared_parent: bool) -> str:
    """The fix for a level's problem, as commands an operator runs on the node. ``shared_parent``: the level sits in
    a sticky world-writable folder (/tmp, /var/tmp), where anyone may have planted it: removing it is the fix."""
    elsewhere = f"set {variable} to a folder whose every level is root's and not writable by others"
    if " is a symlink " in problem:
        return f"point {variable} at the real folder instead of the link, or remove the link (sudo rm -- {level})"
    if " has mode " in problem:
        return f"sudo chmod go-w {level} (after checking that nothing below it was changed by others), or {elsewhere}"
    if shared_parent:
        return (f"remove it (sudo rm -rf -- {level}: anyone may have made it there; staging makes the missing "
                f"levels again, root's, mode 0755), or {elsewhere}")
    return f"{elsewhere}, or give it to root (sudo chown root: {level}) if you trust its owner and everything below it"


def check_levels(path: str, trusted_uids: Collection[int], subject: str, variable: str,
                 lstat: Callable[[str], os.stat_result] = os.lstat,
                 readlink: Callable[[str], str] = os.readlink) -> list[str]:
    """Check every existing level of path (top down); return the missing levels (top down).

    Raises UnsafePathError naming the folder (``subject``, ``variable``), the first unsafe level, what is wrong with
    it and the fix. A level under a missing one is missing too."""
    missing: list[str] = []
    all_levels = levels(path)
    shared = False      # the level above is a sticky world-writable folder
    for level in all_levels:
        if missing:
            missing.append(level)
            continue
        try:
            info = lstat(level)
        except FileNotFoundError:
            missing.append(level)
            continue
        target = None
        if stat.S_ISLNK(info.st_mode):
            try:
                target = readlink(level)
            except OSError:
                target = "?"
        problem = level_problem(level, info.st_mode, info.st_uid, target, level == all_levels[-1], trusted_uids)
        if problem:
            raise UnsafePathError(f"refusing {subject} {path} ({variable}): {problem}. Fix: "
                                  f"{level_fix(level, problem, variable, shared)}; then run again")
        shared = bool(info.st_mode & stat.S_ISVTX and info.st_mode & stat.S_IWOTH)
    return missing


def ensure_folder(path: str, trusted_uids: Collection[int], subject: str, variable: str,
                  create: bool = True) -> list[str]:
    """Check path as check_levels does and, with create, make its missing levels (mode 0755, the running user's,
    each relative to its parent's descriptor, never through a symlink). Returns the levels that were (or, without
    create, would be) made."""
    missing = check_levels(path, trusted_uids, subject, variable)
    if not create or not missing:
        return missing
    for level in missing:
        parent, name = os.path.split(level)
        parent_fd = os.open(parent, _DIR_FLAGS)
        try:
            try:
                os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
            except FileExistsError:
                pass        # made by someone else meanwhile: the check below decides
            child = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                check_levels(path, trusted_uids, subject, variable)   # names what appeared there
            raise
        finally:
            os.close(parent_fd)
        try:
            info = os.fstat(child)
            if info.st_uid == os.geteuid():
                os.fchmod(child, DIR_MODE)
        finally:
            os.close(child)
    if check_levels(path, trusted_uids, subject, variable):
        raise UnsafePathError(f"{path} ({variable}) could not be created: a level vanished while it was made; "
                              "run again")
    return missing


def _open_child(fd: int, name: str, create: bool) -> int | None:
    """A descriptor of the folder name in the folder fd (made 0755 when missing and create), never through a
    symlink; None when it is missing and not created."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(name, DIR_MODE, dir_fd=fd)
    except FileExistsError:
        pass    # made meanwhile: opened below like any other, without following a symlink
    return os.open(name, _DIR_FLAGS, dir_fd=fd)


class SafeTree:
    """Reads and writes below one checked folder (``anchor``) without following any symlink: each path is walked
    from the anchor's descriptor, one component at a time (``O_NOFOLLOW``), and acted on relative to its parent's
    descriptor. A symlink or a non-folder on the way is refused with UnsafePathError naming it."""

    def __init__(self, anchor: str) -> None:
        self.anchor = os.path.normpath(anchor)

    def _parts(self, path: str) -> list[str]:
        rel = os.path.relpath(os.path.normpath(path), self.anchor)
        parts = [] if rel == "." else rel.split(os.sep)
        if not parts or ".." in parts:
            raise UnsafePathError(f"{path} is not inside {self.anchor}: refusing to write there")
        return parts

    def _walk(self, parts: list[str], create: bool) -> int | None:
        """A descriptor of the folder parts name below the anchor (None when a level is missing and not created)."""
        fd = os.open(self.anchor, _DIR_FLAGS)
        done = self.anchor
        try:
            for part in parts:
                done = os.path.join(done, part)
                try:
                    child = _open_child(fd, part, create)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePathError(f"{done} is a symlink or not a folder: refusing to go through it (root "
                                              f"would follow it out of {self.anchor}); remove it (sudo rm -- {done}) "
                                              "and run again") from exc
                    raise
                if child is None:
                    return None
                os.close(fd)
                fd = child
            found, fd = fd, -1
            return found
        finally:
            if fd >= 0:
                os.close(fd)

    def _parent(self, path: str, create: bool) -> tuple[int | None, str]:
        parts = self._parts(path)
        return self._walk(parts[:-1], create), parts[-1]

    def makedirs(self, path: str) -> None:
        """Make path's missing folders (0755) below the anchor."""
        if os.path.normpath(path) == self.anchor:
            return
        fd = self._walk(self._parts(path), create=True)
        if fd is not None:
            os.close(fd)

    def lstat(self, path: str) -> os.stat_result | None:
        """The entry itself (a symlink is not followed), None when it or a level above it is missing."""
        fd, name = self._parent(path, create=False)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def size(self, path: str) -> int:
        """The size of a regular file (0 when missing); a symlink or anything else is refused."""
        info = self.lstat(path)
        if info is None:
            return 0
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(f"{path} is not a regular file (a symlink or something else): refusing to use it; "
                                  f"remove it (sudo rm -- {path}) and run again")
        return info.st_size

    def open_append(self, path: str, mode: int = 0o644) -> BinaryIO:
        """Open a regular file for appending (created when missing), never through a symlink."""
        fd, name = self._parent(path, create=True)
        if fd is None:   # pragma: no cover - create=True always gives a descriptor
            raise UnsafePathError(f"{path}: its folder is missing")
        try:
            try:
                file_fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                                  dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafePathError(f"{path} is a symlink: refusing to write through it; remove it "
                                          f"(sudo rm -- {path}) and run again") from exc
                raise
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise UnsafePathError(f"{path} is not a regular file: refusing to write to it; remove it and run again")
        return os.fdopen(file_fd, "ab")

    def unlink(self, path: str) -> bool:
        """Remove the entry itself (a symlink, not what it points to). False when it was not there."""
        fd, name = self._parent(path, create=False)
        if fd is None:
            return False
        try:
            os.unlink(name, dir_fd=fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        """Rename src over dst (dst's folders made); the entries themselves, never what a symlink points to."""
        src_fd, src_name = self._parent(src, create=False)
        if src_fd is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        try:
            dst_fd, dst_name = self._parent(dst, create=True)
            try:
                os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            finally:
                if dst_fd is not None:
                    os.close(dst_fd)
        finally:
            os.close(src_fd)

    def readlink(self, path: str) -> str | None:
        """Where a symlink points (None when path is not a symlink)."""
        info = self.lstat(path)
        if info is None or not stat.S_ISLNK(info.st_mode):
            return None
        fd, name = self._parent(path, create=False)
        if fd is None:   # pragma: no cover - lstat found it
            return None
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def symlink(self, target: str, path: str) -> None:
        """Make path a symlink to target, replacing the entry that is there (a file or a link, never a folder)."""
        fd, name = self._parent(path, create=True)
        if fd is None:   # pragma: no cover - create=True always gives a descriptor
            raise UnsafePathError(f"{path}: its folder is missing")
        try:
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            os.symlink(target, name, dir_fd=fd)
        finally:
            os.close(fd)

    def write_text(self, path: str, text: str) -> None:
        """Write a file whole (a new temporary file, renamed over path): never through a symlink."""
        fd, name = self._parent(path, create=True)
        if fd is None:   # pragma: no cover - create=True always gives a descriptor
            raise UnsafePathError(f"{path}: its folder is missing")
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
            file_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                              dir_fd=fd)
            with os.fdopen(file_fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)


# The launch: the serve container runs as root with the model folder mounted and the cache folder as its HF_HOME.
SUBJECTS = {"dgxspark_vllm_model_path": "the model folder",
            "dgxspark_vllm_cache_path": "the cache folder (HF_HOME of the root serve container)",
            "dgxspark_vllm_hf_home": "the hub cache folder (HF_HOME)"}


def folder_problems(folders: Mapping[str, str], trusted_uids: Collection[int],
                    lstat: Callable[[str], os.stat_result] = os.lstat,
                    readlink: Callable[[str], str] = os.readlink) -> list[str]:
    """For each folder (its variable -> its path), the refusal of its first unsafe existing level. Missing levels
    are no problem here: staging makes them (root's, 0755) and Docker's bind mount makes a missing cache folder so."""
    problems = []
    for variable, path in sorted(folders.items()):
        if not path:
            continue
        try:
            check_levels(path, trusted_uids, SUBJECTS.get(variable, "the folder"), variable, lstat, readlink)
        except UnsafePathError as exc:
            problems.append(str(exc))
    return problems


def launch_refusal(order: Sequence[str], states: Mapping[str, Any]) -> str | None:
    """Why nothing may start: a node's model or cache folder (read by vllm_node_state's trusted_folders) is not
    root's alone. None when every node's folders are safe (or were not read)."""
    found = [f"{name}: {problem}" for name in order
             for problem in ((states.get(name) or {}).get("folders") or [])]
    if not found:
        return None
    return ("The launch cannot start: a folder the serve container (root) mounts is not root's alone - "
            + " | ".join(found) + ". Nothing was started or stopped.")
