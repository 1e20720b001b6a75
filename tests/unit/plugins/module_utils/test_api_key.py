# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's generated API key (plugins/module_utils/_api_key.py)."""
from __future__ import annotations

import os
import stat
import threading

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _api_key
from ansible_collections.dgxspark.vllm.plugins.module_utils._api_key import ApiKeyError, read_or_create


def test_a_missing_key_is_generated_once_private_and_read_back(tmp_path) -> None:
    path = str(tmp_path / "dgxspark" / "api-key")
    key, created = read_or_create(path)
    assert created and len(key) >= 40 and key.strip() == key
    st = os.lstat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert read_or_create(path) == (key, False)
    assert read_or_create(str(tmp_path / "other" / "api-key"))[0] != key   # random, not derived
    assert os.listdir(os.path.dirname(path)) == ["api-key"]   # no temporary file left


def test_check_mode_writes_nothing(tmp_path) -> None:
    path = tmp_path / "dgxspark" / "api-key"
    key, created = read_or_create(str(path), check_mode=True)
    assert created and key and not path.exists() and not path.parent.exists()


def test_two_runs_racing_end_with_one_key(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "api-key")
    # the other run links its key in between this run's check and its own link
    real_link = os.link

    def link_after_the_other(src: str, dst: str) -> None:
        monkeypatch.setattr(os, "link", real_link)
        with open(dst, "x", encoding="utf-8") as other:
            os.chmod(dst, 0o600)
            other.write("the-other-runs-key-0123456789\n")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_the_other)
    assert read_or_create(path) == ("the-other-runs-key-0123456789", False)
    assert open(path, encoding="utf-8").read() == "the-other-runs-key-0123456789\n"
    assert os.listdir(tmp_path) == ["api-key"]


def test_threads_racing_end_with_one_key(tmp_path) -> None:
    path = str(tmp_path / "api-key")
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(read_or_create(path)[0])) for _thread in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys) == 8


@pytest.mark.parametrize("plant, message", [
    (lambda p: os.symlink("/etc/hostname", p), "cannot open the secret file"),
    (lambda p: (open(p, "w").write("k" * 40), os.chmod(p, 0o644)), "has mode 0644: group or others can use it"),
    (lambda p: (open(p, "w").write("short"), os.chmod(p, 0o600)), "does not hold a usable API key"),
    (lambda p: (open(p, "w").write(""), os.chmod(p, 0o600)), "does not hold a usable API key (it is empty)"),
    (lambda p: (open(p, "w").write("has a space inside it"), os.chmod(p, 0o600)), "does not hold a usable API key"),
    (os.mkdir, "is not a regular file"),
])
def test_a_key_file_that_cannot_be_trusted_is_refused_and_left(tmp_path, plant, message) -> None:
    path = str(tmp_path / "api-key")
    plant(path)

    def identity(path: str) -> tuple[int, ...]:   # not the access time: reading the file may move it
        found = os.lstat(path)
        return found.st_ino, found.st_mode, found.st_size, found.st_mtime_ns, found.st_uid

    before = identity(path)
    with pytest.raises(ApiKeyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_or_create(path)
    assert identity(path) == before   # never replaced


def test_another_users_key_file_is_refused(tmp_path) -> None:
    path = tmp_path / "api-key"
    path.write_text("k" * 40)
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, 4242, -1)   # a plain user's file where root's key should be
        with pytest.raises(ApiKeyError, match="belongs to uid 4242, not to this user"):
            read_or_create(str(path))
    else:
        with pytest.raises(ApiKeyError, match="belongs to uid %d, not to this user" % os.geteuid()):
            read_or_create(str(path), euid=os.geteuid() + 1)


def test_another_users_folder_is_refused(tmp_path) -> None:
    folder = tmp_path / "dgxspark"
    folder.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    os.chown(folder, 4242, -1)
    with pytest.raises(ApiKeyError, match="belongs to uid 4242, not to root"):
        read_or_create(str(folder / "api-key"))
    assert os.listdir(folder) == []


@pytest.mark.parametrize("folder_mode, message", [
    (0o777, "has mode 0777: others can add or replace files in it"),
    (0o775, "has mode 0775"),
])
def test_a_folder_others_can_write_is_refused(tmp_path, folder_mode, message) -> None:
    folder = tmp_path / "dgxspark"
    folder.mkdir()
    folder.chmod(folder_mode)
    with pytest.raises(ApiKeyError, match=message):
        read_or_create(str(folder / "api-key"))
    assert os.listdir(folder) == []   # nothing written into it


def test_a_symlinked_folder_is_refused(tmp_path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "dgxspark")
    with pytest.raises(ApiKeyError, match="is not a folder \\(a symlink\\?\\)"):
        read_or_create(str(tmp_path / "dgxspark" / "api-key"))
    assert os.listdir(tmp_path / "real") == []


def test_new_keys_are_long_and_url_safe() -> None:
    keys = {_api_key.new_key() for _key in range(50)}
    assert len(keys) == 50
    assert all(len(key) >= 43 and _api_key.check_key(key, "p") == key for key in keys)
