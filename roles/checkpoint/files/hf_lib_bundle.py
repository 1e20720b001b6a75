# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build, on the controller, the huggingface_hub folder the nodes run the download module with, and its archive.

Once per content key (the packages, the nodes' Python version and CPU): pip installs binary wheels for the nodes
into a folder, which is archived for the nodes to unpack. Runs of several clusters may build at the same time: the
whole build holds a lock (``<build dir>/.lock``), and the folder and the archive are written under temporary names
and renamed, so a reader never sees half of either (nor what a killed run left). Prints one JSON line:
``{"changed": bool, "archive": path}``; on failure, pip's error and exit status 1.

What is built here is unpacked on the nodes and run by root, so the build folder must be the running user's alone:
by default ``$XDG_CACHE_HOME/dgxspark.vllm/hf-lib`` (``~/.cache/...``), created 0700; a given or existing folder that is
a symlink, belongs to someone else or is open to the group or others is refused (exit status 2) with the path and
the fix, before anything in it is read. The lock file is opened without following a symlink.

The wheels are verified by hash: pip installs only what the requirements file (``--requirements``, the role's
``hf_lib_requirements.txt``) pins, each with the SHA-256 of the wheels PyPI publishes for it (``--require-hashes``;
a dependency without a pinned hash is refused by pip too). Every package asked for must be pinned there at the same
version (exit status 2 otherwise, before pip runs). A wheel whose hash differs fails the build (exit status 1) with
a message that says so and what to do; nothing is installed.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile

PLATFORMS = ("manylinux2014", "manylinux_2_28", "manylinux_2_34")


class UnsafeBuildDir(Exception):
    """The build folder is not the running user's alone; the message names the path and the fix."""


def normalize(name: str) -> str:
    """A package name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, tuple[str, int]]:
    """The requirements file's pins: normalized name -> (version, number of --hash options)."""
    out: dict[str, tuple[str, int]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;\\]+)", line)
        if match:
            out[normalize(match.group(1))] = (match.group(2), len(re.findall(r"--hash[= ]sha256:[0-9a-f]{64}", line)))
    return out


def unpinned(packages: list[str], pinned: dict[str, tuple[str, int]], requirements: str) -> list[str]:
    """Why each asked-for package cannot be built from the requirements file (an empty list: every one can)."""
    problems = []
    for package in packages:
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$", package.strip())
        if not match:
            problems.append(f"{package} is not pinned to one version (name==version)")
            continue
        version, hashes = pinned.get(normalize(match.group(1)), ("", 0))
        if version != match.group(2) or not hashes:
            problems.append(f"{package} is not pinned with its hashes in {requirements}"
                            + (f" (it pins {version})" if version and version != match.group(2) else ""))
    if problems:
        problems.append("every wheel is installed with pip --require-hashes from that file: write it for the packages "
                        "with bin/hf-lib-hashes (the whole closure, each pinned), or set checkpoint_hf_packages to "
                        "what it pins")
    return problems


def pip_failure(stderr: str, returncode: int, requirements: str, packages: list[str], python_version: str,
                arch: str) -> str:
    """The message for a failed pip run (its own error is printed above this)."""
    if "DO NOT MATCH THE HASHES" in stderr:
        return (f"refusing the build: a wheel pip fetched does not match the SHA-256 pinned in {requirements} (pip's "
                "lines above name it, with the expected and the received hash); nothing was installed. The wheel was "
                "changed on its index, a mirror or in pip's cache, or the pin is wrong: check where pip reads from "
                "(pip config list), clear its cache (pip cache purge) and run again; if a new wheel is expected, "
                "write the pins again with bin/hf-lib-hashes")
    if "Hashes are required in --require-hashes mode" in stderr or "must have their versions pinned" in stderr:
        return (f"refusing the build: a package has no pinned version or hash in {requirements} (pip names it "
                "above; a dependency the pins do not cover): write the file again with bin/hf-lib-hashes, the "
                "whole closure pinned")
    return (f"pip could not install {' '.join(packages)} for Python {python_version} on {arch} "
            f"(exit status {returncode}; its error is above)")


