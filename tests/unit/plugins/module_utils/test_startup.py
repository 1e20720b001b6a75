"""Startup watching: phase budgets, engine errors, dead peers, on a fake clock."""
from __future__ import annotations

import re

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import (
    Observation, StartupError, Watch, describe_progress, established_peers, make_watch, observe, progress_mark,
    progress_report, step,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import LogReport

BUDGETS = {"container_started": 10, "rendezvous": 20, "weights_loaded": 30, "kv_allocated": 30, "api_up": 30}


def obs(now, phase=None, running=True, exists=True, **kw):
    return Observation(now=now, exists=exists, running=running, phase=phase, **kw)


def test_reaches_target():
    w = make_watch("rendezvous", BUDGETS, 0.0)
    assert step(w, obs(1, "container_started")).status == "waiting"
    v = step(w, obs(5, "rendezvous"))
    assert v.status == "done"
    assert v.phase_reached_at == {"container_started": 1, "rendezvous": 5}


def test_skipped_phases_are_filled_in():
    w = make_watch("api_up", BUDGETS, 0.0)
    v = step(w, obs(3, "api_up"))
    assert v.status == "done"
    assert set(v.phase_reached_at) == {"container_started", "rendezvous", "weights_loaded", "kv_allocated", "api_up"}


@pytest.mark.parametrize("seen, now, expect", [
    ("rendezvous", 5 + 30 + 1, "phase 'weights_loaded' not reached within its budget of 30 s (last phase reached: rendezvous)"),
    ("container_started", 1 + 20 + 1, "phase 'rendezvous' not reached within its budget of 20 s"),
])
def test_budget_of_the_next_phase_counts_from_the_previous(seen, now, expect):
    w = make_watch("api_up", BUDGETS, 0.0)
    first = 5 if seen == "rendezvous" else 1
    assert step(w, obs(first, seen)).status == "waiting"
    assert step(w, obs(now - 2, seen)).status == "waiting"
    v = step(w, obs(now, seen))
    assert v.status == "failed"
    assert expect in v.reason


def test_container_never_appears():
    w = make_watch("rendezvous", BUDGETS, 0.0)
    assert step(w, obs(5, running=False, exists=False)).status == "waiting"
    v = step(w, obs(11, running=False, exists=False))
    assert v.status == "failed" and "does not exist" in v.reason


def test_container_exit_is_a_failure_with_its_code():
    w = make_watch("api_up", BUDGETS, 0.0)
    step(w, obs(1, "rendezvous"))
    v = step(w, obs(2, "rendezvous", running=False, exit_code=1))
    assert v.status == "failed" and "exit code 1" in v.reason and "rendezvous" in v.reason


def test_a_container_that_exited_before_any_poll_fails_at_once_not_at_its_budget():
    w = make_watch("api_up", BUDGETS, 0.0)
    assert step(w, obs(1, running=False, exit_code=0)).status == "waiting"   # created, not started yet
    v = step(w, obs(2, running=False, exit_code=1, last_line="RuntimeError: no engine here"))
    assert v.status == "failed" and v.phase is None
    assert "container exited (exit code 1) before any poll saw it running" in v.reason
    assert "RuntimeError: no engine here" in v.reason


def test_engine_error_ends_the_wait_even_while_running():
    w = make_watch("api_up", BUDGETS, 0.0)
    v = step(w, obs(1, "rendezvous", engine_error="worker started without --headless (follower assertion)"))
    assert v.status == "failed" and "follower assertion" in v.reason


def test_dead_peer_is_detected_after_rendezvous_not_before():
    w = make_watch("api_up", BUDGETS, 0.0, peers=["10.0.0.2"], peer_grace=5)
    # before this rank reached the rendezvous, an absent peer is not an error
    assert step(w, obs(1, "container_started")).status == "waiting"
    assert step(w, obs(9, "container_started")).status == "waiting"
    assert step(w, obs(10, "rendezvous", peers_connected=frozenset({"10.0.0.2"}))).status == "waiting"
    assert step(w, obs(14, "weights_loaded")).status == "waiting"
    v = step(w, obs(16, "weights_loaded"))
    assert v.status == "failed"
    assert "peer 10.0.0.2 dropped its connection" in v.reason and "weights_loaded" in v.reason


def test_peer_that_never_connects():
    w = make_watch("api_up", BUDGETS, 0.0, peers=["10.0.0.2"], peer_grace=5)
    step(w, obs(2, "rendezvous"))
    v = step(w, obs(8, "rendezvous"))
    assert v.status == "failed" and "never connected" in v.reason


@pytest.mark.parametrize("kwargs, msg", [
    ({"target": "ready"}, "unknown phase 'ready'"),
    ({"budgets": {"loading": 3}}, "unknown phase 'loading'"),
    ({"budgets": {"rendezvous": 0}}, "must be positive"),
    ({"budgets": {"rendezvous": "soon"}}, "number of seconds"),
    ({"peers": ["worker"]}, "not an IP address"),
    ({"peer_grace": 0}, "peer_grace_seconds must be positive"),
])
def test_bad_options(kwargs, msg):
    args = {"target": "api_up", "budgets": None, "started": 0.0}
    args.update(kwargs)
    with pytest.raises(StartupError, match=msg):
        make_watch(**args)


PROC_NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0B014D0A:7331 0C014D0A:9C40 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0B014D0A:7331 0D014D0A:9C41 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 100 0 0 10 0
   2: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
"""


def test_established_peers_reads_little_endian_addresses_and_state():
    # 10.77.1.12 is 0C014D0A, ESTABLISHED (01); 10.77.1.13 is only in TIME_WAIT (06)
    assert established_peers(PROC_NET_TCP, ["10.77.1.12", "10.77.1.13"]) == frozenset({"10.77.1.12"})
    assert established_peers(PROC_NET_TCP, ["10.77.1.99"]) == frozenset()


# ---------------------------------------------------------------------------------------------------------
# load progress and stalls

PEER_A, PEER_B = "10.0.0.2", "10.0.0.3"
BAR = "Loading safetensors checkpoint shards:  50% Completed | 40/80 [01:02<01:02,  0.64it/s]"


def mark(lines: int, phase: str | None = "rendezvous", shards: int | None = None) -> tuple:
    return progress_mark(phase, shards, lines)


def stall_watch(stall: float | None = 10.0, target: str = "api_up", peers: list[str] | None = None,
                peer_grace: float = 30.0) -> Watch:
    return make_watch(target, None, 0.0, peers=peers, peer_grace=peer_grace, stall_seconds=stall)


def test_progress_mark_is_phase_shards_and_lines() -> None:
    assert progress_mark("rendezvous", 40, 118) == ("rendezvous", 40, 118)
    assert progress_mark(None, None, 0) == (None, None, 0)
    assert progress_mark("rendezvous", 40, 118) != progress_mark("rendezvous", 41, 118)


@pytest.mark.parametrize("stall", [0, 0.0, -1, -0.5])
def test_stall_seconds_must_be_positive(stall: float) -> None:
    with pytest.raises(StartupError, match=r"stall_seconds must be positive .*got " + re.escape(str(stall))):
        make_watch("api_up", None, 0.0, stall_seconds=stall)


@pytest.mark.parametrize("stall", [None, 0.5, 600])
def test_stall_seconds_unset_or_positive_is_kept(stall: float | None) -> None:
    assert make_watch("api_up", None, 0.0, stall_seconds=stall).stall_seconds == stall


def test_without_peers_the_stall_clock_starts_at_the_first_progress_observation() -> None:
    w = stall_watch()
    # no progress read yet (container not there): no clock
    assert step(w, obs(0, running=False, exists=False)).status == "waiting"
    assert step(w, obs(30, "container_started")).status == "waiting"
    assert w.progress_at is None
    assert step(w, obs(40, "rendezvous", progress=mark(3))).status == "waiting"
    assert w.progress_at == 40
    assert step(w, obs(50, "rendezvous", progress=mark(3))).status == "waiting"   # exactly stall_seconds: waits
    v = step(w, obs(51, "rendezvous", progress=mark(3)))
    assert v.status == "failed"
    assert v.reason == "stalled: no progress for 11 s (stall timeout 10 s) in phase rendezvous; last line: none"


def test_exactly_stall_seconds_waits_and_just_over_fails() -> None:
    w = stall_watch(stall=5.0)
    step(w, obs(100, "rendezvous", progress=mark(7)))
    assert step(w, obs(105, "rendezvous", progress=mark(7))).status == "waiting"
    assert step(w, obs(105.001, "rendezvous", progress=mark(7))).status == "failed"


def test_the_same_mark_again_does_not_reset_the_clock() -> None:
    w = stall_watch()
    for now in (0, 3, 6, 9, 10):
        assert step(w, obs(now, "rendezvous", progress=mark(5))).status == "waiting"
    assert w.progress_at == 0
    assert step(w, obs(10.5, "rendezvous", progress=mark(5))).status == "failed"


@pytest.mark.parametrize("before, after", [
    (mark(5), mark(6)),                                                  # a new line
    (mark(5, shards=40), mark(5, shards=41)),                           # a new shard
    (mark(5, "rendezvous"), mark(5, "weights_loaded")),                 # a new phase
    (mark(5, shards=None), mark(5, shards=0)),                          # the progress bar appears
])
def test_any_change_of_the_mark_resets_the_clock(before: tuple, after: tuple) -> None:
    w = stall_watch()
    assert step(w, obs(0, before[0], progress=before)).status == "waiting"
    assert step(w, obs(8, after[0], progress=after)).status == "waiting"
    assert w.progress_at == 8
    assert step(w, obs(18, after[0], progress=after)).status == "waiting"
    v = step(w, obs(18.5, after[0], progress=after))
    assert v.status == "failed" and v.reason.startswith("stalled: no progress for 10 s")


def test_a_mark_that_goes_back_is_a_change_too() -> None:
    w = stall_watch()
    step(w, obs(0, "rendezvous", progress=mark(5)))
    step(w, obs(6, "rendezvous", progress=mark(6)))
    assert step(w, obs(12, "rendezvous", progress=mark(5))).status == "waiting"
    assert w.progress_at == 12


def test_stall_counts_only_once_every_peer_is_connected() -> None:
    w = stall_watch(peers=[PEER_A, PEER_B], peer_grace=1000.0)
    quiet = mark(4)
    # one peer only: this rank may wait on the other for as long as the phase budgets allow
    for now in (0, 50, 100, 200):
        v = step(w, obs(now, "rendezvous", progress=quiet, peers_connected=frozenset({PEER_A})))
        assert v.status == "waiting"
        assert v.progress["seconds_without_progress"] is None
    both = frozenset({PEER_A, PEER_B})
    assert step(w, obs(210, "rendezvous", progress=quiet, peers_connected=both)).status == "waiting"
    assert w.progress_at == 210
    assert step(w, obs(220, "rendezvous", progress=quiet, peers_connected=both)).status == "waiting"
    v = step(w, obs(221, "rendezvous", progress=quiet, peers_connected=both))
    assert v.status == "failed" and v.reason.startswith("stalled: no progress for 11 s")


def test_peers_seen_at_different_polls_are_together() -> None:
    w = stall_watch(peers=[PEER_A, PEER_B], peer_grace=1000.0)
    step(w, obs(0, "rendezvous", progress=mark(4), peers_connected=frozenset({PEER_A})))
    step(w, obs(5, "rendezvous", progress=mark(4), peers_connected=frozenset({PEER_B})))
    assert w.progress_at == 5


@pytest.mark.parametrize("kw, expected", [
    ({}, "stalled: no progress for 12 s (stall timeout 10 s) in phase rendezvous; last line: none"),
    ({"last_line": BAR, "shards": (40, 80)},
     "stalled: no progress for 12 s (stall timeout 10 s) in phase rendezvous, checkpoint shards 40/80; "
     "last line: " + BAR),
    ({"last_line": BAR, "shards": (40, 80), "paused": True},
     "stalled: no progress for 12 s (stall timeout 10 s) in phase rendezvous, checkpoint shards 40/80; "
     "the container is paused (docker pause); last line: " + BAR),
    ({"last_line": "world_size=2 rank=1", "paused": True},
     "stalled: no progress for 12 s (stall timeout 10 s) in phase rendezvous; the container is paused "
     "(docker pause); last line: world_size=2 rank=1"),
])
def test_stall_reason_names_phase_shards_pause_and_last_line(kw: dict, expected: str) -> None:
    w = stall_watch()
    step(w, obs(0, "rendezvous", progress=mark(9, shards=40), **kw))
    v = step(w, obs(12, "rendezvous", progress=mark(9, shards=40), **kw))
    assert (v.status, v.phase, v.reason) == ("failed", "rendezvous", expected)
    assert v.progress["paused"] is kw.get("paused", False)


def test_a_paused_container_is_running_to_docker_and_stalls() -> None:
    w = stall_watch()
    step(w, obs(0, "weights_loaded", progress=mark(9, "weights_loaded")))
    v = step(w, obs(11, "weights_loaded", progress=mark(9, "weights_loaded"), paused=True))
    assert v.status == "failed" and "stalled" in v.reason and "paused" in v.reason
    assert "in phase weights_loaded" in v.reason


def test_a_running_container_without_phase_lines_stalls_in_container_started() -> None:
    w = stall_watch()
    # running proves container_started, so a stall always names a phase
    step(w, obs(0, None, progress=mark(0, None)))
    v = step(w, obs(11, None, progress=mark(0, None)))
    assert v.status == "failed" and "in phase container_started" in v.reason


def test_reaching_the_target_is_done_even_when_the_log_was_quiet() -> None:
    w = stall_watch(target="weights_loaded")
    quiet = mark(9, "rendezvous")
    step(w, obs(0, "rendezvous", progress=quiet))
    # the mark did not move (a log read that missed the line, say) but the phase proves the target
    v = step(w, obs(500, "weights_loaded", progress=quiet))
    assert v.status == "done" and v.reason is None


def test_an_engine_error_wins_over_a_stall() -> None:
    w = stall_watch()
    step(w, obs(0, "rendezvous", progress=mark(9)))
    v = step(w, obs(60, "rendezvous", progress=mark(9), engine_error="CUDA out of memory"))
    assert v.status == "failed" and v.reason == "engine error: CUDA out of memory"


def test_a_stopped_container_wins_over_a_stall() -> None:
    w = stall_watch()
    step(w, obs(0, "rendezvous", progress=mark(9)))
    v = step(w, obs(60, "rendezvous", running=False, exit_code=137, progress=mark(9)))
    assert v.status == "failed" and v.reason == "container stopped (exit code 137) after reaching phase rendezvous"


def test_dead_peers_are_still_detected_with_a_stall_watch() -> None:
    w = stall_watch(stall=100.0, peers=[PEER_A], peer_grace=5)
    assert step(w, obs(0, "rendezvous", progress=mark(1), peers_connected=frozenset({PEER_A}))).status == "waiting"
    # the log keeps moving, but the peer is gone
    assert step(w, obs(4, "rendezvous", progress=mark(2))).status == "waiting"
    v = step(w, obs(6, "rendezvous", progress=mark(3)))
    assert v.status == "failed" and "peer 10.0.0.2 dropped its connection" in v.reason


def test_a_dead_peer_is_named_before_the_stall_it_causes() -> None:
    w = stall_watch(stall=3.0, peers=[PEER_A], peer_grace=5)
    step(w, obs(0, "rendezvous", progress=mark(1), peers_connected=frozenset({PEER_A})))
    v = step(w, obs(10, "rendezvous", progress=mark(1)))
    assert v.status == "failed" and v.reason.startswith("peer 10.0.0.2 dropped its connection")


def test_without_stall_seconds_there_is_never_a_stall() -> None:
    w = make_watch("api_up", {"weights_loaded": 1e9}, 0.0)
    step(w, obs(0, "rendezvous", progress=mark(1), paused=True))
    v = step(w, obs(1e6, "rendezvous", progress=mark(1), paused=True))
    assert v.status == "waiting" and v.reason is None
    assert v.progress["stall_seconds"] is None
    assert v.progress["seconds_without_progress"] == 1e6


def test_a_budget_still_bounds_a_moving_log() -> None:
    w = make_watch("api_up", {"weights_loaded": 30}, 0.0, stall_seconds=10)
    step(w, obs(0, "rendezvous", progress=mark(0)))
    for n, now in enumerate(range(5, 31, 5), start=1):
        assert step(w, obs(now, "rendezvous", progress=mark(n))).status == "waiting"
    v = step(w, obs(31, "rendezvous", progress=mark(99)))
    assert v.status == "failed" and "phase 'weights_loaded' not reached within its budget of 30 s" in v.reason


# progress_report

PROGRESS_KEYS = {"phase", "shards_done", "shards_total", "shards_per_minute", "seconds_without_progress",
                 "stall_seconds", "paused", "last_line"}


def test_every_verdict_carries_the_progress_report() -> None:
    w = stall_watch(stall=600.0)
    v = step(w, obs(0, "rendezvous", progress=mark(3, shards=40), shards=(40, 80), last_line=BAR))
    assert v.progress == {"phase": "rendezvous", "shards_done": 40, "shards_total": 80, "shards_per_minute": None,
                          "seconds_without_progress": 0.0, "stall_seconds": 600.0, "paused": False,
                          "last_line": BAR}


def test_shards_per_minute_counts_from_the_first_shard_observation() -> None:
    w = stall_watch(stall=600.0)
    assert step(w, obs(0, "rendezvous", progress=mark(2))).progress["shards_per_minute"] is None
    v = step(w, obs(30, "rendezvous", progress=mark(3, shards=0), shards=(0, 80)))
    assert (v.progress["shards_done"], v.progress["shards_total"], v.progress["shards_per_minute"]) == (0, 80, None)
    assert w.first_shards == (30, 0)
    v = step(w, obs(90, "rendezvous", progress=mark(4, shards=20), shards=(20, 80)))
    assert v.progress["shards_per_minute"] == 20.0
    v = step(w, obs(120, "rendezvous", progress=mark(5, shards=40), shards=(40, 80)))
    assert v.progress["shards_per_minute"] == 26.67
    assert w.first_shards == (30, 0)


def test_shards_per_minute_is_none_while_no_shard_moved() -> None:
    w = stall_watch(stall=600.0)
    step(w, obs(0, "rendezvous", progress=mark(3, shards=40), shards=(40, 80)))
    v = step(w, obs(60, "rendezvous", progress=mark(3, shards=40), shards=(40, 80)))
    assert v.progress["shards_per_minute"] is None
    assert (v.progress["shards_done"], v.progress["shards_total"]) == (40, 80)


def test_seconds_without_progress_is_none_until_the_group_is_together() -> None:
    w = stall_watch(stall=600.0, peers=[PEER_A], peer_grace=1000.0)
    v = step(w, obs(0, "rendezvous", progress=mark(3)))
    assert v.progress["seconds_without_progress"] is None
    v = step(w, obs(7, "rendezvous", progress=mark(3), peers_connected=frozenset({PEER_A})))
    assert v.progress["seconds_without_progress"] == 0.0
    v = step(w, obs(19.26, "rendezvous", progress=mark(3), peers_connected=frozenset({PEER_A})))
    assert v.progress["seconds_without_progress"] == 12.3
    v = step(w, obs(20, "rendezvous", progress=mark(4), peers_connected=frozenset({PEER_A})))
    assert v.progress["seconds_without_progress"] == 0.0


def test_progress_report_passes_paused_and_last_line_through() -> None:
    w = stall_watch(stall=None)
    report = progress_report(w, obs(5, "rendezvous", paused=True, last_line="a line"), "rendezvous")
    assert set(report) == PROGRESS_KEYS
    assert report == {"phase": "rendezvous", "shards_done": None, "shards_total": None, "shards_per_minute": None,
                      "seconds_without_progress": None, "stall_seconds": None, "paused": True,
                      "last_line": "a line"}


def test_progress_report_of_a_failed_stall() -> None:
    w = stall_watch()
    step(w, obs(0, "rendezvous", progress=mark(3, shards=40), shards=(40, 80), last_line=BAR))
    v = step(w, obs(20, "rendezvous", progress=mark(3, shards=40), shards=(40, 80), paused=True, last_line=BAR))
    assert v.status == "failed"
    assert v.progress == {"phase": "rendezvous", "shards_done": 40, "shards_total": 80, "shards_per_minute": None,
                          "seconds_without_progress": 20.0, "stall_seconds": 10.0, "paused": True,
                          "last_line": BAR}


@pytest.mark.parametrize("changes, expected", [
    ({}, "phase rendezvous, checkpoint shards 40/80 at 12.5 per minute, last progress 30 s ago "
         "(stall timeout 600 s), PAUSED"),
    ({"paused": False, "stall_seconds": None}, "phase rendezvous, checkpoint shards 40/80 at 12.5 per minute, "
                                               "last progress 30 s ago"),
    ({"shards_per_minute": None, "paused": False}, "phase rendezvous, checkpoint shards 40/80, last progress 30 s ago "
                                                   "(stall timeout 600 s)"),
    ({"shards_done": None, "shards_total": None, "shards_per_minute": None, "seconds_without_progress": None,
      "paused": False, "phase": None}, "phase none, waiting for every rank to connect"),
])
def test_describe_progress(changes: dict, expected: str) -> None:
    progress = {"phase": "rendezvous", "shards_done": 40, "shards_total": 80, "shards_per_minute": 12.5,
                "seconds_without_progress": 30.4, "stall_seconds": 600.0, "paused": True, "last_line": BAR}
    progress.update(changes)
    assert describe_progress(progress) == expected


def test_describe_progress_of_a_verdict() -> None:
    w = stall_watch(stall=600.0)
    v = step(w, obs(0, "rendezvous", progress=mark(3, shards=40), shards=(40, 80)))
    assert describe_progress(v.progress) == ("phase rendezvous, checkpoint shards 40/80, last progress 0 s ago "
                                             "(stall timeout 600 s)")


def test_observe_builds_the_observation_from_the_state_and_the_log_report() -> None:
    report = LogReport(phase="weights_loaded", engine_error=None, shards_done=3, shards_total=8, progress_lines=41,
                       last_line="Loading safetensors checkpoint shards:  38% Completed | 3/8")
    obs = observe(5.0, True, True, None, report, frozenset({"10.0.0.2"}), paused=True)
    assert (obs.phase, obs.shards, obs.progress, obs.paused) == (
        "weights_loaded", (3, 8), progress_mark("weights_loaded", 3, 41), True)
    assert (obs.last_line, obs.peers_connected) == (report.last_line, frozenset({"10.0.0.2"}))
    # no shard bar in the log: no shards
    assert observe(5.0, True, True, None, LogReport(phase="rendezvous")).shards is None
    # no log read: nothing from it
    bare = observe(5.0, False, False, None, None)
    assert (bare.phase, bare.progress, bare.last_line, bare.engine_error) == (None, None, None, None)


def test_observe_takes_a_stopped_container_s_log_only_beyond_its_start() -> None:
    """A stopped container's log that proves nothing beyond container_started does not count as started."""
    assert observe(1.0, True, False, 1, LogReport(phase="container_started")).phase is None
    assert observe(1.0, True, False, 1, LogReport(phase="rendezvous")).phase == "rendezvous"
    assert observe(1.0, True, True, None, LogReport(phase="container_started")).phase == "container_started"
