# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for roles/cache_flush: the node-side flush/watchdog program and the role's entry points.

The program is a standalone script (roles/cache_flush/files), imported by path. Every role's argument specs are
checked against its defaults in test_argument_specs.py.
"""
from __future__ import annotations

import calendar
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jinja2
from helpers.fixtures import log_names, read_log
from helpers.programs import load_program
import pytest
import yaml

from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import line_phase, normalise

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"
ROLE = ROLES / "cache_flush"
SCRIPT = ROLE / "files" / "dgxspark_cache_flush.py"
FIXTURES = ROOT / "tests" / "fixtures" / "meminfo"
KIB = 1024
GIB = 1024 ** 3


prog = load_program(SCRIPT, "dgxspark_cache_flush")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="ascii")


def meminfo(**kib: int) -> dict:
    """A parsed-meminfo dict from KiB values, with harmless defaults for the required fields."""
    values = {"MemTotal": 124779968, "MemAvailable": 60 * 1024 * 1024, "Buffers": 0, "Cached": 0, "Shmem": 0}
    values.update(kib)
    return {key: value * KIB for key, value in values.items()}


# ---------------------------------------------------------------- parse_meminfo

def test_parse_gb10_sample_in_bytes():
    info = prog.parse_meminfo(fixture_text("gb10_load_high_cache.txt"))
    assert info["MemTotal"] == 124779968 * KIB
    assert 118 * GIB < info["MemTotal"] < 120 * GIB
    assert info["MemAvailable"] == 63268864 * KIB
    assert info["Cached"] == 60817408 * KIB
    assert info["Buffers"] == 187392 * KIB
    assert info["Shmem"] == 1342176 * KIB
    assert info["Active(file)"] == 21233664 * KIB
    # Unit-less lines are counts, not bytes.
    assert info["HugePages_Total"] == 0
    assert info["Hugepagesize"] == 2048 * KIB
    assert len(info) == 55


@pytest.mark.parametrize(("name", "expect_flush", "expect_low"), [
    ("gb10_load_high_cache.txt", True, False),
    ("gb10_serving_below_threshold.txt", False, False),
    ("gb10_low_mem_available.txt", False, True),
])
def test_recorded_samples_with_default_limits(name, expect_flush, expect_low):
    decision = prog.decide(prog.parse_meminfo(fixture_text(name)), 40000000000, 8 * GIB)
    assert (decision.flush, decision.low_memory) == (expect_flush, expect_low)
    assert len(decision.reasons) == int(expect_flush) + int(expect_low)


def test_load_sample_page_cache_excludes_shmem():
    info = prog.parse_meminfo(fixture_text("gb10_load_high_cache.txt"))
    assert prog.page_cache_bytes(info) == (187392 + 60817408 - 1342176) * KIB


@pytest.mark.parametrize(("name", "message"), [
    ("truncated_malformed.txt", r"line 6: expected 'Field: value \[kB\]'"),
    ("old_kernel_no_memavailable.txt", r"lacks required field\(s\): MemAvailable$"),
])
def test_unusable_samples_raise(name, message):
    with pytest.raises(prog.MeminfoError, match=message):
        prog.parse_meminfo(fixture_text(name))


GOOD_HEAD = "MemTotal: 1000 kB\nMemAvailable: 500 kB\nBuffers: 10 kB\nCached: 20 kB\n"


@pytest.mark.parametrize(("text", "message"), [
    ("", r"lacks required field\(s\): MemTotal, MemAvailable, Buffers, Cached"),
    (GOOD_HEAD + "Shmem: lots kB\n", r"line 5: Shmem has a non-numeric value 'lots'"),
    (GOOD_HEAD + "Shmem: -5 kB\n", r"line 5: Shmem has a non-numeric value '-5'"),
    (GOOD_HEAD + "Shmem: 5 MB\n", r"line 5: Shmem has unknown unit 'MB'"),
    (GOOD_HEAD + "Shmem: 5 kB extra\n", r"line 5: expected"),
    (GOOD_HEAD + "Shmem:\n", r"line 5: expected"),
    (GOOD_HEAD + "Cached: 20 kB\n", r"line 5: field Cached appears twice"),
    (GOOD_HEAD + "Mem Free: 5 kB\n", r"line 5: expected"),
    ("MemTotal: 1000 kB\nBuffers: 10 kB\n", r"lacks required field\(s\): MemAvailable, Cached$"),
])
def test_parse_rejects(text, message):
    with pytest.raises(prog.MeminfoError, match=message):
        prog.parse_meminfo(text)


def test_parse_ignores_blank_lines_and_keeps_counts_unscaled():
    info = prog.parse_meminfo("\n" + GOOD_HEAD + "HugePages_Total:      12\n\n")
    assert info == {"MemTotal": 1000 * KIB, "MemAvailable": 500 * KIB, "Buffers": 10 * KIB, "Cached": 20 * KIB,
                    "HugePages_Total": 12}


# ---------------------------------------------------------------- decide

THRESHOLD = 40000000000
FLOOR = 8 * GIB


@pytest.mark.parametrize(("info", "flush", "low"), [
    pytest.param(meminfo(Cached=10 * 1024 * 1024), False, False, id="below-threshold"),
    pytest.param(meminfo(Cached=50 * 1024 * 1024), True, False, id="above-threshold"),
    pytest.param(meminfo(MemAvailable=7 * 1024 * 1024), False, True, id="floor-crossed"),
    pytest.param(meminfo(Cached=50 * 1024 * 1024, MemAvailable=7 * 1024 * 1024), True, True, id="both"),
    pytest.param(meminfo(Cached=30 * 1024 * 1024, Buffers=10 * 1024 * 1024), True, False, id="buffers-count"),
    pytest.param(meminfo(Cached=50 * 1024 * 1024, Shmem=20 * 1024 * 1024), False, False, id="shmem-not-droppable"),
    pytest.param(meminfo(Cached=1, Shmem=5), False, False, id="shmem-over-cached-clamps"),
])
def test_decide(info, flush, low):
    decision = prog.decide(info, THRESHOLD, FLOOR)
    assert decision.flush is flush
    assert decision.low_memory is low
    assert decision.mem_available == info["MemAvailable"]
    reasons = " | ".join(decision.reasons)
    assert ("exceeds the threshold" in reasons) is flush
    assert ("below the floor" in reasons) is low


def test_decide_boundaries_are_strict():
    exactly = {"MemTotal": 10 * THRESHOLD, "MemAvailable": FLOOR, "Buffers": 0, "Cached": THRESHOLD}
    at_limits = prog.decide(exactly, THRESHOLD, FLOOR)
    assert (at_limits.flush, at_limits.low_memory, at_limits.reasons) == (False, False, ())
    beyond = prog.decide(dict(exactly, Cached=THRESHOLD + 1, MemAvailable=FLOOR - 1), THRESHOLD, FLOOR)
    assert (beyond.flush, beyond.low_memory) == (True, True)
    assert beyond.page_cache == THRESHOLD + 1


@pytest.mark.parametrize(("threshold", "floor"), [(0, FLOOR), (THRESHOLD, 0), (-1, FLOOR)])
def test_decide_rejects_non_positive_limits(threshold, floor):
    with pytest.raises(ValueError, match="must be > 0"):
        prog.decide(meminfo(), threshold, floor)


# ---------------------------------------------------------------- watchdog_step

def test_watchdog_acts_on_entry_reminds_and_recovers():
    state = prog.WatchdogState()
    events = []
    for now, low in [(0, False), (5, True), (10, True), (64, True), (65, True), (70, True), (125, True), (130, False), (135, False), (140, True)]:
        state, event = prog.watchdog_step(state, low, now)
        events.append(event)
    assert events == ["", "enter", "", "", "remind", "", "remind", "recover", "", "enter"]


# ---------------------------------------------------------------- configuration

def test_validate_config_defaults_and_int_strings():
    config = prog.validate_config({"threshold_bytes": "123", "interval_seconds": 3600})
    assert config.threshold_bytes == 123
    assert config.interval_seconds == 3600
    assert config.floor_bytes == 8 * GIB
    assert config.action == "log"
    assert config.container_name == "vllm_glm53"


@pytest.mark.parametrize(("values", "message"), [
    ({"threshold_bytes": 0}, "threshold_bytes must be > 0"),
    ({"floor_bytes": -1}, "floor_bytes must be > 0"),
    ({"interval_seconds": 0}, r"interval_seconds must be within 1\.\.3600, got 0"),
    ({"interval_seconds": 3601}, r"interval_seconds must be within 1\.\.3600, got 3601"),
    ({"interval_seconds": True}, "interval_seconds must be an integer"),
    ({"threshold_bytes": "40GB"}, "threshold_bytes must be an integer"),
    ({"action": "reboot"}, "action must be one of log, stop_container"),
    ({"action": "stop_container", "container_name": " "}, "container_name must not be empty"),
    ({"container_name": 5}, "container_name must be a string"),
    ({"treshold_bytes": 5}, "unknown setting 'treshold_bytes'"),
    ({"follow_seconds": 0}, "follow_seconds must be > 0, got 0"),
    ({"follow_seconds": -60}, "follow_seconds must be > 0, got -60"),
    ({"follow_seconds": "1h"}, "follow_seconds must be an integer, got '1h'"),
    ({"follow_container": 5}, "follow_container must be a string"),
    ({"follow_until_loaded": "yes"}, "follow_until_loaded must be true or false, got 'yes'"),
    ({"follow_until_loaded": 1}, "follow_until_loaded must be true or false, got 1"),
])
def test_validate_config_rejects(values, message):
    with pytest.raises(prog.ConfigError, match=message):
        prog.validate_config(values)


def test_validate_config_follow_mode():
    config = prog.validate_config({"follow_container": "vllm_glm53", "follow_seconds": "600"})
    assert (config.follow_container, config.follow_seconds) == ("vllm_glm53", 600)
    assert (prog.Config().follow_container, prog.Config().follow_seconds) == ("", 3600)
    assert prog.Config().follow_until_loaded is True
    assert prog.validate_config({"follow_until_loaded": False}).follow_until_loaded is False


def test_follow_flags(tmp_path, capsys):
    assert prog.main(["--follow-container", "vllm_x", "--follow-seconds", "90", "--check-config"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["follow_container"], shown["follow_seconds"]) == ("vllm_x", 90)
    assert prog.main(["--follow-container", "vllm_x", "--follow-seconds", "0", "--check-config"]) == 2
    assert "follow_seconds must be > 0, got 0" in capsys.readouterr().out
    assert prog.main(["--follow-container", "vllm_x", "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["follow_until_loaded"] is True
    assert prog.main(["--follow-container", "vllm_x", "--follow-whole-window", "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["follow_until_loaded"] is False


def _render_role_config(overrides=None) -> str:
    """The role's JSON template as ansible.builtin.template renders it (trim_blocks on, trailing newline kept)."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    defaults.update(overrides or {})
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("yes", "on", "1", "true")
    return env.from_string((ROLE / "templates" / "cache-flush.json.j2").read_text(encoding="utf-8")).render(**defaults)