def default_build_dir(environ: dict | None = None) -> str:
    """The running user's own cache folder for the build."""
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dgxspark.vllm", "hf-lib")


def private_dir(path: str) -> str:
    """Create `path` (missing levels 0700) or check it: a real folder (not a symlink), owned by the running user,
    writable by nobody else and readable by nobody else. Returns the absolute path; raises UnsafeBuildDir."""
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        previous = os.umask(0o077)     # every missing level 0700, not only the last (makedirs' mode)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        finally:
            os.umask(previous)
    info = os.lstat(path)
    fix = (f"remove it, or set checkpoint_hf_build_dir to a folder of your own (mode 0700); the default is "
           f"{default_build_dir()}")
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeBuildDir(f"{path} is a symlink (to {os.readlink(path)}): the build folder must be a real folder; "
                             + fix)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeBuildDir(f"{path} is not a folder; " + fix)
    if info.st_uid != os.geteuid():
        raise UnsafeBuildDir(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): whoever "
                             "owns it decides what the nodes run as root; " + fix)
    if info.st_mode & 0o077:
        raise UnsafeBuildDir(f"{path} has mode {stat.S_IMODE(info.st_mode):04o}: others could change what the nodes "
                             f"run as root; chmod 0700 {path}, or " + fix)
    return path


def build(build_dir: str, key: str, python_version: str, arch: str, requirements: str) -> bool:
    """Make <build_dir>/<key>/ and <build_dir>/<key>.tar.gz when either is missing; True when something was made."""
    folder = os.path.join(build_dir, key)
    archive = f"{folder}.tar.gz"
    changed = False
    if not os.path.exists(os.path.join(folder, "huggingface_hub", "__init__.py")):
        tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=build_dir)
        try:
            run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                  "--target", tmp, "--only-binary=:all:", "--implementation", "cp",
                                  "--python-version", python_version,
                                  *[f"--platform={tag}_{arch}" for tag in PLATFORMS],
                                  "--require-hashes", "--requirement", requirements],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
            if run.returncode != 0:
                sys.stderr.write(run.stderr)
                raise subprocess.CalledProcessError(run.returncode, "pip", stderr=run.stderr)
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        changed = True
    if changed or not os.path.exists(archive):
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tar.gz", dir=build_dir)
        os.close(fd)
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                for name in sorted(os.listdir(folder)):
                    tar.add(os.path.join(folder, name), arcname=name)
            os.chmod(tmp, 0o644)
            os.replace(tmp, archive)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        changed = True
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-dir", default="", help="default: the running user's " + default_build_dir())
    parser.add_argument("--key", required=True)
    parser.add_argument("--python-version", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--requirements", required=True,
                        help="the pinned packages with the SHA-256 of their wheels (pip --require-hashes)")
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args()
    requirements = os.path.abspath(args.requirements)
    try:
        with open(requirements, encoding="utf-8") as handle:
            problems = unpinned(args.packages, pins(handle.read()), requirements)
    except OSError as exc:
        problems = [f"the requirements file {requirements} cannot be read ({exc.strerror})"]
    if problems:
        print("refusing the build: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        build_dir = private_dir(args.build_dir or default_build_dir())
    except UnsafeBuildDir as exc:
        print(f"refusing the build folder: {exc}", file=sys.stderr)
        return 2
    try:
        fd = os.open(os.path.join(build_dir, ".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        print(f"refusing the build folder: its lock {os.path.join(build_dir, '.lock')} cannot be opened as a file of "
              f"its own ({exc.strerror}: a symlink is refused)", file=sys.stderr)
        return 2
    with os.fdopen(fd, "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            changed = build(build_dir, args.key, args.python_version, args.arch, requirements)
        except subprocess.CalledProcessError as exc:
            print(pip_failure(exc.stderr or "", exc.returncode, requirements, args.packages, args.python_version,
                              args.arch), file=sys.stderr)
            return 1
    print(json.dumps({"changed": changed, "archive": os.path.join(build_dir, f"{args.key}.tar.gz")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
