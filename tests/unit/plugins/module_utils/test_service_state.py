# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The read that lets a re-run skip a service's install: systemctl's answer parsed, files compared byte for byte."""
from __future__ import annotations

import hashlib
import re

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._service_state import (
    ServiceFilesError, by_name, check_names, differences, file_state, parse_show, stale_files, unit_state)

# systemctl show --property=LoadState --property=ActiveState --property=UnitFileState, as systemd 252 prints it
RUNNING = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
DISABLED_FAILED = "LoadState=loaded\nActiveState=failed\nUnitFileState=disabled\n"
UNKNOWN = "LoadState=not-found\nActiveState=inactive\nUnitFileState=\n"
UNIT = "dgxspark-cache-flush-follow.service"


def test_parse_show_reads_key_value_lines_only() -> None:
    assert parse_show("LoadState=loaded\nnoise\nX=a=b\n") == {"LoadState": "loaded", "X": "a=b"}


def test_a_running_enabled_unit_with_planned_files_is_current() -> None:
    unit = unit_state(UNIT, parse_show(RUNNING))
    files = [file_state("/etc/a.json", b'{"a": 1}\n', '{"a": 1}\n', False)]
    assert unit["running"] and unit["enabled"] and unit["loaded"]
    assert files[0]["matches"] is True
    assert files[0]["sha256"] == hashlib.sha256(b'{"a": 1}\n').hexdigest()
    assert differences(unit, files) == []


@pytest.mark.parametrize("data, wanted, phrase", [
    (None, "x\n", "/etc/a.json is missing"),
    (b"x", "x\n", "/etc/a.json differs from the planned content"),     # one newline less is a difference
    (b"x\n ", "x\n", "/etc/a.json differs from the planned content"),
])
def test_a_missing_or_changed_file_is_named(data: bytes | None, wanted: str, phrase: str) -> None:
    unit = unit_state(UNIT, parse_show(RUNNING))
    assert differences(unit, [file_state("/etc/a.json", data, wanted, False)]) == [phrase]


def test_a_stopped_disabled_unit_gives_both_reasons() -> None:
    found = differences(unit_state(UNIT, parse_show(DISABLED_FAILED)), [])
    assert found == [f"the unit {UNIT} is failed, not active", f"the unit {UNIT} is disabled at boot, not enabled"]


def test_a_unit_systemd_does_not_know_is_not_installed() -> None:
    assert differences(unit_state(UNIT, parse_show(UNKNOWN)), []) == [f"the unit {UNIT} is not installed (not-found)"]


def test_files_without_planned_content_are_read_not_judged() -> None:
    key = file_state("/etc/ssh/ssh_host_ed25519_key.pub", b"ssh-ed25519 AAAA root@w\n", None, True)
    absent = file_state("/etc/dgxspark/guard.json", None, None, True)
    assert key["content"] == "ssh-ed25519 AAAA root@w\n" and key["matches"] is None
    assert absent == {"path": "/etc/dgxspark/guard.json", "exists": False, "sha256": None, "mtime": None,
                      "matches": None, "content": None}
    assert differences(None, [key, absent]) == []


@pytest.mark.parametrize("show, found", [
    # a stopped unit, failed or inactive, disabled at boot, is what a stopped, disabled plan wants
    (DISABLED_FAILED, []),
    ("LoadState=loaded\nActiveState=inactive\nUnitFileState=disabled\n", []),
    (RUNNING, [f"the unit {UNIT} is active, not stopped", f"the unit {UNIT} is enabled at boot, not disabled"]),
    ("LoadState=loaded\nActiveState=activating\nUnitFileState=disabled\n", [f"the unit {UNIT} is activating, not stopped"]),
])
def test_a_unit_planned_stopped_and_disabled(show: str, found: list[str]) -> None:
    assert differences(unit_state(UNIT, parse_show(show)), [], running=False, enabled=False) == found


def test_a_unit_planned_running_but_not_enabled_at_boot() -> None:
    running_disabled = unit_state(UNIT, parse_show("LoadState=loaded\nActiveState=active\nUnitFileState=disabled\n"))
    assert differences(running_disabled, [], running=True, enabled=False) == []
    assert differences(unit_state(UNIT, parse_show(RUNNING)), [], running=True, enabled=False) == [
        f"the unit {UNIT} is enabled at boot, not disabled"]
    # not installed is a difference whatever the plan
    assert differences(unit_state(UNIT, parse_show(UNKNOWN)), [], running=False, enabled=False) == [
        f"the unit {UNIT} is not installed (not-found)"]