def _config_as_written(config: dict) -> str:
    """A configuration as the role has always written it: sorted keys, two-space indent, ASCII, a final newline."""
    return json.dumps(config, indent=2, sort_keys=True, separators=(",", ": ")) + "\n"


ROLE_CONFIG = {
    "_comment": "Managed by Ansible (role dgxspark.vllm.cache_flush): local changes are overwritten. "
                "Bytes are plain integers.",
    "action": "log", "container_name": "vllm_glm53", "docker_bin": "/usr/bin/docker",
    "drop_caches_path": "/proc/sys/vm/drop_caches", "floor_bytes": 8589934592, "interval_seconds": 5,
    "meminfo_path": "/proc/meminfo", "threshold_bytes": 40000000000,
}


@pytest.mark.parametrize(("overrides", "changed"), [
    ({}, {}),
    ({"__cache_flush_follow": False}, {}),
    ({"__cache_flush_follow": True}, {"follow_container": "vllm_glm53", "follow_seconds": 3600, "follow_until_loaded": True}),
    ({"__cache_flush_follow": True, "cache_flush_follow_seconds": 1800.0, "cache_flush_interval_seconds": "7",
      "cache_flush_threshold_bytes": 4.0e10, "cache_flush_container_name": 'vllm "\u00fc" \\ x',
      "cache_flush_watchdog_action": "stop_container", "cache_flush_follow_until_loaded": "no"},
     {"follow_container": 'vllm "\u00fc" \\ x', "follow_seconds": 1800, "follow_until_loaded": False, "interval_seconds": 7,
      "container_name": 'vllm "\u00fc" \\ x', "action": "stop_container"}),
])
def test_role_config_template_writes_the_same_file(overrides, changed):
    """Byte for byte the file of the former to_nice_json template: same keys, values and types, no needless change."""
    assert _render_role_config(overrides) == _config_as_written({**ROLE_CONFIG, **changed})


