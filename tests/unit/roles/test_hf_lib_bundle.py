# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's controller-side build of the huggingface_hub folder (roles/checkpoint/files/hf_lib_bundle.py):
once per key, under a lock, renamed into place (runs of several clusters build at the same time)."""
from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "checkpoint" / "files" / "hf_lib_bundle.py"
KEY = "0123456789ab"


def folder(build_dir: Path) -> Path:
    """A built folder (so that pip is not needed): what pip --target leaves."""
    lib = build_dir / KEY / "huggingface_hub"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("__version__ = 'lab'\n")
    (build_dir / KEY / "filelock.py").write_text("# a dependency\n")
    return build_dir / KEY


def start(build_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--build-dir", str(build_dir), "--key", KEY,
                             "--python-version", "3.11", "--arch", "aarch64", "huggingface_hub==0.36.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def test_the_archive_holds_the_folder_at_its_root_and_is_made_once(tmp_path: Path) -> None:
    folder(tmp_path)
    first = start(tmp_path)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert json.loads(out) == {"changed": True, "archive": str(tmp_path / f"{KEY}.tar.gz")}
    assert names(tmp_path / f"{KEY}.tar.gz") == ["filelock.py", "huggingface_hub", "huggingface_hub/__init__.py"]
    again = start(tmp_path)
    out, err = again.communicate(timeout=60)
    assert json.loads(out)["changed"] is False
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(f".{KEY}.")]   # nothing left aside


def test_a_second_build_waits_for_the_first_and_never_sees_half_an_archive(tmp_path: Path) -> None:
    """The test holds the build lock as a first run would: the script must wait (without the lock it would have
    written the archive within the two seconds), then finish with a whole archive once the lock is released."""
    folder(tmp_path)
    with open(tmp_path / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = start(tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=2)
        assert not (tmp_path / f"{KEY}.tar.gz").exists()
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert names(tmp_path / f"{KEY}.tar.gz")[0] == "filelock.py"


def test_a_pip_failure_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--build-dir", str(tmp_path), "--key", KEY,
                          "--python-version", "3.11", "--arch", "aarch64", "--", "--no-such-pip-option"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1
    assert "pip could not install --no-such-pip-option for Python 3.11 on aarch64" in run.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]