@pytest.mark.parametrize("show", [RUNNING, DISABLED_FAILED, "LoadState=loaded\nActiveState=inactive\nUnitFileState=enabled\n"])
def test_a_unit_whose_state_is_not_planned_is_judged_by_its_files_and_install_only(show: str) -> None:
    # running/enabled None: an install that leaves the unit running or stopped as it finds it (cache_flush's follow
    # entry point, state installed)
    unit = unit_state(UNIT, parse_show(show))
    assert differences(unit, [], running=None, enabled=None) == []
    assert differences(unit, [file_state("/etc/a.json", b"x", "y", False)], running=None, enabled=None) == [
        "/etc/a.json differs from the planned content"]
    assert differences(unit_state(UNIT, parse_show(UNKNOWN)), [], running=None, enabled=None) == [
        f"the unit {UNIT} is not installed (not-found)"]


def test_files_given_a_name_are_found_by_it_and_the_others_only_in_the_list() -> None:
    files = [{"path": "/a", "name": "program"}, {"path": "/b"}, {"path": "/c", "name": "unit"}]
    states = [file_state(item["path"], b"x", None, False) for item in files]
    check_names(files, "files")
    found = by_name(files, states)
    assert list(found) == ["program", "unit"]
    assert found["program"] == states[0] and found["unit"] == states[2]
    assert by_name([{"path": "/a", "name": None}], states[:1]) == {}


@pytest.mark.parametrize(("part", "exists", "matches"), [
    (b"lib", True, True),          # every part as planned: the whole matches
    (b"old lib", True, False),     # a part differs: the whole does not match, although its own file does
    (None, False, False),          # a part is missing: the whole neither exists nor matches
])
def test_parts_fold_into_the_file_they_are_part_of(part, exists, matches) -> None:
    files = [{"path": "/p/prog.py", "name": "program", "content": "prog"},
             {"path": "/p/lib/_a.py", "part_of": "program", "content": "lib"},
             {"path": "/etc/x.json", "name": "config", "content": "{}"}]
    data = [b"prog", part, b"{}"]
    states = [file_state(item["path"], got, item["content"], False) for item, got in zip(files, data)]
    check_names(files, "files")
    found = by_name(files, states)
    assert found["program"]["exists"] is exists and found["program"]["matches"] is matches
    assert found["program"]["path"] == "/p/prog.py" and found["program"]["parts"] == [states[1]]
    assert found["config"] == states[2] and "parts" not in found["config"]
    assert states[0]["matches"] is True   # the list keeps each file's own state


@pytest.mark.parametrize(("files", "message"), [
    ([{"path": "/a", "name": "p"}, {"path": "/b", "part_of": "q"}], "files: /b is part_of 'q', which no file is named"),
    ([{"path": "/a", "name": "p"}, {"path": "/b", "name": "b", "part_of": "p"}],
     "files: /b has both a name and part_of: give it one of them"),
])
def test_a_part_of_nothing_or_of_itself_is_refused(files: list, message: str) -> None:
    with pytest.raises(ServiceFilesError, match=re.escape(message)):
        check_names(files, "files")


@pytest.mark.parametrize(("files", "message"), [
    ([{"path": "/a", "name": "key"}, {"path": "/b", "name": "key"}, {"path": "/c", "name": "key"}],
     "also.files: the name 'key' is given to 3 files (/a, /b, /c): give each its own"),
    ([{"path": "/a", "name": " "}], "also.files: the name of /a is empty"),
    ([{"path": "/a", "name": ""}, {"path": "/b", "name": "x"}, {"path": "/c", "name": "x"}],
     "the name of /a is empty: give it a name or leave name out; also.files: the name 'x' is given to 2 files"),
])
def test_a_name_given_twice_or_empty_is_refused_with_every_problem(files: list, message: str) -> None:
    with pytest.raises(ServiceFilesError, match=re.escape(message)):
        check_names(files, "also.files")


