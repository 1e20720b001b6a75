# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The install metadata agrees with itself and with the code: galaxy.yml, meta/, requirements/, the EE.

Dependencies are checked both ways: what the code uses is declared, and what is declared is used.
"""
from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def dev_pin(name: str) -> str:
    match = re.search(r"^%s==(\S+)$" % re.escape(name), (ROOT / "requirements/dev.txt").read_text(), re.MULTILINE)
    assert match, "%s is not pinned in requirements/dev.txt" % name
    return match.group(1)


# --------------------------------------------------------------------------- collections

_FQCN = r"([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*"
_NAMESPACES = ("community", "ansible", "containers", "kubernetes")


def collections_used() -> set[str]:
    """Every collection the roles, playbooks and plugins call: task keys (module FQCNs), filters and tests after a
    pipe or an ``is``, lookups, and Python imports of ``ansible_collections.<ns>.<name>``; ansible.builtin and this
    collection left out."""
    used: set[str] = set()
    for folder in ("roles", "playbooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".yml", ".yaml", ".j2"):
                continue
            text = path.read_text()
            used |= set(re.findall(r"\b%s:" % _FQCN, text))
            used |= set(re.findall(r"(?:\||\bis\s+(?:not\s+)?)\s*%s" % _FQCN, text))
            used |= set(re.findall(r"\b(?:lookup|query|q)\(\s*['\"]%s" % _FQCN, text))
    for path in list((ROOT / "plugins").rglob("*.py")) + list((ROOT / "roles").glob("*/files/*.py")):
        used |= set(re.findall(r"^\s*(?:from|import)\s+ansible_collections\.([a-z0-9_]+\.[a-z0-9_]+)\b",
                               path.read_text(), re.MULTILINE))
    return {c for c in used if c.split(".")[0] in _NAMESPACES} - {"ansible.builtin", "dgxspark.vllm"}


def test_every_collection_used_is_declared() -> None:
    used = collections_used()
    declared = set(load("galaxy.yml")["dependencies"])
    assert used <= declared, "used but not in galaxy.yml: %s" % (used - declared)


def test_every_collection_declared_is_used() -> None:
    """A declared collection nothing calls only makes every install fetch it (community.general did, for nothing)."""
    used = collections_used()
    for name, declared in (("galaxy.yml", set(load("galaxy.yml")["dependencies"])),
                           ("requirements/collections.yml",
                            {c["name"] for c in load("requirements/collections.yml")["collections"]})):
        assert declared <= used, "declared in %s but called nowhere: %s" % (name, sorted(declared - used))
    mentioned = set(re.findall(r"\b((?:%s)\.[a-z][a-z0-9_]*)\b" % "|".join(_NAMESPACES),
                               (ROOT / "execution-environment.yml").read_text()))
    assert mentioned - {"ansible.builtin"} <= used, "execution-environment.yml names %s" % sorted(mentioned - used)


def test_dependencies_are_ranges_and_match_the_checkout_requirements() -> None:
    galaxy = load("galaxy.yml")["dependencies"]
    for name, spec in galaxy.items():
        assert ">=" in spec and "<" in spec.replace("<=", ""), "%s: %s is not a range with an upper bound" % (name, spec)
    checkout = {c["name"]: c["version"] for c in load("requirements/collections.yml")["collections"]}
    assert checkout == galaxy


def test_ansible_core_tested_is_inside_every_declared_range() -> None:
    tested = dev_pin("ansible-core")
    assert tested in SpecifierSet(load("meta/runtime.yml")["requires_ansible"])
    controller = (ROOT / "requirements/controller.txt").read_text()
    spec = re.search(r"^ansible-core(\S+)$", controller, re.MULTILINE).group(1)
    assert tested in SpecifierSet(spec)
    assert "-r controller.txt" in (ROOT / "requirements/dev.txt").read_text().splitlines()


def test_ee_files_ship_with_the_collection() -> None:
    ee = load("meta/execution-environment.yml")
    ignored = load("galaxy.yml")["build_ignore"]
    for path in ee["dependencies"].values():
        assert (ROOT / path).is_file()
        assert not any(path == i or path.startswith(i.rstrip("/") + "/") for i in ignored), path


def test_execution_environment_matches_the_collection_and_the_pins() -> None:
    ee = load("execution-environment.yml")
    version = load("galaxy.yml")["version"]
    assert ee["dependencies"]["galaxy"]["collections"] == [
        {"name": "collections/dgxspark-vllm-%s.tar.gz" % version, "type": "file"}]
    assert ee["dependencies"]["ansible_core"]["package_pip"] == "ansible-core==%s" % dev_pin("ansible-core")
    hf_packages = load("roles/checkpoint/defaults/main.yml")["checkpoint_hf_packages"]
    steps = " ".join(ee["additional_build_steps"]["append_final"])
    # exactly the wheels the checkpoint role pins with their SHA-256 (its build installs them with --require-hashes)
    assert "--require-hashes" in steps
    assert re.search(r"--requirement \S*/dgxspark/vllm/roles/checkpoint/files/hf_lib_requirements\.txt(\s|$)", steps)
    pinned = (ROOT / "roles" / "checkpoint" / "files" / "hf_lib_requirements.txt").read_text()
    for package in hf_packages:
        assert re.search(r"(?m)^%s \\$" % re.escape(package), pinned), "%s is not pinned for the EE" % package


# --------------------------------------------------------------------------- version policy (README, "Release notes")

# fragment sections that need at least a minor bump: new features, changed or removed behaviour
_FEATURE_SECTIONS = {"major_changes", "minor_changes", "breaking_changes", "deprecated_features", "removed_features"}


def pending_fragments() -> dict[str, set[str]]:
    """changelogs/fragments/*.yml not released yet -> their sections."""
    return {path.name: set(yaml.safe_load(path.read_text()) or {})
            for path in sorted((ROOT / "changelogs" / "fragments").glob("*.y*ml"))}


def test_the_version_is_the_next_release_while_changes_are_pending() -> None:
    """galaxy.yml's version names the release the pending fragments go into: never one already released (its
    changes would ship under the old number), at least a minor bump over the latest release while a fragment adds or
    changes behaviour, at least a patch bump for fixes only."""
    version = Version(load("galaxy.yml")["version"])
    releases = load("changelogs/changelog.yaml")["releases"]
    released = sorted(Version(name) for name in releases)
    latest = released[-1]
    pending = pending_fragments()
    if not pending:
        assert version >= latest, "galaxy.yml's version %s is older than the release %s" % (version, latest)
        return
    names = ", ".join(sorted(pending))
    released_on = releases.get(str(version), {}).get("release_date", "?")
    assert str(version) not in releases and version not in released, (
        "galaxy.yml's version %s was released on %s, and %d fragment(s) are pending (%s): bump galaxy.yml's "
        "version to the next release's" % (version, released_on, len(pending), names))
    assert version > latest, "galaxy.yml's version %s is older than the release %s" % (version, latest)
    features = sorted(name for name, sections in pending.items() if sections & _FEATURE_SECTIONS)
    if features:
        assert version.release[:2] > latest.release[:2], (
            "fragments %s add or change behaviour: galaxy.yml's version %s must be at least %d.%d.0 (a minor bump "
            "over %s)" % (features, version, latest.major, latest.minor + 1, latest))


def test_the_readme_names_this_version_and_the_supported_ansible_core() -> None:
    """The README's installation commands build and install this version, and its support matrix states
    meta/runtime.yml's ansible-core range and the tested pins."""
    text = (ROOT / "README.md").read_text()
    version = load("galaxy.yml")["version"]
    assert set(re.findall(r"dgxspark-vllm(?:-ee:|-)(\d+\.\d+\.\d+)", text)) == {version}
    assert "`%s`" % load("meta/runtime.yml")["requires_ansible"] in text
    for name in ("ansible-core", "matplotlib"):
        assert dev_pin(name) in text, "the README's support matrix lacks %s %s" % (name, dev_pin(name))
    for name, spec in load("galaxy.yml")["dependencies"].items():
        assert "%s `%s`" % (name, spec) in text, "the README's support matrix lacks %s %s" % (name, spec)


def test_copying_is_the_gpl3_the_collection_declares() -> None:
    assert load("galaxy.yml")["license"] == ["GPL-3.0-or-later"]
    text = (ROOT / "COPYING").read_text()
    assert text.lstrip().startswith("GNU GENERAL PUBLIC LICENSE") and "Version 3, 29 June 2007" in text


# --------------------------------------------------------------------------- Python requirements


def requirement_names(path: str) -> set[str]:
    """The distributions a requirements file (or a YAML list of requirement strings) names, canonicalised."""
    if ":" in path:   # FILE.yml:KEY, a list of requirement strings in a YAML file
        file_name, key = path.split(":")
        lines = load(file_name)[key]
    else:
        lines = [line.split("#")[0].strip() for line in (ROOT / path).read_text().splitlines()]
    return {canonicalize_name(Requirement(line).name) for line in lines if line and not line.startswith("-")}


CONTROLLER = "requirements/controller.txt"
NODES = "roles/checkpoint/defaults/main.yml:checkpoint_hf_packages"   # staged for the nodes by the checkpoint role
DEV = "requirements/dev.txt"


def imports(paths: list[pathlib.Path]) -> dict[str, set[str]]:
    """Top-level names imported by the Python files (stdlib, __future__ and this collection left out) -> files."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("ansible_collections.dgxspark.vllm"):
                    continue
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def collection_python() -> list[pathlib.Path]:
    """The collection's Python: plugins and the programs roles ship to the nodes."""
    return sorted(ROOT.glob("plugins/**/*.py")) + sorted(ROOT.glob("roles/*/files/*.py"))


def test_python_files_of_the_collection_are_all_seen() -> None:
    """Every program a role ships is Python with a .py name (else the import scan below would miss it)."""
    for path in ROOT.glob("roles/*/files/*"):
        if path.is_file() and path.read_text(errors="replace").startswith("#!") and "python" in \
                path.read_text(errors="replace").splitlines()[0]:
            assert path.suffix == ".py", path


def providers() -> dict[str, set[str]]:
    """Import name -> the installed distributions that provide it (canonical names)."""
    return {name: {canonicalize_name(dist) for dist in dists}
            for name, dists in importlib.metadata.packages_distributions().items()}


def closure(names: set[str]) -> set[str]:
    """The distributions and everything they require (as installed here; extras and other platforms left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def undeclared(found: dict[str, set[str]], declared: set[str]) -> list[str]:
    by_name = providers()
    return ["%s (imported by %s; provided by %s)" % (
        name, ", ".join(sorted(files)), ", ".join(sorted(by_name.get(name, ()))) or "nothing installed")
        for name, files in sorted(found.items()) if not by_name.get(name, set()) & declared]


def test_every_python_import_of_the_collection_is_declared() -> None:
    """What plugins and role programs import comes from controller.txt (or what its entries require, e.g. PyYAML
    through ansible-core) or, on the nodes, from the checkpoint role's checkpoint_hf_packages."""
    declared = closure(requirement_names(CONTROLLER)) | closure(requirement_names(NODES))
    missing = undeclared(imports(collection_python()), declared)
    assert not missing, "imported but declared nowhere: %s" % "; ".join(missing)


def test_every_python_requirement_of_the_collection_is_imported() -> None:
    """Each entry of controller.txt and checkpoint_hf_packages is imported by the collection's own Python."""
    by_name = providers()
    imported = {dist for name in imports(collection_python()) for dist in by_name.get(name, set())}
    for source in (CONTROLLER, NODES):
        unused = requirement_names(source) - imported
        assert not unused, "%s declares %s, which no plugin or role program imports" % (source, sorted(unused))


def test_every_python_import_of_the_tests_is_a_development_requirement() -> None:
    local = {path.stem for path in ROOT.glob("tests/**/*.py")} | {path.parent.name for path in ROOT.glob("tests/**/__init__.py")}
    found = {name: files for name, files in imports(sorted(ROOT.glob("tests/**/*.py"))).items() if name not in local}
    missing = undeclared(found, closure(requirement_names(DEV) | requirement_names(CONTROLLER)))
    assert not missing, "the tests import what requirements/dev.txt does not bring: %s" % "; ".join(missing)


