# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_node_state module: files read for real, docker answered by a fake run_command."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_node_state
from helpers.module_runner import ModuleFail, run_module


def _run(args: dict[str, Any], answers: dict[str, tuple[int, str, str]], bins: dict[str, str | None],
         check_mode: bool = False) -> dict[str, Any]:
    def run_command(_self: Any, argv: Sequence[str], **_kwargs: Any) -> tuple[int, str, str]:
        for key, answer in answers.items():
            if key in " ".join(argv):
                return answer
        raise AssertionError("unexpected %r" % (argv,))

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", side_effect=lambda name, *a, **k: bins.get(name)):
        return run_module(vllm_node_state.main, args, check_mode=check_mode)


RUNNING = [{"Id": "c1", "State": {"Running": True, "ExitCode": 0},
            "Config": {"Labels": {"dgxspark.vllm.config_hash": "h1"}}}]
ANSWERS = {"container inspect": (0, json.dumps(RUNNING), ""), "image inspect": (0, "sha256:2222\n", "")}


@pytest.mark.parametrize("check_mode", [False, True])
def test_reads_stamp_and_lock_from_the_node(tmp_path: Path, check_mode: bool) -> None:
    stamp = tmp_path / ".dgxspark-stamp.json"
    stamp.write_text(json.dumps({"repo": "r", "commit": "b" * 40}))
    lock = tmp_path / "staging.lock"
    lock.write_text("")
    result = _run({"container": "vllm_glm53", "image": "img", "stamp_path": str(stamp), "lock_path": str(lock)},
                  ANSWERS, {"docker": "/usr/bin/docker", "nvidia-smi": None}, check_mode=check_mode)
    assert result["changed"] is False
    assert result["container"]["config_hash"] == "h1" and result["image_id"] == "sha256:2222"
    assert result["stamp"] == {"repo": "r", "commit": "b" * 40}
    assert result["staging_lock"] is True
    assert result["gpu"] is None


def test_absent_stamp_and_lock(tmp_path: Path) -> None:
    result = _run({"container": "vllm_glm53", "stamp_path": str(tmp_path / "none.json"),
                   "lock_path": str(tmp_path / "none.lock"), "gpu": False},
                  ANSWERS, {"docker": "/usr/bin/docker"})
    assert result["stamp"] is None and result["staging_lock"] is False and result["image_id"] is None


def test_without_the_docker_cli_it_says_so() -> None:
    with pytest.raises(ModuleFail, match="docker CLI is not installed"):
        _run({"container": "vllm_glm53"}, ANSWERS, {})