def test_role_config_template_is_what_the_program_reads(tmp_path):
    """The role's JSON template and the program agree on every key (a renamed key fails here)."""
    path = tmp_path / "cache-flush.json"
    path.write_text(_render_role_config({"cache_flush_watchdog_action": "stop_container", "cache_flush_interval_seconds": 7}))
    config = prog.validate_config(prog.load_config_file(str(path)))
    assert config == prog.Config(threshold_bytes=40000000000, floor_bytes=8589934592, interval_seconds=7,
                                 action="stop_container", container_name="vllm_glm53", meminfo_path="/proc/meminfo",
                                 drop_caches_path="/proc/sys/vm/drop_caches", docker_bin="/usr/bin/docker")


def test_role_follow_config_template_turns_follow_mode_on(tmp_path):
    """The follow entry point renders the same template with follow_container/follow_seconds added."""
    path = tmp_path / "cache-flush-follow.json"
    path.write_text(_render_role_config({"__cache_flush_follow": True, "cache_flush_follow_seconds": 1800}))
    config = prog.validate_config(prog.load_config_file(str(path)))
    assert (config.follow_container, config.follow_seconds) == ("vllm_glm53", 1800)
    assert "follow_container=vllm_glm53 follow_seconds=1800 follow_until_loaded=true" in prog.describe(config)
    assert "follow_container" not in prog.describe(prog.Config())


