# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's generated API key: made once on the head, kept root-only, read back by every run.

When the API listens beyond loopback and the inventory sets no ``dgxspark_vllm_api_key``, the collection does not
serve an open API: it generates a key (``secrets.token_urlsafe``, 256 bits), keeps it in a 0600 file in a 0700
folder on the head, and every later run reads the same key back. The file is created atomically and only when
absent (a new file linked into place: two runs racing for it end with one key), and read with the checks of
``_secret_file`` (a regular file, not a symlink, nobody else's, nobody else can read it).
"""
from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile

from ansible_collections.dgxspark.vllm.plugins.module_utils import _secret_file as sf

KEY_BYTES = 32
# what a usable key looks like: the characters token_urlsafe writes, and what a user may have put there by hand
_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")


class ApiKeyError(Exception):
    """A key file that cannot be used as it is, with what to do about it."""


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def check_key(key: str, path: str) -> str:
    """The key read from path when it is usable; ApiKeyError naming the file and the fix otherwise."""
    if not _KEY.match(key):
        raise ApiKeyError(
            "%s does not hold a usable API key (%s): remove it and the next run generates a new one (clients "
            "then need the new key), or write a key of at least 16 characters of A-Z a-z 0-9 . _ ~ + / = - "
            "into it (mode 0600)" % (path, "it is empty" if not key else "%d characters, or one that is not "
                                     "allowed" % len(key)))
    return key


def _check_folder(folder: str, euid: int) -> None:
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ApiKeyError("%s is not a folder (a symlink?): the API key's folder must be a real folder of root's; "
                          "remove it and run again" % folder)
    if st.st_uid not in (euid, 0):
        raise ApiKeyError("%s belongs to uid %d, not to root: another user could replace the API key in it; "
                          "remove it (or `chown root: %s`) and run again" % (folder, st.st_uid, folder))
    if st.st_mode & 0o022:
        raise ApiKeyError("%s has mode %04o: others can add or replace files in it, so the API key in it cannot "
                          "be trusted; run `chmod go-w %s`" % (folder, stat.S_IMODE(st.st_mode), folder))


def read_or_create(path: str, check_mode: bool = False, euid: int | None = None) -> tuple[str, bool]:
    """(the key in path, whether it was created now). In check mode a missing file is not written: the key
    returned is a new one that this run would write."""
    me = os.geteuid() if euid is None else euid
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(path):
        _check_folder(folder, me)
        try:
            return check_key(sf.read_secret(path, me), path), False
        except sf.SecretFileError as exc:
            raise ApiKeyError(str(exc)) from exc
    key = new_key()
    if check_mode:
        return key, True
    if not os.path.lexists(folder):
        os.makedirs(os.path.dirname(folder) or "/", exist_ok=True)
        try:
            os.mkdir(folder, sf.DIR_MODE)
        except FileExistsError:
            pass   # another run made it: checked below like any folder found there
    _check_folder(folder, me)
    fd, tmp = tempfile.mkstemp(prefix=".dgxspark-api-key-", dir=folder)   # created 0600
    try:
        os.fchmod(fd, sf.MODE)
        data = (key + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)   # fails when the key appeared meanwhile: that key wins
        except FileExistsError:
            return check_key(sf.read_secret(path, me), path), False
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
    return key, True
