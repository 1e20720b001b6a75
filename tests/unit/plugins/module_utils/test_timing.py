# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a start is watched and stopped, defined once in the configuration: the launch's and the kit's defaults, the
inventory's values with their provenance, bad values and the roles' earlier variables refused by name."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import ConfigError, Inputs, describe_sources, resolve
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import DEFAULT_BUDGETS
from ansible_collections.dgxspark.vllm.plugins.module_utils._timing import RENAMED
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

BUILTIN = builtin_profile_data()
HEAD, WORKER = "spark-a", "spark-b"


def inputs(profile: str = "glm53_flash_nvfp4", checked: dict[str, Any] | None = None, **given: Any) -> Inputs:
    shared = {"dgxspark_vllm_profile": profile, "dgxspark_vllm_cx7_subnet": "192.168.100.0/24",
              "dgxspark_vllm_accept_noncommercial_drafter": True,
              **{f"dgxspark_vllm_{key}": value for key, value in given.items()}}
    hostvars = {HEAD: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.11"},
                WORKER: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.12"}}
    return Inputs(hostvars=hostvars, head=[HEAD], workers=[WORKER], builtin_profiles=BUILTIN, ansible_user="spark",
                  checked_vars={HEAD: dict(checked or {}), WORKER: dict(checked or {})})


def problems(given: Inputs) -> list[str]:
    with pytest.raises(ConfigError) as failure:
        resolve(given)
    return failure.value.problems


def test_the_launch_reads_the_watchers_own_budgets_and_the_defaults() -> None:
    config = resolve(inputs())
    assert config["timing"] == {
        "budgets": {phase: int(seconds) for phase, seconds in DEFAULT_BUDGETS.items()},
        "poll_interval": 0.5, "peer_grace_seconds": 30, "stall_seconds": 900, "progress_interval": 15,
        "api_timeout": 120, "stop_grace_seconds": 10, "diagnosis_lines": 30}
    assert config["timing"]["budgets"]["container_started"] == 120
    assert config["sources"]["timing.budgets.api_up"] == "default"
    assert config["sources"]["timing.poll_interval"] == "default"


def test_the_kit_starts_the_head_after_the_worker_so_its_defaults_are_longer_and_named() -> None:
    config = resolve(inputs("glm53_flash_exl3"))
    assert config["timing"]["budgets"] == {"container_started": 300, "rendezvous": 300, "weights_loaded": 1800,
                                           "kv_allocated": 1800, "api_up": 1800}
    assert config["timing"]["poll_interval"] == 2
    assert config["sources"]["timing.budgets.api_up"] == "default (launcher exl3_kit)"
    assert config["sources"]["timing.budgets.rendezvous"] == "default"
    assert config["sources"]["timing.poll_interval"] == "default (launcher exl3_kit)"


def test_the_inventory_sets_one_value_for_every_role_with_its_provenance() -> None:
    config = resolve(inputs("glm53_flash_exl3", budgets={"api_up": 600, "weights_loaded": "700"}, poll_interval="1",
                            stall_seconds=0, stop_grace_seconds=20, peer_grace_seconds=60))
    timing = config["timing"]
    assert timing["budgets"] == {"container_started": 300, "rendezvous": 300, "weights_loaded": 700,
                                 "kv_allocated": 1800, "api_up": 600}
    assert (timing["poll_interval"], timing["stall_seconds"], timing["stop_grace_seconds"],
            timing["peer_grace_seconds"]) == (1, 0, 20, 60)
    assert config["sources"]["timing.budgets.api_up"] == "dgxspark_vllm_budgets"
    assert config["sources"]["timing.budgets.container_started"] == "default (launcher exl3_kit)"
    assert config["sources"]["timing.stop_grace_seconds"] == "dgxspark_vllm_stop_grace_seconds"
    shown = describe_sources(config)
    assert "timing.budgets.api_up = 600 (dgxspark_vllm_budgets)" in shown
    assert "timing.poll_interval = 1 (dgxspark_vllm_poll_interval)" in shown


@pytest.mark.parametrize(("given", "message"), [
    ({"budgets": {"api_up": 0}}, "dgxspark_vllm_budgets.api_up must be a positive number of seconds, got 0"),
    ({"budgets": {"serving": 10}}, "dgxspark_vllm_budgets.serving is not a startup phase (phases: container_started"),
    ({"budgets": [900]}, "dgxspark_vllm_budgets must be a mapping of startup phases to seconds, got [900]"),
    ({"poll_interval": "soon"}, "dgxspark_vllm_poll_interval must be a number of seconds of at least 0.1, got 'soon'"),
    ({"poll_interval": True}, "dgxspark_vllm_poll_interval must be a number of seconds of at least 0.1, got True"),
    ({"stop_grace_seconds": 2.5}, "dgxspark_vllm_stop_grace_seconds must be a whole number of at least 0, got 2.5"),
    ({"stall_seconds": -1}, "dgxspark_vllm_stall_seconds must be a number of seconds of at least 0, got -1"),
])
def test_a_bad_value_is_named_with_an_example(given: dict[str, Any], message: str) -> None:
    found = problems(inputs(**given))
    assert any(problem.startswith(message) for problem in found), found
    assert all("(e.g. dgxspark_vllm_" in problem or "e.g. dgxspark_vllm_" in problem for problem in found)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_earlier_variable_still_set_is_refused_naming_its_replacement(old: str) -> None:
    new = f"dgxspark_vllm_{RENAMED[old]}"
    found = [problem for problem in problems(inputs(checked={old: 5})) if problem.startswith(old)]
    assert len(found) == 1
    assert found[0].startswith(f"{old} (on {HEAD}, {WORKER}) is no longer read: the launch, the EXL3 kit and the guard "
                               f"share one value, set it as {new} (e.g. {new}: ")
