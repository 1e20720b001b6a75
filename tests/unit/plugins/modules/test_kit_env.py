# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the kit_env module: the rendered .env, the checkout's contract check, the licence purpose."""
from __future__ import annotations

import hashlib
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _kit
from ansible_collections.dgxspark.vllm.plugins.modules import kit_env
from helpers.module_runner import ModuleFail, run_module

HEAD = {"name": "spark1", "cx7_ip": "192.168.100.11", "head": True, "cx7_iface": "enp1s0f1np1",
        "ib_hca": "rocep1s0f1", "gid_index": 3}
WORKER = {"name": "spark2", "cx7_ip": "192.168.100.12", "cx7_iface": "enP2p1s0f1np1",
          "ib_hca": "roceP2p1s0f1", "gid_index": 4}
SETTINGS = {"hf_bin": "/usr/local/bin/hf", "accept_noncommercial_drafter": True,
            "model": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "port": 8888}


def example(extra: str = "") -> str:
    lines = [f"{key.name}={_kit.quote(key.value)}" for key in _kit.EXAMPLE_KEYS if key.active]
    return "\n".join(lines + ([extra] if extra else [])) + "\n"


def _run(check_mode: bool = False, **args: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"settings": SETTINGS, "node": HEAD, "peers": [WORKER]}
    base.update(args)
    return run_module(kit_env.main, base, check_mode=check_mode)


def test_renders_the_env_with_its_checksum_and_changes_nothing() -> None:
    result = _run(example=example())
    assert result["changed"] is False
    assert result["content"] == _kit.render_env(SETTINGS, HEAD, [WORKER])
    assert result["checksum"] == hashlib.sha256(result["content"].encode()).hexdigest()
    assert result["values"]["HEAD_GID"] == "3" and result["values"]["WORKER_GID"] == "4"
    assert result["changed_from_kit"]["MODEL"] == "brandonmusic/GLM-5.3-Flash-tr3-4bpw"
    assert "PORT" not in result["changed_from_kit"]           # 8888 is the kit default
    assert result["drafter"] == _kit.DRAFTER_REPO and result["drafter_licence"] == _kit.DRAFTER_LICENCE
    assert "GPU_MEM_UTIL" in result["unset_in_caller"]


def test_check_mode_renders_the_same() -> None:
    assert _run(check_mode=True)["content"] == _run()["content"]


def test_a_checkout_with_another_contract_is_refused() -> None:
    with pytest.raises(ModuleFail, match="does not model: LOAD_FORMAT"):
        _run(example=example("LOAD_FORMAT=instanttensor"))


def test_render_errors_name_the_variable() -> None:
    with pytest.raises(ModuleFail, match="dgxspark_vllm_accept_noncommercial_drafter"):
        _run(settings=dict(SETTINGS, accept_noncommercial_drafter=False))
    with pytest.raises(ModuleFail, match="settings.hf_bin is missing"):
        _run(settings={"accept_noncommercial_drafter": True})


def test_env_purpose_needs_the_node() -> None:
    with pytest.raises(ModuleFail, match="node"):
        run_module(kit_env.main, {"settings": SETTINGS})


@pytest.mark.parametrize(("settings", "refused"), [
    ({"drafter": "incoai/GLM-5.3-Flash-DFlash2", "accept_noncommercial_drafter": False}, True),
    ({"drafter": "incoai/GLM-5.3-Flash-DFlash2"}, True),
    ({"drafter": "incoai/GLM-5.3-Flash-DFlash2", "accept_noncommercial_drafter": True}, False),
    ({"drafter": "someone/other-drafter", "accept_noncommercial_drafter": False}, False),
    ({"drafter": "incoai/GLM-5.3-Flash-DFlash2", "env": {"SPEC_METHOD": "mtp"}}, False),
])
def test_licence_purpose(settings: dict[str, Any], refused: bool) -> None:
    args = {"purpose": "licence", "settings": settings}
    if refused:
        with pytest.raises(ModuleFail, match="CC BY-NC-ND.*dgxspark_vllm_accept_noncommercial_drafter: true"):
            run_module(kit_env.main, args)
    else:
        result = run_module(kit_env.main, args)
        assert result["changed"] is False and "content" not in result
