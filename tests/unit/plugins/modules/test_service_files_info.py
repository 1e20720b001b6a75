# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the service_files_info module: files read for real, systemctl answered by a fake run_command."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.modules import service_files_info
from helpers.module_runner import ModuleFail, run_module

ACTIVE = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
MISSING = "LoadState=not-found\nActiveState=inactive\nUnitFileState=\n"


def _run(args: dict[str, Any], units: dict[str, str], check_mode: bool = False) -> tuple[dict[str, Any], list[str]]:
    asked: list[str] = []

    def run_command(_self: Any, argv: Sequence[str], **_kwargs: Any) -> tuple[int, str, str]:
        assert argv[1] == "show", argv
        asked.append(argv[2])
        if argv[2] not in units:
            return 1, "", "Failed to connect to bus"
        return 0, units[argv[2]], ""

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", return_value="/usr/bin/systemctl"):
        return run_module(service_files_info.main, args, check_mode=check_mode), asked


@pytest.mark.parametrize("check_mode", [False, True])
def test_compares_its_own_files_and_reads_the_callers_alongside(tmp_path: Path, check_mode: bool) -> None:
    own = tmp_path / "flush.json"
    own.write_text("planned")
    theirs = tmp_path / "guard.json"
    theirs.write_text('{"x": 1}')
    result, asked = _run({"unit": "flush.service",
                          "files": [{"path": str(own), "content": "planned"}],
                          "also": {"units": ["guard.service", "gone.service"],
                                   "files": [{"path": str(theirs), "read": True},
                                             {"path": str(tmp_path / "lock")}]}},
                         {"flush.service": ACTIVE, "guard.service": ACTIVE, "gone.service": MISSING},
                         check_mode=check_mode)
    assert result["changed"] is False and result["current"] is True and result["differences"] == []
    assert asked == ["flush.service", "guard.service", "gone.service"]
    assert result["also"]["units"]["guard.service"]["running"] is True
    assert result["also"]["units"]["gone.service"]["loaded"] is False
    first, lock = result["also"]["files"]
    assert first["content"] == '{"x": 1}' and first["matches"] is None and first["exists"] is True
    assert lock["exists"] is False and "content" not in lock


def test_what_it_reads_alongside_never_makes_it_not_current(tmp_path: Path) -> None:
    # the caller's unit is missing and its file absent: the flush service is still as planned
    also = {"units": ["gone.service"], "files": [{"path": str(tmp_path / "absent"), "read": True}]}
    result, _asked = _run({"unit": "flush.service", "also": also}, {"flush.service": ACTIVE, "gone.service": MISSING})
    assert result["current"] is True
    assert result["also"]["files"][0]["content"] is None


@pytest.mark.parametrize("show", [ACTIVE, "LoadState=loaded\nActiveState=failed\nUnitFileState=disabled\n"])
def test_with_compare_state_false_an_installed_unit_is_current_running_or_not(tmp_path: Path, show: str) -> None:
    own = tmp_path / "flush.json"
    own.write_text("planned")
    args = {"unit": "flush.service", "files": [{"path": str(own), "content": "planned"}]}
    result, _asked = _run(dict(args, compare_state=False), {"flush.service": show})
    assert result["current"] is True and result["differences"] == []
    assert result["unit"]["stopped"] is (show != ACTIVE)
    # compared (the default), a stopped, disabled unit is a difference; not installed is one either way
    assert _run(args, {"flush.service": show})[0]["current"] is (show == ACTIVE)
    assert _run(dict(args, compare_state=False), {"flush.service": MISSING})[0]["current"] is False


def test_without_also_the_result_has_an_empty_one(tmp_path: Path) -> None:
    result, asked = _run({"unit": "flush.service"}, {"flush.service": MISSING})
    assert asked == ["flush.service"]
    assert result["also"] == {"units": {}, "files": [], "by_name": {}}
    assert result["current"] is False and "not installed" in result["differences"][0]


def test_a_unit_systemctl_cannot_show_fails_naming_it() -> None:
    with pytest.raises(ModuleFail, match="systemctl show guard.service failed on this node: Failed to connect"):
        _run({"also": {"units": ["guard.service"]}}, {})


def test_files_are_returned_by_name_too(tmp_path: Path) -> None:
    program = tmp_path / "flush.py"
    program.write_text("print()")
    key = tmp_path / "key.pub"
    key.write_text("ssh-ed25519 AAAA")
    result, _asked = _run({"files": [{"path": str(program), "content": "print()", "name": "program"},
                                     {"path": str(tmp_path / "absent.json"), "content": "{}"}],
                           "also": {"files": [{"path": str(tmp_path / "lock")},
                                              {"path": str(key), "read": True, "name": "public_key"}]}}, {})
    assert result["by_name"] == {"program": result["files"][0]}
    assert result["by_name"]["program"]["matches"] is True
    assert result["also"]["by_name"] == {"public_key": result["also"]["files"][1]}
    assert result["also"]["by_name"]["public_key"]["content"] == "ssh-ed25519 AAAA"


def test_without_names_the_mappings_are_empty(tmp_path: Path) -> None:
    result, _asked = _run({"files": [{"path": str(tmp_path / "a")}]}, {})
    assert result["by_name"] == {} and result["also"]["by_name"] == {}


def test_a_name_given_twice_fails_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(ModuleFail, match="also.files: the name 'key' is given to 2 files"):
        _run({"unit": "flush.service", "also": {"files": [{"path": str(tmp_path / "a"), "name": "key"},
                                                          {"path": str(tmp_path / "b"), "name": "key"}]}}, {})


@pytest.mark.parametrize("started_ago, stale", [(100.0, True), (-5.0, False)])
def test_a_running_unit_older_than_a_file_it_runs_from_is_not_current(
        tmp_path: Path, started_ago: float, stale: bool) -> None:
    """The node's own clocks: the file is written now; the process started 100 s ago (before it: stale, a restart is
    due) or will have started 5 s from now (after it: as planned)."""
    own = tmp_path / "flush.json"
    own.write_text("planned")
    since = int((time.monotonic() - started_ago) * 1e6)
    show = ACTIVE + f"ExecMainStartTimestampMonotonic={since}\n"
    result, _asked = _run({"unit": "flush.service", "files": [{"path": str(own), "content": "planned"}],
                           "also": {"units": ["guard.service"], "files": [{"path": str(own)}]}},
                          {"flush.service": show, "guard.service": show})
    assert result["unit"]["stale"] is stale and result["current"] is not stale
    assert result["unit"]["stale_files"] == ([str(own)] if stale else [])
    assert abs(result["files"][0]["mtime"] - own.stat().st_mtime) < 1e-6
    assert abs(result["unit"]["started_at"] - (time.time() - started_ago)) < 2
    # what is read alongside carries the times for the caller to judge, not a verdict
    assert "stale" not in result["also"]["units"]["guard.service"]
    assert result["also"]["units"]["guard.service"]["started_at"] == pytest.approx(result["unit"]["started_at"], abs=0.1)
    assert result["also"]["files"][0]["mtime"] == result["files"][0]["mtime"]
