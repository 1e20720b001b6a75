# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configuration step and the regression thresholds: defaults, provenance, nonsense refused by name."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._config import ConfigError, Inputs, resolve
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

HEAD, WORKER = "spark-a", "spark-b"


def inputs(**cluster: Any) -> Inputs:
    shared = {f"dgxspark_vllm_{key}": value for key, value in {"cx7_subnet": "192.168.100.0/24", **cluster}.items()}
    hostvars = {HEAD: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.11"},
                WORKER: {**shared, "dgxspark_vllm_cx7_ip": "192.168.100.12"}}
    return Inputs(hostvars=hostvars, head=[HEAD], workers=[WORKER], builtin_profiles=builtin_profile_data(),
                  ansible_user="spark")


def test_the_thresholds_default_to_decode_10_ttft_25_throughput_10() -> None:
    config = resolve(inputs())
    assert config["regression"] == {"decode_drop_percent": 10.0, "ttft_rise_percent": 25.0,
                                    "throughput_drop_percent": 10.0}
    assert config["sources"]["regression_ttft_rise_percent"] == "default"


def test_a_threshold_set_in_the_inventory_is_resolved_with_its_provenance() -> None:
    config = resolve(inputs(regression_ttft_rise_percent="40", regression_decode_drop_percent=5))
    assert config["regression"] == {"decode_drop_percent": 5.0, "ttft_rise_percent": 40.0,
                                    "throughput_drop_percent": 10.0}
    assert config["sources"]["regression_ttft_rise_percent"] == "dgxspark_vllm_regression_ttft_rise_percent"
    assert config["sources"]["regression_throughput_drop_percent"] == "default"


@pytest.mark.parametrize("given, message", [
    ({"regression_decode_drop_percent": 0}, "dgxspark_vllm_regression_decode_drop_percent is 0: a threshold must be "
                                            "a percentage above 0"),
    ({"regression_throughput_drop_percent": 100}, "dgxspark_vllm_regression_throughput_drop_percent is 100: a drop "
                                                  "of 100 % or more lets anything pass"),
    ({"regression_ttft_rise_percent": "slow"}, "dgxspark_vllm_regression_ttft_rise_percent must be a percentage, got "
                                               "'slow'"),
])
def test_nonsense_thresholds_are_refused_before_anything_starts(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as failure:
        resolve(inputs(**given))
    assert [problem for problem in failure.value.problems if message in problem]
