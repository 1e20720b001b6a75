# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build, on the controller, the huggingface_hub folder the nodes run the download module with, and its archive.

Once per content key (the packages, the nodes' Python version and CPU): pip installs binary wheels for the nodes
into a folder, which is archived for the nodes to unpack. Runs of several clusters may build at the same time: the
whole build holds a lock (``<build dir>/.lock``), and the folder and the archive are written under temporary names
and renamed, so a reader never sees half of either (nor what a killed run left). Prints one JSON line:
``{"changed": bool, "archive": path}``; on failure, pip's error and exit status 1.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PLATFORMS = ("manylinux2014", "manylinux_2_28", "manylinux_2_34")


def build(build_dir: str, key: str, python_version: str, arch: str, packages: list[str]) -> bool:
    """Make <build_dir>/<key>/ and <build_dir>/<key>.tar.gz when either is missing; True when something was made."""
    folder = os.path.join(build_dir, key)
    archive = f"{folder}.tar.gz"
    changed = False
    if not os.path.exists(os.path.join(folder, "huggingface_hub", "__init__.py")):
        tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=build_dir)
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--target", tmp, "--only-binary=:all:", "--implementation", "cp",
                            "--python-version", python_version, *[f"--platform={tag}_{arch}" for tag in PLATFORMS],
                            *packages], check=True)
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
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--python-version", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args()
    os.makedirs(args.build_dir, exist_ok=True)
    with open(os.path.join(args.build_dir, ".lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            changed = build(args.build_dir, args.key, args.python_version, args.arch, args.packages)
        except subprocess.CalledProcessError as exc:
            print(f"pip could not install {' '.join(args.packages)} for Python {args.python_version} on {args.arch} "
                  f"(exit status {exc.returncode}; its error is above)", file=sys.stderr)
            return 1
    print(json.dumps({"changed": changed, "archive": os.path.join(args.build_dir, f"{args.key}.tar.gz")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
