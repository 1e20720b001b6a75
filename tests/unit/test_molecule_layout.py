# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The molecule scenarios share what they have in common instead of copying it: one base configuration
(.config/molecule/config.yml: the lab, its inventory, create and destroy) and extensions/molecule/shared/ for the playbooks and
task files more than one scenario runs."""
from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MOLECULE = ROOT / "extensions" / "molecule"
BASE = ROOT / ".config" / "molecule" / "config.yml"


def scenarios() -> list:
    return sorted(path.parent for path in MOLECULE.glob("*/molecule.yml"))


def test_the_base_configuration_names_shared_playbooks_that_exist():
    playbooks = yaml.safe_load(BASE.read_text(encoding="utf-8"))["provisioner"]["playbooks"]
    assert set(playbooks) == {"create", "destroy"}
    for scenario in scenarios():
        for path in playbooks.values():   # molecule resolves them from each scenario's folder
            assert (scenario / path).resolve().is_file(), (scenario.name, path)


def test_no_scenario_repeats_the_base_or_carries_its_own_create_and_destroy():
    base = yaml.safe_load(BASE.read_text(encoding="utf-8"))
    for scenario in scenarios():
        config = yaml.safe_load((scenario / "molecule.yml").read_text(encoding="utf-8"))
        assert not {"driver", "dependency", "verifier", "prerun"} & set(config), scenario.name
        # another set of lab nodes (the four-node lab's scenario) is the one base value a scenario may replace
        assert "platforms" not in config or config["platforms"] != base["platforms"], scenario.name
        assert not {"create", "destroy"} & set(((config.get("provisioner") or {}).get("playbooks") or {})), scenario.name
        assert not (scenario / "create.yml").exists() and not (scenario / "destroy.yml").exists(), scenario.name
        for path in ((config.get("provisioner") or {}).get("playbooks") or {}).values():
            assert (scenario / path).resolve().is_file(), (scenario.name, path)
    assert base["driver"]["name"] == "default"


def test_the_shared_folder_is_no_scenario():
    assert not (MOLECULE / "shared" / "molecule.yml").exists()
    assert MOLECULE / "shared" not in scenarios()


def test_no_two_scenarios_carry_the_same_file():
    seen = {}
    for scenario in scenarios():
        for path in sorted(scenario.rglob("*.yml")):
            if path.name == "molecule.yml":
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest not in seen, "%s repeats %s: move it to extensions/molecule/shared/" % (
                path.relative_to(ROOT), seen.get(digest))
            seen[digest] = path.relative_to(ROOT)


def test_every_scenario_has_a_cleanup_that_bin_test_runs_after_a_failure():
    """bin/test runs a failed scenario's cleanup at once (molecule cleanup -s NAME): each scenario has one, its own
    cleanup.yml or a cleanup playbook named in its molecule.yml, and it tears down what the scenario may leave
    serving (the shared teardown, playbooks/teardown.yml, or a cleanup of its own that runs it)."""
    bin_test = (ROOT / "bin" / "test").read_text(encoding="utf-8")
    assert 'molecule cleanup -s "$s"' in bin_test
    for scenario in scenarios():
        config = yaml.safe_load((scenario / "molecule.yml").read_text(encoding="utf-8"))
        named = ((config.get("provisioner") or {}).get("playbooks") or {}).get("cleanup")
        cleanup = (scenario / named).resolve() if named else scenario / "cleanup.yml"
        assert cleanup.is_file(), "%s has no cleanup playbook: bin/test could not stop what it leaves" % scenario.name
        text = cleanup.read_text(encoding="utf-8")
        if scenario.name == "staging":     # it stages and serves nothing: its cleanup undoes its faults
            continue
        assert "playbooks/teardown.yml" in text, "%s: its cleanup (%s) does not tear the serve down" % (
            scenario.name, cleanup.relative_to(ROOT))
