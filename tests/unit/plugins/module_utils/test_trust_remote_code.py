# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""--trust-remote-code only where a profile says its model needs it (_profiles.py's trust_remote_code, rendered by
_serve_spec.py)."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import ProfileError, as_data, build_profiles
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    TEMPLATE_KEYS,
    SpecError,
    profile_from_data,
    render_spec,
)
from ansible_collections.dgxspark.vllm.plugins.plugin_utils._profile_files import builtin_profile_data

BUILTIN = builtin_profile_data()
NODES = [{"name": "spark1", "cx7_ip": "192.168.100.11", "head": True}, {"name": "spark2", "cx7_ip": "192.168.100.12"}]
SETTINGS = {"cx7_subnet": "192.168.100.0/24", "cx7_iface": "enp1s0f1np1", "ib_hca": "rocep1s0f1"}


def profiles(user: dict[str, Any] | None = None):
    return build_profiles(BUILTIN, user, TEMPLATE_KEYS)


def command(profile, node: str = "spark1", **settings: Any) -> list[str]:
    return render_spec(profile, NODES, node, {**SETTINGS, **settings}).container["command"]


@pytest.mark.parametrize("name", ["glm53_flash_nvfp4", "lab_cpu", "glm53_flash_exl3"])
def test_no_built_in_profile_trusts_remote_code(name: str) -> None:
    profile = profiles()[name]
    assert profile.trust_remote_code is False
    if profile.launcher == "docker_run":
        for node in ("spark1", "spark2"):
            assert "--trust-remote-code" not in command(profile, node)


def test_a_profile_that_says_so_renders_the_flag_on_every_rank_and_keeps_it_through_its_data() -> None:
    mine = profiles({"remote": {"extends": "glm53_flash_nvfp4", "trust_remote_code": True}})["remote"]
    for node in ("spark1", "spark2"):
        assert command(mine, node).count("--trust-remote-code") == 1
    # the resolved profile travels as data (the config fact) and renders the same
    again = profile_from_data(as_data(mine))
    assert again.trust_remote_code is True and command(again) == command(mine)
    # a profile that extends it inherits it
    child = profiles({"remote": {"extends": "glm53_flash_nvfp4", "trust_remote_code": True},
                      "child": {"extends": "remote"}})["child"]
    assert "--trust-remote-code" in command(child)


@pytest.mark.parametrize(("data", "expected"), [
    ({"extends": "glm53_flash_nvfp4", "args": ["--trust-remote-code"]},
     "set trust_remote_code: true, with a comment that says why"),
    ({"extends": "glm53_flash_nvfp4", "trust_remote_code": "yes"}, "trust_remote_code must be true or false"),
])
def test_the_flag_in_args_or_a_non_boolean_is_refused(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProfileError, match=expected):
        profiles({"mine": data})


def test_the_flag_in_extra_args_is_refused() -> None:
    with pytest.raises(SpecError, match="must not contain --trust-remote-code"):
        command(profiles()["glm53_flash_nvfp4"], extra_args=["--trust-remote-code"])
