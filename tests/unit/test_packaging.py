# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The install metadata agrees with itself and with the code: galaxy.yml, meta/, requirements/, the EE."""
from __future__ import annotations

import pathlib
import re

import yaml
from packaging.specifiers import SpecifierSet

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def dev_pin(name: str) -> str:
    match = re.search(r"^%s==(\S+)$" % re.escape(name), (ROOT / "requirements/dev.txt").read_text(), re.MULTILINE)
    assert match, "%s is not pinned in requirements/dev.txt" % name
    return match.group(1)


def test_every_collection_used_is_declared() -> None:
    used = set()
    for folder in ("roles", "playbooks"):
        for path in (ROOT / folder).rglob("*.yml"):
            used |= set(re.findall(r"\b([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*:", path.read_text()))
            used |= set(re.findall(r"\|\s*([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*", path.read_text()))
    used = {c for c in used if c.split(".")[0] in ("community", "ansible", "containers", "kubernetes")}
    declared = set(load("galaxy.yml")["dependencies"])
    assert used - {"ansible.builtin"} <= declared, "used but not in galaxy.yml: %s" % (used - declared)


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
    for package in hf_packages:
        assert re.search(r"\s%s(\s|$)" % re.escape(package), steps), "%s is not baked into the EE" % package


def test_copying_is_the_gpl3_the_collection_declares() -> None:
    assert load("galaxy.yml")["license"] == ["GPL-3.0-or-later"]
    text = (ROOT / "COPYING").read_text()
    assert text.lstrip().startswith("GNU GENERAL PUBLIC LICENSE") and "Version 3, 29 June 2007" in text
