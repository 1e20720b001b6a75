# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_safe_paths: every level of a folder root trusts is root's, no symlink, not writable by others (a sticky
root-owned ancestor such as /var/tmp excepted); missing levels made 0755; writes below it never follow a symlink."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _safe_paths as sp

DIR = stat.S_IFDIR
ME = os.geteuid()
TRUSTED = {0, ME}


def fake(tree: dict[str, tuple[int, int]]):
    """An lstat over {path: (mode with type bits, uid)}; other paths are missing."""
    def lstat(path: str) -> os.stat_result:
        if path not in tree:
            raise FileNotFoundError(path)
        mode, uid = tree[path]
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))
    return lstat


ROOTS = {"/": (DIR | 0o755, 0), "/var": (DIR | 0o755, 0), "/var/tmp": (DIR | 0o1777, 0)}
MODEL = "/var/tmp/models/m"


def check(tree: dict[str, tuple[int, int]], path: str = MODEL, trusted=frozenset({0})) -> list[str]:
    return sp.check_levels(path, trusted, "the model folder", "dgxspark_vllm_model_path", lstat=fake(tree),
                           readlink=lambda p: "/etc")


@pytest.mark.parametrize("path, expected", [
    ("/", ["/"]),
    ("/var/tmp/models/m", ["/", "/var", "/var/tmp", "/var/tmp/models", "/var/tmp/models/m"]),
    ("/var//tmp/./models/", ["/", "/var", "/var/tmp", "/var/tmp/models"]),
])
def test_levels_top_down(path: str, expected: list[str]) -> None:
    assert sp.levels(path) == expected


def test_a_relative_path_is_refused() -> None:
    with pytest.raises(sp.UnsafePathError, match="'models/m' is not an absolute path"):
        sp.levels("models/m")


@pytest.mark.parametrize("mode, uid, last, problem", [
    (DIR | 0o755, 0, True, None),
    (DIR | 0o700, 0, True, None),
    (DIR | 0o1777, 0, False, None),                                   # /var/tmp as an ancestor
    (DIR | 0o1777, 0, True, "/x has mode 1777 (writable by the group or others)"),   # /var/tmp as the folder
    (DIR | 0o777, 0, False, "/x has mode 0777 (writable by the group or others)"),   # no sticky bit
    (DIR | 0o775, 0, False, "/x has mode 0775 (writable by the group or others)"),
    (DIR | 0o1775, 1234, False, "/x belongs to 1234 (uid 1234), not root"),           # sticky but not root's
    (DIR | 0o755, 1234, True, "/x belongs to 1234 (uid 1234), not root"),
    (stat.S_IFLNK | 0o777, 0, True, "/x is a symlink (to /etc)"),
    (stat.S_IFREG | 0o644, 0, True, "/x is not a folder"),
])
def test_level_problem(mode: int, uid: int, last: bool, problem: str | None) -> None:
    found = sp.level_problem("/x", mode, uid, "/etc", last, {0})
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


def test_the_recipes_path_is_safe_under_the_sticky_var_tmp_and_its_missing_levels_are_named() -> None:
    assert check(ROOTS) == ["/var/tmp/models", MODEL]
    assert check({**ROOTS, "/var/tmp/models": (DIR | 0o755, 0)}) == [MODEL]
    assert check({**ROOTS, "/var/tmp/models": (DIR | 0o755, 0), MODEL: (DIR | 0o755, 0)}) == []


def test_a_level_planted_by_a_local_user_is_refused_naming_it_and_the_fix() -> None:
    with pytest.raises(sp.UnsafePathError) as refused:
        check({**ROOTS, "/var/tmp/models": (DIR | 0o755, 4321)})
    assert str(refused.value) == (
        "refusing the model folder /var/tmp/models/m (dgxspark_vllm_model_path): /var/tmp/models belongs to 4321 "
        "(uid 4321), not root: its owner can replace what root downloads and serves below it. Fix: remove it "
        "(sudo rm -rf -- /var/tmp/models: anyone may have made it there; staging makes the missing levels again, "
        "root's, mode 0755), or set dgxspark_vllm_model_path to a folder whose every level is root's and not writable "
        "by others; then run again")