def test_check_config_flags_override_file(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"_comment": "x", "threshold_bytes": 5, "interval_seconds": 9}))
    assert prog.main(["--config", str(path), "--interval-seconds", "2", "--check-config"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["threshold_bytes"], shown["interval_seconds"], shown["action"]) == (5, 2, "log")


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"interval_seconds": 0}', "interval_seconds must be within"),
])
def test_bad_config_file_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "c.json"
    path.write_text(content)
    assert prog.main(["--config", str(path), "--check-config"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("<3>configuration error:")
    assert message in out


# ---------------------------------------------------------------- --once runs against temp files

@pytest.fixture(name="rig")
def rig_fixture(tmp_path, monkeypatch):
    """Temp meminfo + drop_caches files, a recording fake `sync`, and a fake docker on PATH."""
    rig = {"dir": tmp_path, "meminfo": tmp_path / "meminfo", "drop": tmp_path / "drop_caches",
           "docker_log": tmp_path / "docker.log", "syncs": []}
    rig["drop"].write_text("")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"
    docker.write_text('#!/bin/sh\necho "$@" >> "%s"\nexit "${FAKE_DOCKER_RC:-0}"\n' % rig["docker_log"])
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setattr(prog.os, "sync", lambda: rig["syncs"].append(rig["drop"].read_text()))
    return rig


def run_once(rig, sample, *extra):
    rig["meminfo"].write_text(fixture_text(sample))
    return prog.main(["--once", "--meminfo-path", str(rig["meminfo"]), "--drop-caches-path", str(rig["drop"]), *extra])


def test_once_above_threshold_syncs_then_writes_3(rig, capsys):
    assert run_once(rig, "gb10_load_high_cache.txt") == 0
    assert rig["drop"].read_text() == "3\n"
    assert rig["syncs"] == [""]  # synced once, before drop_caches was written
    out = capsys.readouterr().out
    assert out.startswith("<6>dgxspark-cache-flush starting")
    assert "threshold_bytes=40000000000" in out
    assert "<5>flushed page cache" in out
    assert "before=%d" % ((187392 + 60817408 - 1342176) * KIB) in out
    assert not rig["docker_log"].exists()


@pytest.mark.parametrize("sample", ["gb10_serving_below_threshold.txt", "gb10_low_mem_available.txt"])
def test_once_below_threshold_leaves_drop_caches_alone(rig, capsys, sample):
    assert run_once(rig, sample) == 0
    assert rig["drop"].read_text() == ""
    assert rig["syncs"] == []
    assert "flushed" not in capsys.readouterr().out


def test_once_lower_threshold_flushes_serving_sample(rig):
    assert run_once(rig, "gb10_serving_below_threshold.txt", "--threshold-bytes", str(5 * GIB)) == 0
    assert rig["drop"].read_text() == "3\n"


def test_once_low_memory_with_log_action_stops_nothing(rig, capsys):
    assert run_once(rig, "gb10_low_mem_available.txt") == 0
    assert not rig["docker_log"].exists()
    out = capsys.readouterr().out
    assert "<3>LOW MEMORY: MemAvailable %d B" % (5347328 * KIB) in out
    assert "action log: nothing stopped" in out


def test_once_low_memory_stop_container_calls_docker(rig, capsys):
    assert run_once(rig, "gb10_low_mem_available.txt", "--action", "stop_container", "--container-name", "vllm_test") == 0
    assert rig["docker_log"].read_text() == "stop --time 10 vllm_test\n"
    assert "docker stop vllm_test succeeded" in capsys.readouterr().out


def test_once_stop_container_not_called_above_floor(rig):
    assert run_once(rig, "gb10_load_high_cache.txt", "--action", "stop_container") == 0
    assert not rig["docker_log"].exists()


def test_once_failed_docker_stop_is_loud_and_fails(rig, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_RC", "1")
    assert run_once(rig, "gb10_low_mem_available.txt", "--action", "stop_container") == 1
    assert rig["docker_log"].read_text() == "stop --time 10 vllm_glm53\n"
    assert "<3>LOW MEMORY" in capsys.readouterr().out


def test_once_malformed_meminfo_refuses_to_start(rig, capsys):
    assert run_once(rig, "truncated_malformed.txt") == 2
    assert rig["drop"].read_text() == ""
    assert "<3>configuration error: cannot use" in capsys.readouterr().out


def test_unwritable_drop_caches_refuses_to_start(rig, capsys):
    rig["meminfo"].write_text(fixture_text("gb10_load_high_cache.txt"))
    missing_dir = rig["dir"] / "no-such-dir" / "drop_caches"
    assert prog.main(["--once", "--meminfo-path", str(rig["meminfo"]), "--drop-caches-path", str(missing_dir)]) == 2
    assert "is not writable" in capsys.readouterr().out


def test_flush_write_failure_keeps_watchdog_and_fails(rig, capsys, monkeypatch):
    rig["meminfo"].write_text(fixture_text("gb10_load_high_cache.txt"))
    config = prog.Config(meminfo_path=str(rig["meminfo"]), drop_caches_path=str(rig["dir"]), floor_bytes=100 * GIB)
    state, ok = prog.run_iteration(config, prog.WatchdogState(), 0.0)  # drop_caches_path is a directory
    assert ok is False
    assert state.low is True
    out = capsys.readouterr().out
    assert "<3>page cache flush FAILED" in out
    assert "<3>LOW MEMORY" in out


# ---------------------------------------------------------------- follow mode

STARTED = calendar.timegm((2026, 12, 2, 3, 18, 45, 0, 0, 0))      # 2026-12-02T03:18:45Z


@pytest.mark.parametrize(("text", "expect"), [
    ("2026-12-02T03:18:45Z", STARTED),
    ("2026-12-02T03:18:45.123456789Z", STARTED + 0.123456789),
    ("2026-12-02T03:18:45.5Z\n", STARTED + 0.5),                       # Docker trims trailing zeros
    ("2026-12-02T03:18:45.000000001Z", STARTED + 1e-9),
    ("2026-12-02T05:18:45.25+02:00", STARTED + 0.25),
    ("2026-12-02T05:18:45+02:00", STARTED),
    ("2026-12-01T22:48:45.75-04:30", STARTED + 0.75),
    ("2026-12-02T03:18:45.5", STARTED + 0.5),                          # no zone: UTC
    ("2026-12-02T03:18:45+00:00", STARTED),
])
def test_parse_docker_time(text, expect):
    assert prog.parse_docker_time(text) == pytest.approx(expect, abs=1e-9)


@pytest.mark.parametrize("text", ["", "  ", "0001-01-01T00:00:00Z", "yesterday", "2026-13-02T03:18:45Z",
                                  "2026-12-02T03:18:45.5+xx:00", "2026-12-02 03:18:45Z"])
def test_parse_docker_time_unusable(text):
    assert prog.parse_docker_time(text) is None


@pytest.mark.parametrize(("text", "now", "expect"), [
    ("true 2026-12-02T03:18:45.5Z\n", STARTED + 100.5, (True, "started 100 s ago at 2026-12-02T03:18:45.5Z (load window 3600 s)")),
    ("true 2026-12-02T03:18:45Z", STARTED, (True, "started 0 s ago at 2026-12-02T03:18:45Z (load window 3600 s)")),
    ("true 2026-12-02T03:18:45Z", STARTED + 3599.9, (True, "started 3600 s ago at 2026-12-02T03:18:45Z (load window 3600 s)")),
    ("true 2026-12-02T03:18:45Z", STARTED + 3600, (False, "serving since 2026-12-02T03:18:45Z for 3600 s (past the load window of 3600 s)")),
    ("true 2026-12-02T03:18:45Z", STARTED + 86400, (False, "serving since 2026-12-02T03:18:45Z for 86400 s (past the load window of 3600 s)")),
    ("false 2026-12-02T03:18:45Z", STARTED + 10, (False, "not running")),
    ("false 0001-01-01T00:00:00Z", STARTED + 10, (False, "not running")),
    ("", STARTED, (False, "not running")),                                  # docker inspect failed
    ("true", STARTED, (False, "not running")),
    ("true 0001-01-01T00:00:00Z", STARTED, (False, "unreadable start time '0001-01-01T00:00:00Z'")),
    ("true soon", STARTED, (False, "unreadable start time 'soon'")),
])
def test_in_load_window(text, now, expect):
    assert prog.in_load_window(text, now, 3600) == expect


LOAD_END_PHASES = ("kv_allocated", "api_up")


@pytest.mark.parametrize("name", sorted(log_names()))
def test_load_end_lines_are_the_log_readers(name):
    """On every recorded log, a line ends the follow mode's load exactly where the collection's log reader sees the
    KV cache allocated or the API up (the phases that end the launch's load watch)."""
    raw_lines = read_log(name).splitlines()
    ours = [i for i, raw in enumerate(raw_lines) if prog.load_end_line(raw) is not None]
    theirs = [line.index for line in normalise("\n".join(raw_lines)) if line_phase(line) in LOAD_END_PHASES]
    assert ours == theirs


def test_some_recorded_logs_end_a_load():
    """The comparison above is not between two empty lists: most recorded starts reach their KV cache."""
    ended = [name for name in log_names() if prog.load_end_line(read_log(name)) is not None]
    assert len(ended) >= 10


@pytest.mark.parametrize(("text", "expect"), [
    ("(EngineCore pid=7) INFO 12-02 03:20:01 [gpu_worker.py:1] Available KV cache memory: 12.5 GiB\n",
     "(EngineCore pid=7) INFO 12-02 03:20:01 [gpu_worker.py:1] Available KV cache memory: 12.5 GiB"),
    ("loading\r(APIServer pid=1) INFO:     Application startup complete.\r\n",   # after a progress bar's \r
     "(APIServer pid=1) INFO:     Application startup complete."),
    ("INFO Loading weights took 12.3 seconds\nINFO Model loading took 40 GiB\n", None),
    ("", None),
])
def test_load_end_line(text, expect):
    assert prog.load_end_line(text) == expect


class _Log:
    """A container log read by `since`: each call returns what was written at or after it (None: unreadable)."""

    def __init__(self, lines=(), readable=True):
        self.lines = list(lines)      # (time, text)
        self.readable = readable
        self.asked = []

    def __call__(self, since):
        self.asked.append(since)
        if not self.readable:
            return None
        return "".join(text + "\n" for at, text in self.lines if at >= since)


def test_load_end_reads_each_start_from_its_beginning_then_only_what_is_new():
    log = _Log([(STARTED + 5, "INFO Loading weights took 3 s")])
    load = prog.LoadEnd(log)
    start = "true 2026-12-02T03:18:45Z"
    assert load.ended(start, STARTED + 10) is None
    log.lines.append((STARTED + 12, "INFO Available KV cache memory: 3 GiB"))
    assert load.ended(start, STARTED + 20) == "INFO Available KV cache memory: 3 GiB"
    assert log.asked == [STARTED - 1, STARTED + 9]      # from the start, then from a second before the last read
    assert load.ended(start, STARTED + 30) == "INFO Available KV cache memory: 3 GiB"
    assert len(log.asked) == 2                            # an ended load's log is not read again
    restarted = "true 2026-12-02T03:28:45Z"
    assert load.ended(restarted, STARTED + 610) is None   # a new start loads again: its log is read from its start
    assert log.asked[2] == STARTED + 599


def test_load_end_with_an_unreadable_log_keeps_loading():
    load = prog.LoadEnd(_Log([(STARTED + 5, "INFO Available KV cache memory: 3 GiB")], readable=False))
    assert load.ended("true 2026-12-02T03:18:45Z", STARTED + 10) is None
    assert load.unreadable


def test_follow_log_runs_docker_logs_since(tmp_path):
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\necho "args: $*"\necho "from stderr" >&2\n[ "$4" = vllm_x ]\n')
    docker.chmod(0o755)
    config = prog.Config(docker_bin=str(docker), follow_container="vllm_x")
    assert prog.follow_log(config, 1764645525.25) == "args: logs --since 1764645525.250 vllm_x\nfrom stderr\n"
    assert prog.follow_log(prog.Config(docker_bin=str(docker), follow_container="other"), 0) is None
    assert prog.follow_log(prog.Config(docker_bin=str(tmp_path / "absent"), follow_container="vllm_x"), 0) is None


class _StopAfter(threading.Event):
    """A stop event that sets itself after `count` waits (the loop's ticks), without sleeping."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.timeouts: list = []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        self.count -= 1
        if self.count <= 0:
            self.set()
        return self.is_set()


def test_serve_in_follow_mode_acts_only_inside_the_load_window(monkeypatch, capsys):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    now = time.time()
    inside = "true %s" % time.strftime("%Y-%m-%dT%H:%M:%S.5Z", time.gmtime(now - 100))
    past = "true %s" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 4000))
    answers = ["", inside, inside, past, past, inside]
    asked, runs = [], []
    monkeypatch.setattr(prog, "follow_state", lambda config: asked.append(config.follow_container) or answers.pop(0))
    monkeypatch.setattr(prog, "follow_log", lambda config, since: "")     # a log that never says the load is over
    monkeypatch.setattr(prog, "run_iteration", lambda config, state, now, verbose=False: runs.append(verbose) or (state, True))
    config = prog.Config(follow_container="vllm_x", follow_seconds=3600)
    assert prog.serve(config, _StopAfter(6)) == prog.EXIT_OK
    assert asked == ["vllm_x"] * 6
    assert runs == [True, False, True]     # verbose again on entering a new window
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "<6>idle until the next start of vllm_x: not running"
    assert lines[1].startswith("<6>following vllm_x: started 10")
    assert lines[1].endswith(" s ago at %s (load window 3600 s)" % inside.split()[1])
    assert lines[2].startswith("<6>idle until the next start of vllm_x: serving since %s for 40" % past.split()[1])
    assert lines[3].startswith("<6>following vllm_x: started ") and inside.split()[1] in lines[3]
    assert len(lines) == 4


def test_serve_in_follow_mode_looks_for_a_new_start_often_while_idle(monkeypatch):
    """Idle, the service looks at the container every FOLLOW_IDLE_POLL_SECONDS (a load shorter than the flush
    interval is still followed); while it follows a load, it ticks at interval_seconds."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    inside = "true %s" % time.strftime("%Y-%m-%dT%H:%M:%S.5Z", time.gmtime(time.time() - 5))
    answers = ["", "", inside]
    monkeypatch.setattr(prog, "follow_state", lambda config: answers.pop(0))
    monkeypatch.setattr(prog, "follow_log", lambda config, since: "")
    monkeypatch.setattr(prog, "run_iteration", lambda config, state, now, verbose=False: (state, True))
    stop = _StopAfter(3)
    assert prog.serve(prog.Config(follow_container="vllm_x", follow_seconds=3600, interval_seconds=30), stop) == 0
    assert stop.timeouts == [prog.FOLLOW_IDLE_POLL_SECONDS, prog.FOLLOW_IDLE_POLL_SECONDS, 30]
    assert prog.FOLLOW_IDLE_POLL_SECONDS <= 2
    stop = _StopAfter(1)
    answers[:] = [""]
    assert prog.serve(prog.Config(follow_container="vllm_x", follow_seconds=3600, interval_seconds=1), stop) == 0
    assert stop.timeouts == [1]     # never longer than the interval


def _docker_time(at: float) -> str:
    """`at` as docker inspect's StartedAt gives it (RFC 3339 with a fraction, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + (".%06dZ" % round((at % 1) * 1e6))


def _serve_following(monkeypatch, answers, read_log, during_flush=lambda: None, **config):
    """serve() in follow mode over docker inspect answers (one a tick) and a container log: the flush runs (each
    calls during_flush)."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setattr(prog, "follow_state", lambda config: answers.pop(0))
    monkeypatch.setattr(prog, "follow_log", lambda config, since: read_log(since))
    runs = []

    def iteration(config, state, now, verbose=False):
        runs.append(verbose)
        during_flush()
        return state, True

    monkeypatch.setattr(prog, "run_iteration", iteration)
    ticks = len(answers)
    assert prog.serve(prog.Config(follow_container="vllm_x", follow_seconds=3600, **config), _StopAfter(ticks)) == prog.EXIT_OK
    return runs


def test_serve_in_follow_mode_leaves_a_loaded_start_alone_and_follows_the_next(monkeypatch, capsys):
    now = time.time()
    loaded, restarted = "true " + _docker_time(now - 100), "true " + _docker_time(now - 10)
    log = _Log([(now - 90, "INFO Loading weights took 3 s"), (now - 50, "INFO Available KV cache memory: 3 GiB")])
    assert _serve_following(monkeypatch, [loaded, restarted], log) == [True]
    assert log.asked[1] == pytest.approx(now - 11, abs=1e-5)    # the new start's log, from its start
    assert capsys.readouterr().out.splitlines() == [
        "<6>idle until the next start of vllm_x: started at %s, its load is over (INFO Available KV cache memory: 3 GiB)"
        % loaded.split()[1],
        "<6>following vllm_x: started 10 s ago at %s (load window 3600 s)" % restarted.split()[1]]


def test_serve_in_follow_mode_until_the_kv_cache_line(monkeypatch, capsys):
    now = time.time()
    start = "true " + _docker_time(now - 100)
    log = _Log([(now - 90, "INFO Loading weights took 3 s")])

    def kv_line_written():     # during the first flush: the next tick reads it
        log.lines.append((time.time(), "INFO Available KV cache memory: 3 GiB"))

    assert _serve_following(monkeypatch, [start, start, start], log, kv_line_written) == [True]
    assert capsys.readouterr().out.splitlines() == [
        "<6>following vllm_x: started 100 s ago at %s (load window 3600 s)" % start.split()[1],
        "<6>idle until the next start of vllm_x: started at %s, its load is over (INFO Available KV cache memory: 3 GiB)"
        % start.split()[1]]


def test_serve_names_a_new_start_that_begins_while_the_last_one_loads(monkeypatch, capsys):
    now = time.time()
    first, second = "true " + _docker_time(now - 100), "true " + _docker_time(now - 20)
    log = _Log([(now - 90, "INFO Loading weights took 3 s")])     # neither start has ended its load
    assert _serve_following(monkeypatch, [first, second, second], log) == [True, True, False]
    assert capsys.readouterr().out.splitlines() == [
        "<6>following vllm_x: started 100 s ago at %s (load window 3600 s)" % first.split()[1],
        "<6>following vllm_x: started 20 s ago at %s (load window 3600 s)" % second.split()[1]]


def test_serve_names_a_new_start_whose_load_was_over_before_a_tick_saw_it(monkeypatch, capsys):
    now = time.time()
    first, second = "true " + _docker_time(now - 300), "true " + _docker_time(now - 60)
    log = _Log([(now - 250, "INFO Available KV cache memory: 3 GiB"), (now - 30, "INFO Available KV cache memory: 4 GiB")])
    assert _serve_following(monkeypatch, [first, second, second], log) == []
    assert capsys.readouterr().out.splitlines() == [
        "<6>idle until the next start of vllm_x: started at %s, its load is over (INFO Available KV cache memory: 3 GiB)"
        % first.split()[1],
        "<6>idle until the next start of vllm_x: started at %s, its load is over (INFO Available KV cache memory: 4 GiB)"
        % second.split()[1]]


def test_serve_follows_the_whole_window_when_asked(monkeypatch):
    now = time.time()
    start = "true " + _docker_time(now - 100)
    log = _Log([(now - 50, "INFO Available KV cache memory: 3 GiB")])
    assert _serve_following(monkeypatch, [start, start], log, follow_until_loaded=False) == [True, False]
    assert log.asked == []


def test_serve_without_follow_always_acts(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setattr(prog, "follow_state", lambda config: pytest.fail("follow_state called without follow mode"))
    runs = []
    monkeypatch.setattr(prog, "run_iteration", lambda config, state, now, verbose=False: runs.append(verbose) or (state, True))
    assert prog.serve(prog.Config(), _StopAfter(3)) == prog.EXIT_OK
    assert runs == [True, False, False]


# ---------------------------------------------------------------- the service loop, as systemd runs it

def test_service_notifies_ready_and_stops_cleanly_on_sigterm(tmp_path):
    meminfo_path = tmp_path / "meminfo"
    meminfo_path.write_text(fixture_text("gb10_serving_below_threshold.txt"))
    drop = tmp_path / "drop_caches"
    drop.write_text("")
    notify_path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    sock.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    proc = subprocess.Popen(
        [sys.executable, "-I", str(SCRIPT), "--interval-seconds", "3600", "--meminfo-path", str(meminfo_path),
         "--drop-caches-path", str(drop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert sock.recv(4096) == b"READY=1"
        assert sock.recv(4096).startswith(b"STATUS=page cache ")  # the first iteration has run
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - started < 5  # woke from the 3600 s wait at once
    assert proc.returncode == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("<6>dgxspark-cache-flush starting")
    assert lines[1].startswith("<6>status: page_cache=")
    assert lines[-1] == "<6>dgxspark-cache-flush stopping on SIGTERM"
    assert drop.read_text() == ""


# ---------------------------------------------------------------- argument_specs (every role's: test_argument_specs.py)

def test_cache_flush_role_is_checked():
    assert (ROLE / "defaults" / "main.yml").is_file()   # so test_argument_specs.py compares it with its specs
    assert set(yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))["argument_specs"]) == {"main", "start", "stop", "follow"}


def test_signal_handler_does_not_wait_for_the_events_lock():
    # the signal lands while the main thread is inside stop.wait(), holding the event's lock: the handler must
    # return at once and the event be set once the lock is free (stop.set() in the handler waited forever)
    stop, received, returned = threading.Event(), [], threading.Event()
    handler = prog.signal_stopper(stop, received)

    def interrupted_wait():
        with stop._cond:  # pylint: disable=protected-access
            handler(signal.SIGTERM, None)
            returned.set()

    threading.Thread(target=interrupted_wait, daemon=True).start()
    assert returned.wait(5), "the signal handler blocked on the event's lock"
    assert stop.wait(5)
    assert received == ["SIGTERM"]