def test_every_development_requirement_is_used() -> None:
    """Each pin of dev.txt is imported (tests, plugins, the lab's Python), or is a command the tooling runs (bin/,
    .ci/), or ships a collection galaxy.yml depends on (the `ansible` package: Galaxy is unreachable here)."""
    python = sorted(ROOT.glob("tests/**/*.py")) + collection_python() + sorted(ROOT.glob("lab/**/*.py"))
    by_name = providers()
    imported = {dist for name in imports(python) for dist in by_name.get(name, set())}
    tooling = "\n".join(path.read_text() for path in [*ROOT.glob("bin/*"), ROOT / ".ci" / "run"] if path.is_file())
    commands = set(re.findall(r"(?:^|[\s;&|(`$])([a-z][a-z0-9_.-]*)", tooling, re.MULTILINE))
    commands |= set(re.findall(r"-m\s+([a-z][a-z0-9_]*)", tooling))
    dependencies = set(load("galaxy.yml")["dependencies"])
    unused = []
    for name in sorted(requirement_names(DEV) - requirement_names(CONTROLLER)):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            unused.append("%s (not installed)" % name)
            continue
        scripts = {entry.name for entry in dist.entry_points if entry.group == "console_scripts"}
        modules = {top for top, dists in by_name.items() if name in dists}
        shipped = {".".join(str(path).split("/")[1:3]) for path in dist.files or []
                   if str(path).startswith("ansible_collections/") and str(path).endswith("/MANIFEST.json")}
        if name in imported or scripts & commands or modules & commands or shipped & dependencies:
            continue
        unused.append(name)
    assert not unused, "requirements/dev.txt pins what nothing imports or runs: %s" % unused