def test_a_symlinked_level_is_refused_naming_its_target_and_the_fix() -> None:
    with pytest.raises(sp.UnsafePathError) as refused:
        check({**ROOTS, "/var/tmp/models": (DIR | 0o755, 0), MODEL: (stat.S_IFLNK | 0o777, 0)})
    assert str(refused.value) == (
        "refusing the model folder /var/tmp/models/m (dgxspark_vllm_model_path): /var/tmp/models/m is a symlink (to "
        "/etc): root would follow it wherever its owner points it. Fix: point dgxspark_vllm_model_path at the real "
        "folder instead of the link, or remove the link (sudo rm -- /var/tmp/models/m); then run again")


def test_a_level_open_to_others_is_refused_with_chmod_as_the_fix() -> None:
    with pytest.raises(sp.UnsafePathError) as refused:
        check({**ROOTS, "/var/tmp/models": (DIR | 0o777, 0)})
    assert str(refused.value) == (
        "refusing the model folder /var/tmp/models/m (dgxspark_vllm_model_path): /var/tmp/models has mode 0777 "
        "(writable by the group or others): they can replace what root downloads and serves below it. Fix: sudo chmod "
        "go-w /var/tmp/models (after checking that nothing below it was changed by others), or set "
        "dgxspark_vllm_model_path to a folder whose every level is root's and not writable by others; then run again")


def test_the_top_most_unsafe_level_is_named_first() -> None:
    with pytest.raises(sp.UnsafePathError, match=r": /var has mode 0777"):
        check({**ROOTS, "/var": (DIR | 0o777, 0), "/var/tmp/models": (DIR | 0o755, 4321)})


def test_a_file_where_a_folder_belongs_is_refused() -> None:
    with pytest.raises(sp.UnsafePathError, match=r": /var/tmp/models is not a folder\. Fix: remove it"):
        check({**ROOTS, "/var/tmp/models": (stat.S_IFREG | 0o644, 0)})


def test_a_trusted_owner_may_own_levels() -> None:
    tree = {**ROOTS, "/home": (DIR | 0o755, 0), "/home/spark": (DIR | 0o750, 54321),
            "/home/spark/hub": (DIR | 0o755, 54321)}
    assert check(tree, "/home/spark/hub", trusted={0, 54321}) == []
    with pytest.raises(sp.UnsafePathError) as refused:
        check(tree, "/home/spark/hub")
    # not under /tmp or /var/tmp: no advice to remove someone's home
    assert str(refused.value).endswith(
        ": /home/spark belongs to 54321 (uid 54321), not root: its owner can replace what root downloads and serves "
        "below it. Fix: set dgxspark_vllm_model_path to a folder whose every level is root's and not writable by "
        "others, or give it to root (sudo chown root: /home/spark) if you trust its owner and everything below it; "
        "then run again")


# ---------------------------------------------------------------------------------------------- on disk


def test_ensure_folder_makes_every_missing_level_0755(tmp_path: Path) -> None:
    os.umask(previous := os.umask(0o077))      # a strict umask must not leave the levels 0700
    try:
        os.umask(0o077)
        made = sp.ensure_folder(str(tmp_path / "models" / "m"), TRUSTED, "the model folder", "v")
    finally:
        os.umask(previous)
    assert made == [str(tmp_path / "models"), str(tmp_path / "models" / "m")]
    for level in made:
        assert stat.S_IMODE(os.lstat(level).st_mode) == 0o755
        assert os.lstat(level).st_uid == ME
    assert sp.ensure_folder(str(tmp_path / "models" / "m"), TRUSTED, "the model folder", "v") == []


def test_ensure_folder_without_create_makes_nothing(tmp_path: Path) -> None:
    assert sp.ensure_folder(str(tmp_path / "m"), TRUSTED, "the model folder", "v", create=False) == [
        str(tmp_path / "m")]
    assert not (tmp_path / "m").exists()


def test_ensure_folder_refuses_a_planted_symlink_and_makes_nothing_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "models").symlink_to(elsewhere)
    with pytest.raises(sp.UnsafePathError, match=rf"{tmp_path}/models is a symlink \(to {elsewhere}\)"):
        sp.ensure_folder(str(tmp_path / "models" / "m"), TRUSTED, "the model folder", "v")
    assert not list(elsewhere.iterdir())