@pytest.mark.parametrize("show, installed, at_rest", [
    (RUNNING, True, False),
    (DISABLED_FAILED, True, True),
    ("LoadState=loaded\nActiveState=inactive\nUnitFileState=enabled\n", True, False),     # it would start at boot
    ("LoadState=loaded\nActiveState=activating\nUnitFileState=disabled\n", True, False),  # a restart loop's wait
    ("LoadState=bad-setting\nActiveState=active\nUnitFileState=enabled\n", True, False),
    (UNKNOWN, False, True),
])
def test_a_unit_is_installed_unless_systemd_finds_no_file_and_at_rest_when_stopped_and_not_enabled(
        show: str, installed: bool, at_rest: bool) -> None:
    unit = unit_state(UNIT, parse_show(show))
    assert (unit["installed"], unit["at_rest"]) == (installed, at_rest)


ACTIVE_SINCE = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\nExecMainStartTimestampMonotonic=500000000\n"
# the node's clocks read together: wall 10000 s at monotonic 1000 s, so the process (monotonic 500 s) started at 9500
CLOCK = (10000.0, 1000.0)


@pytest.mark.parametrize(("show", "clock", "started"), [
    (ACTIVE_SINCE, CLOCK, 9500.0),
    (ACTIVE_SINCE, None, None),   # no clock given: not known
    (ACTIVE_SINCE.replace("=500000000", "=0"), CLOCK, None),   # never started since boot
    (ACTIVE_SINCE.replace("=500000000", "="), CLOCK, None),   # systemd gave no value
    (ACTIVE_SINCE.replace("ActiveState=active", "ActiveState=inactive"), CLOCK, None),   # not running
])
def test_a_running_units_start_is_read_on_the_wall_clock(show: str, clock, started) -> None:
    assert unit_state("x.service", parse_show(show), clock)["started_at"] == started


def _file(path: str, mtime: float | None, wanted: str | None = "planned", data: bytes | None = b"planned") -> dict:
    return file_state(path, data, wanted, False, mtime)


@pytest.mark.parametrize(("mtimes", "stale"), [
    ((9400.0, 9499.9), []),                       # both written before the process started
    ((9400.0, 9500.5), ["/b"]),                   # /b written after: the process never loaded it
    ((9600.0, 9700.0), ["/a", "/b"]),
    ((None, 9700.0), ["/b"]),                     # a file without a known mtime is not judged
])
def test_files_written_after_the_running_process_started_are_stale(mtimes, stale) -> None:
    unit = unit_state("x.service", parse_show(ACTIVE_SINCE), CLOCK)
    files = [_file("/a", mtimes[0]), _file("/b", mtimes[1])]
    assert stale_files(unit, files) == stale
    found = differences(unit, files)
    assert (found == []) == (stale == [])
    if stale:
        assert found == [f"the unit x.service runs a process started before {', '.join(stale)} changed: it needs a "
                         "restart to run what is installed"]


@pytest.mark.parametrize("show", [
    ACTIVE_SINCE.replace("ActiveState=active", "ActiveState=inactive"),   # stopped: its next start loads the files
    ACTIVE_SINCE.replace("=500000000", "=0"),                             # start unknown
])
def test_a_unit_that_does_not_run_or_whose_start_is_unknown_is_never_stale(show: str) -> None:
    unit = unit_state("x.service", parse_show(show), CLOCK)
    assert stale_files(unit, [_file("/a", 99999.0)]) == []
    assert stale_files(None, [_file("/a", 99999.0)]) == []


def test_staleness_counts_with_the_state_not_compared_and_only_for_files_that_hold_the_plan() -> None:
    unit = unit_state("x.service", parse_show(ACTIVE_SINCE), CLOCK)
    newer_same = _file("/same", 9600.0)
    newer_other = _file("/other", 9600.0, wanted="planned", data=b"changed")   # named as differing, not as stale
    read_only = _file("/read", 9600.0, wanted=None)                             # not compared: never judged
    found = differences(unit, [newer_same, newer_other, read_only], None, None)
    assert found == ["/other differs from the planned content",
                     "the unit x.service runs a process started before /same changed: it needs a restart to run what "
                     "is installed"]


def test_an_absent_file_has_no_mtime() -> None:
    assert file_state("/gone", None, None, False, 123.0)["mtime"] is None
    assert file_state("/here", b"x", None, False, 123.0)["mtime"] == 123.0
