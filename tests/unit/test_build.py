# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tarball `ansible-galaxy collection build` makes holds the collection and its own tests, nothing else.

galaxy.yml's build_ignore leaves out the lab, molecule, the development tooling and configuration, virtualenvs and
caches; these tests build the tarball from this checkout, fail naming any such path in it, and install it to check
that the unit tests it ships are importable from the installed collection.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# path (a file, or a folder and everything under it) -> why it must not ship
DEVELOPMENT_PATHS = {
    "molecule": "molecule scenarios over the lab",
    "extensions": "molecule scenarios over the lab (extensions/molecule)",
    ".config": "molecule's base configuration",
    ".ci": "the CI entry point",
    ".lab": "the lab's state",
    "lab": "the lab's images, hub, kit stand-in and tiny model",
    "bin": "the lab and test tooling",
    "bench": "the lab's benchmarks",
    ".collections": "the checkout's link to itself as dgxspark.vllm",
    "ansible.cfg": "the checkout's Ansible configuration (points into the checkout)",
    ".ansible-lint": "lint configuration",
    ".ansible": "ansible-lint's cache",
    ".gitignore": "git configuration",
    "execution-environment.yml": "the execution environment built from a checkout (.ee/)",
    ".ee": "the execution environment's build context",
    "changelogs/.plugin-cache.yaml": "antsibull-changelog's cache",
    "requirements/dev.txt": "the development pins",
    "tests/output": "ansible-test's output",
    "tests/unit/lab": "tests of the lab (they need lab/)",
    "tests/unit/helpers/lab_hub.py": "the lab hub's test helper (it needs lab/)",
    "tests/unit/test_build.py": "this test (it needs galaxy.yml and the checkout)",
    "tests/unit/test_packaging.py": "tests of the checkout's metadata (galaxy.yml is not in an installed collection)",
    "tests/unit/test_molecule_layout.py": "tests of the molecule scenarios",
    ".venv": "a virtualenv",
    "venv": "a virtualenv",
    "artifacts": "bin/artifact's output",
}
# a folder of this name anywhere
DEVELOPMENT_FOLDERS = {
    "__pycache__": "byte code",
    ".pytest_cache": "pytest's cache",
    ".mypy_cache": "mypy's cache",
    ".ruff_cache": "ruff's cache",
    ".tox": "tox's virtualenvs",
}
LAB_INVENTORY = re.compile(r"^inventories/lab[^/]*(/|$)")
# what a user of the collection needs: a build that lost one of these is broken the other way
REQUIRED = ("MANIFEST.json", "FILES.json", "README.md", "COPYING", "CHANGELOG.rst", "meta/runtime.yml",
            "meta/execution-environment.yml", "bindep.txt", "requirements/controller.txt",
            "requirements/collections.yml", "plugins/modules/cluster_config.py", "plugins/action/cluster_config.py",
            "plugins/module_utils/_config.py", "roles/launch/tasks/main.yml", "playbooks/site.yml",
            "profiles/glm53_flash_nvfp4.yml", "inventories/example/hosts.yml", "tests/unit/conftest.py",
            "tests/fixtures/recipe_nvfp4_command.txt")


def why_development(member: str) -> str | None:
    """Why a tarball member is development-only, or None when it belongs to the collection."""
    for path, why in DEVELOPMENT_PATHS.items():
        if member == path or member.startswith(path + "/"):
            return why
    for part in member.split("/"):
        if part in DEVELOPMENT_FOLDERS:
            return DEVELOPMENT_FOLDERS[part]
    if member.endswith(".pyc"):
        return "byte code"
    if LAB_INVENTORY.match(member):
        return "a lab inventory"
    return None


def tool(name: str) -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else shutil.which(name)


@pytest.fixture(name="built", scope="module")
def fixture_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    galaxy = tool("ansible-galaxy")
    if galaxy is None:
        pytest.skip("ansible-galaxy is not installed: the collection cannot be built here")
    out = tmp_path_factory.mktemp("build")
    result = subprocess.run([galaxy, "collection", "build", str(ROOT), "--output-path", str(out)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))["version"]
    tarball = out / f"dgxspark-vllm-{version}.tar.gz"
    assert tarball.is_file(), sorted(path.name for path in out.iterdir())
    return tarball


def members(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as archive:
        return [name.removeprefix("./").rstrip("/") for name in archive.getnames()]


def test_the_tarball_holds_no_lab_development_or_virtualenv_path(built: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    names = members(built)
    with capsys.disabled():
        print(f"\n{built.name}: {built.stat().st_size} bytes, {len(names)} entries")
    flagged = {name: why for name in names if (why := why_development(name))}
    # a folder's contents are not listed again
    offenders = [f"{name} ({why})" for name, why in flagged.items() if name.rpartition("/")[0] not in flagged]
    assert not offenders, (f"{len(offenders)} development path(s) in {built.name}; add them to galaxy.yml's "
                           f"build_ignore:\n" + "\n".join(offenders[:40]))
    missing = [name for name in REQUIRED if name not in names]
    assert not missing, f"{built.name} lacks {missing}: build_ignore leaves out part of the collection"


def test_the_tarball_holds_no_file_git_ignores(built: Path) -> None:
    """A file git ignores is local output (caches, scratch, a lab's state): it never belongs in the collection."""
    git = tool("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing says which files are local output")
    names = [name for name in members(built) if name not in ("MANIFEST.json", "FILES.json")]
    result = subprocess.run([git, "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"], input="\n".join(names),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (0, 1), result.stderr
    assert not result.stdout.split(), f"files git ignores are in {built.name}: {result.stdout.split()[:20]}"


def test_the_shipped_unit_tests_load_from_the_installed_collection(built: Path, tmp_path: Path) -> None:
    """Installed (MANIFEST.json and FILES.json, no galaxy.yml, no lab/, no checkout around it), every shipped test
    module imports and is collected: none needs a path the tarball leaves out at import time."""
    galaxy = tool("ansible-galaxy")
    assert galaxy is not None
    # away from the checkout's ansible.cfg, whose collections path already resolves dgxspark.vllm to the checkout
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(tmp_path)
    result = subprocess.run([galaxy, "collection", "install", "--offline", "--no-deps", "--force", "-p",
                             str(tmp_path), str(built)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    installed = tmp_path / "ansible_collections" / "dgxspark" / "vllm"
    assert (installed / "MANIFEST.json").is_file() and not (installed / "galaxy.yml").exists()
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             str(installed / "tests" / "unit")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"^\d+ tests collected", result.stdout, re.MULTILINE), result.stdout[-2000:]
