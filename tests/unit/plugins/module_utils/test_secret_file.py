# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_secret_file: a secret read back only from a file its owner alone can use; written 0600 from the start, replacing
whatever was there; the shell assignments of the kit's start environment."""
from __future__ import annotations

import os
import stat
import subprocess

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _secret_file as sf


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def private(path, text: str, file_mode: int = 0o600):
    path.write_text(text)
    os.chmod(path, file_mode)
    return path


@pytest.mark.parametrize("text, expected", [
    ("hf_abc\n", "hf_abc"),
    ("  hf_abc \r\n", "hf_abc"),
    ("", ""),
    ("\n", ""),
])
def test_read_secret_returns_the_secret_without_surrounding_whitespace(tmp_path, text, expected):
    assert sf.read_secret(str(private(tmp_path / "t", text))) == expected


@pytest.mark.parametrize("file_mode", [0o400, 0o600, 0o700])
def test_read_secret_takes_a_file_only_its_owner_can_use(tmp_path, file_mode):
    assert sf.read_secret(str(private(tmp_path / "t", "s", file_mode))) == "s"


@pytest.mark.parametrize("file_mode, shown", [
    (0o644, "0644"), (0o640, "0640"), (0o604, "0604"), (0o620, "0620"), (0o602, "0602"), (0o610, "0610"),
])
def test_read_secret_refuses_a_file_group_or_others_can_use(tmp_path, file_mode, shown):
    path = private(tmp_path / "t", "hf_secret", file_mode)
    with pytest.raises(sf.SecretFileError) as err:
        sf.read_secret(str(path))
    message = str(err.value)
    assert f"{path} has mode {shown}: group or others can use it" in message
    assert f"chmod 600 {path}" in message
    assert "hf_secret" not in message


def test_read_secret_refuses_a_file_of_another_user(tmp_path):
    path = private(tmp_path / "t", "s")
    me = os.geteuid()
    if me == 0:            # root may own it, so hand it to someone else
        os.chown(path, 4242, -1)
        owner, reader = 4242, 0
    else:                  # read it as if this were another user
        owner, reader = me, me + 4242
    with pytest.raises(sf.SecretFileError, match=rf"belongs to uid {owner}, not to this user \(uid {reader}\) or root"):
        sf.read_secret(str(path), euid=None if me == 0 else reader)


def test_read_secret_takes_a_file_of_root(tmp_path):
    path = private(tmp_path / "t", "s")
    if os.geteuid() != 0:
        pytest.skip("only root can make a file of root")
    assert sf.read_secret(str(path), euid=4242) == "s"


def test_write_secret_needs_the_folder_s_parent(tmp_path):
    with pytest.raises(FileNotFoundError):
        sf.write_secret(str(tmp_path / "a" / "b" / "t"), "s")


def test_read_secret_refuses_a_symlink_and_a_folder_and_names_a_missing_file(tmp_path):
    target = private(tmp_path / "t", "s")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(sf.SecretFileError, match="cannot open the secret file .*link"):
        sf.read_secret(str(tmp_path / "link"))
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    with pytest.raises(sf.SecretFileError, match="is not a regular file"):
        sf.read_secret(str(folder))
    with pytest.raises(sf.SecretFileError, match="cannot open the secret file .*missing: No such file"):
        sf.read_secret(str(tmp_path / "missing"))


def test_read_secret_refuses_bytes_that_are_not_text(tmp_path):
    path = tmp_path / "t"
    path.write_bytes(b"\xff\xfe")
    os.chmod(path, 0o600)
    with pytest.raises(sf.SecretFileError, match="is not UTF-8 text"):
        sf.read_secret(str(path))


def test_write_secret_writes_0600_and_then_changes_nothing(tmp_path):
    path = tmp_path / "dgxspark" / "hf-token"
    assert sf.write_secret(str(path), "hf_abc") is True
    assert path.read_text() == "hf_abc" and mode(path) == 0o600
    assert mode(path.parent) == 0o700                          # the folder it created: owner only
    assert sf.write_secret(str(path), "hf_abc") is False
    assert sf.read_secret(str(path)) == "hf_abc"
    assert sf.write_secret(str(path), "hf_new") is True and path.read_text() == "hf_new"
    assert [p.name for p in path.parent.iterdir()] == ["hf-token"]   # no temporary file left


def test_write_secret_replaces_a_wider_file_instead_of_rewriting_it(tmp_path):
    path = private(tmp_path / "t", "hf_abc", 0o644)
    inode = path.stat().st_ino
    assert sf.write_secret(str(path), "hf_abc") is True      # same text, wrong mode: written again
    assert mode(path) == 0o600 and path.read_text() == "hf_abc"
    assert path.stat().st_ino != inode                         # a new file, never readable by others


def test_write_secret_in_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "d" / "t"
    assert sf.write_secret(str(path), "s", check_mode=True) is True
    assert not path.parent.exists()
    private(tmp_path / "same", "s")
    assert sf.write_secret(str(tmp_path / "same"), "s", check_mode=True) is False


def test_write_secret_keeps_the_owner_it_was_asked_for(tmp_path):
    path = tmp_path / "t"
    me, group = os.geteuid(), os.getegid()
    assert sf.write_secret(str(path), "s", me, group) is True
    assert (path.stat().st_uid, path.stat().st_gid) == (me, group)
    assert sf.write_secret(str(path), "s", me, group) is False


def test_remove_secret(tmp_path):
    path = private(tmp_path / "t", "s")
    assert sf.remove_secret(str(path), check_mode=True) is True and path.exists()
    assert sf.remove_secret(str(path)) is True and not path.exists()
    assert sf.remove_secret(str(path)) is False
    (tmp_path / "d").mkdir()
    with pytest.raises(sf.SecretFileError, match="is a folder"):
        sf.remove_secret(str(tmp_path / "d"))


@pytest.mark.parametrize("env, expected", [
    ({"VLLM_API_KEY": "k-1", "HF_TOKEN": "hf_x"}, "VLLM_API_KEY=k-1\nHF_TOKEN=hf_x\n"),
    ({"VLLM_API_KEY": "", "HF_TOKEN": "hf_x"}, "HF_TOKEN=hf_x\n"),
    ({"VLLM_API_KEY": None}, ""),
    ({"K": "it's $HOME `x`"}, "K='it'\"'\"'s $HOME `x`'\n"),
])
def test_render_env_quotes_for_sh_and_leaves_out_empty_values(env, expected):
    assert sf.render_env(env) == expected


def test_render_env_survives_a_shell(tmp_path):
    value = "a'b\"c $HOME `id` \\ ;|&"
    path = tmp_path / "env"
    sf.write_secret(str(path), sf.render_env({"SECRET": value}))
    out = subprocess.run(["sh", "-c", 'set -a; . "$1"; set +a; printf %s "$SECRET"', "sh", str(path)],
                         capture_output=True, text=True, check=True, env={})
    assert out.stdout == value


@pytest.mark.parametrize("env, match", [
    ({"1X": "v"}, "'1X' is not an environment variable name"),
    ({"A B": "v"}, "'A B' is not an environment variable name"),
    ({"K": "a\nb"}, "the value of K contains a line break"),
])
def test_render_env_refuses(env, match):
    with pytest.raises(sf.SecretFileError, match=match):
        sf.render_env(env)
