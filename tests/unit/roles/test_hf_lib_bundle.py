# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint role's controller-side build of the huggingface_hub folder (roles/checkpoint/files/hf_lib_bundle.py):
once per key, under a lock, renamed into place (runs of several clusters build at the same time)."""
from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.util
import os
import stat
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "checkpoint" / "files" / "hf_lib_bundle.py"
KEY = "0123456789ab"
PINNED = Path(__file__).resolve().parents[3] / "roles" / "checkpoint" / "files" / "hf_lib_requirements.txt"
FAKE_HASH = "0" * 64


def requirements(tmp: Path, text: str = f"huggingface_hub==0.36.0 --hash=sha256:{FAKE_HASH}\n") -> str:
    """A requirements file pinning the tests' package (a folder built already needs no pip, so no real hash)."""
    path = tmp / "requirements.txt"
    path.write_text(text)
    return str(path)


def folder(build_dir: Path) -> Path:
    """A built folder (so that pip is not needed): what pip --target leaves."""
    lib = build_dir / KEY / "huggingface_hub"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("__version__ = 'lab'\n")
    (build_dir / KEY / "filelock.py").write_text("# a dependency\n")
    return build_dir / KEY


def start(build_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--build-dir", str(build_dir), "--key", KEY,
                             "--python-version", "3.11", "--arch", "aarch64",
                             "--requirements", requirements(build_dir.parent), "huggingface_hub==0.36.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def offline_pip(tmp: Path, wheels: Path | None = None) -> dict[str, str]:
    """pip without the machine's configuration and without an index: wheels only from the given folder."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
           "PIP_NO_CACHE_DIR": "1", "XDG_CACHE_HOME": str(tmp / "cache")}
    if wheels is not None:
        env["PIP_FIND_LINKS"] = str(wheels)
    return env


def toy_wheel(folder: Path, marker: str = "lab") -> str:
    """A pure-Python wheel huggingface_hub 0.36.0 (a marker in its __init__.py); returns its SHA-256."""
    folder.mkdir(exist_ok=True)
    path = folder / "huggingface_hub-0.36.0-py3-none-any.whl"
    files = {"huggingface_hub/__init__.py": f"__version__ = '{marker}'\n",
             "huggingface_hub-0.36.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: huggingface_hub\nVersion: 0.36.0\n",
             "huggingface_hub-0.36.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                       "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("huggingface_hub-0.36.0.dist-info/RECORD,,")
    files["huggingface_hub-0.36.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    build = tmp_path / "build"
    reqs = requirements(tmp_path, "huggingface_hub==0.36.0 --hash=sha256:%s\n--no-such-pip-option\n" % FAKE_HASH)
    run = subprocess.run([sys.executable, str(SCRIPT), "--build-dir", str(build), "--key", KEY,
                          "--python-version", "3.11", "--arch", "aarch64", "--requirements", reqs,
                          "huggingface_hub==0.36.0"],
                         capture_output=True, text=True, timeout=120, check=False, env=offline_pip(tmp_path))
    assert run.returncode == 1
    assert "pip could not install huggingface_hub==0.36.0 for Python 3.11 on aarch64" in run.stderr
    assert sorted(path.name for path in build.iterdir()) == [".lock"]


# The build folder is unpacked on the nodes and run by root: it must be the running user's alone.

def run_script(*args: str, env: dict | None = None, reqs: str = "") -> subprocess.CompletedProcess[str]:
    if not reqs:
        reqs = requirements(Path(tempfile.mkdtemp(prefix="hf-lib-reqs-")))
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--key", KEY, "--python-version", "3.11",
                           "--arch", "aarch64", "--requirements", reqs, "huggingface_hub==0.36.0"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)


def test_the_default_folder_is_the_users_cache_created_private(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    folder(cache / "dgxspark.vllm" / "hf-lib")      # built already: no pip needed
    (cache / "dgxspark.vllm").chmod(0o700)
    (cache / "dgxspark.vllm" / "hf-lib").chmod(0o700)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)}
    run = run_script(env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["archive"] == str(cache / "dgxspark.vllm" / "hf-lib" / f"{KEY}.tar.gz")
    fresh = tmp_path / "fresh"
    run = run_script(env={**env, "XDG_CACHE_HOME": str(fresh)})
    # no pip wheel for the fake key's packages is needed to see the folder made: it exists, 0700, before pip runs
    assert stat.S_IMODE((fresh / "dgxspark.vllm" / "hf-lib").stat().st_mode) == 0o700
    assert stat.S_IMODE((fresh / "dgxspark.vllm").stat().st_mode) == 0o700


def test_a_symlinked_build_folder_is_refused_and_nothing_in_it_is_read(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    folder(planted)
    planted.chmod(0o700)
    link = tmp_path / "build"
    link.symlink_to(planted)
    run = run_script("--build-dir", str(link))
    assert run.returncode == 2
    assert f"refusing the build folder: {link} is a symlink (to {planted})" in run.stderr
    assert not (planted / f"{KEY}.tar.gz").exists() and not (planted / ".lock").exists()


def test_a_build_folder_open_to_others_is_refused_naming_the_fix(tmp_path: Path) -> None:
    build = tmp_path / "build"
    folder(build)
    build.chmod(0o777)
    run = run_script("--build-dir", str(build))
    assert run.returncode == 2
    assert f"{build} has mode 0777: others could change what the nodes run as root; chmod 0700 {build}" in run.stderr
    assert not (build / f"{KEY}.tar.gz").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_build_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    build = tmp_path / "build"
    folder(build)
    build.chmod(0o700)
    os.chown(build, 65534, 65534)
    run = run_script("--build-dir", str(build))
    assert run.returncode == 2
    assert f"{build} belongs to uid 65534, not to this user (uid 0)" in run.stderr
    assert not (build / f"{KEY}.tar.gz").exists()


def test_a_planted_lock_symlink_is_not_followed(tmp_path: Path) -> None:
    build = tmp_path / "build"
    folder(build)
    build.chmod(0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    (build / ".lock").symlink_to(victim)
    run = run_script("--build-dir", str(build))
    assert run.returncode == 2
    assert "its lock" in run.stderr and "a symlink is refused" in run.stderr
    assert victim.read_text() == "root's file\n"
    assert not (build / f"{KEY}.tar.gz").exists()


# The wheels are verified by hash (pip --require-hashes), the hashes pinned in the collection.

def test_the_collections_pins_cover_the_default_packages_with_hashes() -> None:
    spec = importlib.util.spec_from_file_location("hf_lib_bundle", SCRIPT)
    assert spec is not None and spec.loader is not None
    hf_lib_bundle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_lib_bundle)
    pinned = hf_lib_bundle.pins(PINNED.read_text())
    defaults = (SCRIPT.parents[1] / "defaults" / "main.yml").read_text()
    packages = [line.split("- ", 1)[1].strip() for line in defaults.split("checkpoint_hf_packages:", 1)[1].splitlines()[1:]
                if line.startswith("  - ")]
    assert packages and hf_lib_bundle.unpinned(packages, pinned, str(PINNED)) == []
    assert pinned["huggingface-hub"][0] and all(hashes >= 1 for _version, hashes in pinned.values())
    # the platforms the bundle targets: the binary wheels have one hash per architecture at least
    assert pinned["pyyaml"][1] >= 2 and pinned["hf-xet"][1] >= 2


def test_a_package_not_pinned_with_hashes_is_refused_before_pip_runs(tmp_path: Path) -> None:
    build = tmp_path / "build"
    older = f"huggingface_hub==0.35.0 \\\n    --hash=sha256:{FAKE_HASH}\n"
    run = run_script("--build-dir", str(build), reqs=requirements(tmp_path, older))
    assert run.returncode == 2
    assert (f"refusing the build: huggingface_hub==0.36.0 is not pinned with its hashes in {tmp_path}/requirements.txt "
            "(it pins 0.35.0); every wheel is installed with pip --require-hashes from that file") in run.stderr
    run = run_script("--build-dir", str(build), reqs=requirements(tmp_path, "huggingface_hub==0.36.0\n"))
    assert run.returncode == 2 and "huggingface_hub==0.36.0 is not pinned with its hashes" in run.stderr
    assert not build.exists()


def test_a_wheel_whose_hash_differs_is_refused_and_nothing_is_installed(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    good = toy_wheel(wheels)
    other = hashlib.sha256(b"another wheel").hexdigest()
    build = tmp_path / "build"
    run = subprocess.run([sys.executable, str(SCRIPT), "--build-dir", str(build), "--key", KEY, "--python-version",
                          "3.11", "--arch", "aarch64",
                          "--requirements", requirements(tmp_path, f"huggingface_hub==0.36.0 --hash=sha256:{other}\n"),
                          "huggingface_hub==0.36.0"],
                         capture_output=True, text=True, timeout=120, check=False, env=offline_pip(tmp_path, wheels))
    assert run.returncode == 1, run.stderr
    assert good in run.stderr and other in run.stderr           # pip's own lines: expected and received
    assert (f"refusing the build: a wheel pip fetched does not match the SHA-256 pinned in {tmp_path}/requirements.txt"
            in run.stderr)
    assert sorted(path.name for path in build.iterdir()) == [".lock"]   # no folder, no archive


def test_a_wheel_with_its_pinned_hash_is_built_into_the_archive(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    good = toy_wheel(wheels, marker="pinned")
    build = tmp_path / "build"
    run = subprocess.run([sys.executable, str(SCRIPT), "--build-dir", str(build), "--key", KEY, "--python-version",
                          "3.11", "--arch", "aarch64",
                          "--requirements", requirements(tmp_path, f"huggingface_hub==0.36.0 --hash=sha256:{good}\n"),
                          "huggingface_hub==0.36.0"],
                         capture_output=True, text=True, timeout=120, check=False, env=offline_pip(tmp_path, wheels))
    assert run.returncode == 0, run.stderr
    assert (build / KEY / "huggingface_hub" / "__init__.py").read_text() == "__version__ = 'pinned'\n"
    assert "huggingface_hub/__init__.py" in names(build / f"{KEY}.tar.gz")