def test_ensure_folder_refuses_a_folder_open_to_others(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models").chmod(0o777)
    with pytest.raises(sp.UnsafePathError, match=rf"{tmp_path}/models has mode 0777"):
        sp.ensure_folder(str(tmp_path / "models" / "m"), TRUSTED, "the model folder", "v")
    assert not (tmp_path / "models" / "m").exists()


@pytest.mark.skipif(ME != 0, reason="giving a folder to another user needs root")
def test_ensure_folder_refuses_another_users_folder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    os.chown(tmp_path / "models", 65534, 65534)
    with pytest.raises(sp.UnsafePathError, match=rf"{tmp_path}/models belongs to \S+ \(uid 65534\), not root"):
        sp.ensure_folder(str(tmp_path / "models" / "m"), {0}, "the model folder", "v")
    assert not (tmp_path / "models" / "m").exists()


@pytest.fixture(name="tree")
def fixture_tree(tmp_path: Path) -> tuple[sp.SafeTree, Path, Path]:
    """A checked folder, and a victim file outside it that a planted symlink points to."""
    anchor = tmp_path / "m"
    anchor.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    return sp.SafeTree(str(anchor)), anchor, victim


def test_open_append_refuses_a_symlink_and_writes_nothing_through_it(tree) -> None:
    safe, anchor, victim = tree
    (anchor / "a.part").symlink_to(victim)
    with pytest.raises(sp.UnsafePathError, match=rf"{anchor}/a.part is a symlink: refusing to write through it"):
        safe.open_append(str(anchor / "a.part"))
    with pytest.raises(sp.UnsafePathError, match=rf"{anchor}/a.part is not a regular file"):
        safe.size(str(anchor / "a.part"))
    assert victim.read_text() == "root's file\n"


def test_a_symlinked_folder_inside_is_not_walked_through(tree) -> None:
    safe, anchor, victim = tree
    (anchor / ".cache").symlink_to(victim.parent)
    with pytest.raises(sp.UnsafePathError, match=rf"{anchor}/.cache is a symlink or not a folder: refusing"):
        safe.open_append(str(anchor / ".cache" / "victim"))
    with pytest.raises(sp.UnsafePathError, match="is a symlink or not a folder"):
        safe.makedirs(str(anchor / ".cache" / "dgxspark"))
    with pytest.raises(sp.UnsafePathError, match="is a symlink or not a folder"):
        safe.write_text(str(anchor / ".cache" / "victim"), "planted")
    assert victim.read_text() == "root's file\n"
    assert not (victim.parent / "dgxspark").exists()


def test_unlink_removes_the_link_not_its_target(tree) -> None:
    safe, anchor, victim = tree
    (anchor / "config.json").symlink_to(victim)
    assert safe.unlink(str(anchor / "config.json")) is True
    assert not os.path.lexists(anchor / "config.json")
    assert victim.read_text() == "root's file\n"
    assert safe.unlink(str(anchor / "config.json")) is False


def test_write_text_replaces_a_planted_link_instead_of_writing_through_it(tree) -> None:
    safe, anchor, victim = tree
    (anchor / ".dgxspark-stamp.json").symlink_to(victim)
    safe.write_text(str(anchor / ".dgxspark-stamp.json"), "{}\n")
    assert not (anchor / ".dgxspark-stamp.json").is_symlink()
    assert (anchor / ".dgxspark-stamp.json").read_text() == "{}\n"
    assert victim.read_text() == "root's file\n"
    assert sorted(p.name for p in anchor.iterdir()) == [".dgxspark-stamp.json"]


def test_append_replace_symlink_and_readlink_below_the_folder(tree) -> None:
    safe, anchor, _victim = tree
    with safe.open_append(str(anchor / ".cache" / "dgxspark" / "a.part")) as handle:
        handle.write(b"abc")
    assert safe.size(str(anchor / ".cache" / "dgxspark" / "a.part")) == 3
    assert stat.S_IMODE((anchor / ".cache").stat().st_mode) & 0o022 == 0
    safe.replace(str(anchor / ".cache" / "dgxspark" / "a.part"), str(anchor / "sub" / "a"))
    assert (anchor / "sub" / "a").read_bytes() == b"abc"
    safe.symlink("sub/a", str(anchor / "link"))
    assert safe.readlink(str(anchor / "link")) == "sub/a"
    assert safe.readlink(str(anchor / "sub" / "a")) is None
    assert safe.lstat(str(anchor / "nothing" / "here")) is None and safe.size(str(anchor / "nothing")) == 0


def test_paths_outside_the_folder_are_refused(tree) -> None:
    safe, anchor, _victim = tree
    with pytest.raises(sp.UnsafePathError, match="is not inside"):
        safe.write_text(str(anchor.parent / "victim"), "x")
    with pytest.raises(sp.UnsafePathError, match="is not inside"):
        safe.unlink(str(anchor))
