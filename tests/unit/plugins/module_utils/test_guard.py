# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group guard's decisions (module_utils/_guard.py): configuration, assessing, deciding, maintenance, state."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard as G
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import DEFAULT_BUDGETS

NOW = 1_800_000_000.0
T1 = "2027-01-15T08:00:00.000000001Z"
T2 = "2027-01-15T09:30:00.000000002Z"


def doc(**over):
    data = {
        "container": "vllm_glm53",
        "ranks": [
            {"name": "spark1", "role": "head", "ssh_host": "", "cx7_ip": "10.77.1.11"},
            {"name": "spark2", "role": "worker", "ssh_host": "dgxspark-guard-spark2", "cx7_ip": "10.77.1.12"},
            {"name": "spark3", "role": "worker", "ssh_host": "dgxspark-guard-spark3", "cx7_ip": "10.77.1.13"},
        ],
        "api_url": "http://127.0.0.1:8000",
        "served_model_name": "glm",
        "state_path": "/var/lib/dgxspark-guard/state.json",
        "maintenance_path": "/run/dgxspark/guard-maintenance.json",
    }
    data.update(over)
    return data


def config(**over):
    return G.parse_config(doc(**over))


def up(name, started_at=T1, **kw):
    return G.RankObservation(name=name, running=True, started_at=started_at, exit_code=0, **kw)


def all_up(started_at=T1):
    return [up("spark1", started_at), up("spark2", started_at), up("spark3", started_at)]


BASELINE = {"spark1": T1, "spark2": T1, "spark3": T1}


def attempt(started_at, ok=False, finished_at=None, **kw):
    record = {"started_at": started_at, "finished_at": started_at + 1 if finished_at is None else finished_at, "ok": ok,
              "failed_rank": None if ok else "spark2", "failed_phase": None if ok else "rendezvous",
              "error": None if ok else "phase 'rendezvous' not reached"}
    record.update(kw)
    return record


def finding(kind="stopped", rank="spark2"):
    return G.Finding(kind, rank, f"{kind} on {rank}")


# ------------------------------------------------------------------------------------------------ parse_config

def test_parse_config_types_defaults_and_rank_order():
    cfg = config(grace_seconds=5, max_failed_restores=4.0, budgets={"rendezvous": 20}, _comment="managed")
    assert cfg.head == G.Rank("spark1", "head", "", "10.77.1.11")
    assert [r.name for r in cfg.workers] == ["spark2", "spark3"]
    assert cfg.grace_seconds == 5.0 and isinstance(cfg.grace_seconds, float)
    assert cfg.max_failed_restores == 4 and isinstance(cfg.max_failed_restores, int)
    assert cfg.budgets == dict(DEFAULT_BUDGETS, rendezvous=20.0)
    assert cfg.backoff_seconds == 10.0 and cfg.window_seconds == 3600.0   # untouched defaults


def test_parse_config_defaults_budgets():
    assert config().budgets == DEFAULT_BUDGETS


@pytest.mark.parametrize("over, problem", [
    ({"grace_second": 5}, "unknown key 'grace_second'"),
    ({"grace_seconds": 0}, "grace_seconds must be a positive number, got 0"),
    ({"stop_seconds": -1}, "stop_seconds must be a positive number, got -1"),
    ({"interval_seconds": "2"}, "interval_seconds must be a positive number, got '2'"),
    ({"poll_seconds": True}, "poll_seconds must be a positive number, got True"),
    ({"max_failed_restores": 2.5}, "max_failed_restores must be a whole number, got 2.5"),
    ({"container": ""}, "container must be a non-empty string, got ''"),
    ({"api_url": None}, "api_url must be a non-empty string, got None"),
    ({"budgets": {"warmup": 5}}, "budgets: unknown phase 'warmup'"),
    ({"budgets": {"rendezvous": 0}}, "budgets: budget for phase 'rendezvous' must be positive"),
    ({"budgets": ["rendezvous"]}, "budgets: "),
    ({"backoff_seconds": 100, "backoff_max_seconds": 50}, "backoff_max_seconds must not be below backoff_seconds"),
    ({"backoff_seconds": 1000}, "backoff_max_seconds must not be below backoff_seconds"),   # the default max is 900
    ({"ranks": []}, "ranks must list the head and at least one worker"),
    ({"ranks": [doc()["ranks"][0]]}, "ranks must list the head and at least one worker"),
])
def test_parse_config_problems(over, problem):
    with pytest.raises(G.GuardConfigError) as info:
        config(**over)
    assert any(problem in p for p in info.value.problems), info.value.problems


def _ranks(*changes):
    ranks = [dict(r) for r in doc()["ranks"]]
    for pos, key, value in changes:
        ranks[pos][key] = value
    return ranks


@pytest.mark.parametrize("ranks, problem", [
    (_ranks((0, "ssh_host", "dgxspark-guard-spark1")), "the head (spark1) is the guard's own node: its ssh_host must be empty"),
    (_ranks((1, "ssh_host", "")), "worker spark2: ssh_host must be its Host alias in the guard's ssh_config (letters, "
                                  "digits, dots and dashes, not first), got ''"),
    (_ranks((2, "ssh_host", "ssh://spark3")), "worker spark3: ssh_host must be its Host alias in the guard's ssh_config"),
    (_ranks((2, "ssh_host", "-oProxyCommand=sh")), "worker spark3: ssh_host must be its Host alias"),
    (_ranks((2, "ssh_host", "spark3\n")), "worker spark3: ssh_host must be its Host alias"),
    (_ranks((2, "ssh_host", "spark 3")), "worker spark3: ssh_host must be its Host alias"),
    (_ranks((2, "name", "spark2")), "ranks name a host twice: ['spark1', 'spark2', 'spark2']"),
    (_ranks((0, "role", "worker")), "ranks[0] (spark1) must be the head, got role 'worker'"),
    (_ranks((1, "role", "head")), "ranks[1] (spark2) must be the worker, got role 'head'"),
    (_ranks((1, "cx7_ip", None)), "ranks[1] must have the strings name, role, ssh_host and cx7_ip"),
    (doc()["ranks"][:2] + ["spark3"], "ranks[2] must have the strings"),
])
def test_parse_config_rank_problems(ranks, problem):
    with pytest.raises(G.GuardConfigError) as info:
        config(ranks=ranks)
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_parse_config_lists_every_problem_at_once():
    bad = doc(colour="blue", grace_seconds=0, ranks=_ranks((1, "ssh_host", "ssh://spark2")))
    del bad["served_model_name"]
    with pytest.raises(G.GuardConfigError) as info:
        G.parse_config(bad)
    assert len(info.value.problems) == 4, info.value.problems
    assert str(info.value) == "; ".join(info.value.problems)


def test_parse_config_wants_an_object():
    with pytest.raises(G.GuardConfigError, match="must be a JSON object, got list"):
        G.parse_config([])


def test_the_guards_ssh_config_is_its_own_and_absolute():
    assert config().ssh_config == "/etc/dgxspark/guard/ssh_config"
    assert config(ssh_config="/etc/g/ssh_config").ssh_config == "/etc/g/ssh_config"
    for bad in ("ssh_config", "", 5):
        with pytest.raises(G.GuardConfigError) as info:
            config(ssh_config=bad)
        assert info.value.problems == [f"ssh_config must be an absolute path, got {bad!r}"]


# ------------------------------------------------------------------------------------------------ assess

def test_assess_healthy_is_none():
    assert G.assess(config(), BASELINE, all_up(), None, "", NOW) is None


def test_assess_unreachable_comes_before_everything():
    ranks = [G.RankObservation("spark1", exists=True, running=False, exit_code=1), up("spark2"),
             G.RankObservation("spark3", reachable=False, exists=False, error="ssh: connect to host: No route")]
    found = G.assess(config(), BASELINE, ranks, NOW - 1000, "boom", NOW)
    assert found == G.Finding("unreachable", "spark3", "Docker on spark3 does not answer: ssh: connect to host: No route")


def test_assess_absent():
    ranks = [up("spark1"), G.RankObservation("spark2", exists=False), up("spark3")]
    found = G.assess(config(), BASELINE, ranks, None, "", NOW)
    assert (found.kind, found.rank) == ("absent", "spark2")
    assert "vllm_glm53 is gone from spark2" in found.reason and "playbooks/launch.yml" in found.reason


@pytest.mark.parametrize("exit_code, tail", [(137, " (exit code 137)"), (None, "")])
def test_assess_stopped_with_its_exit_code(exit_code, tail):
    ranks = [up("spark1"), up("spark2"), G.RankObservation("spark3", running=False, started_at=T1, exit_code=exit_code)]
    found = G.assess(config(), BASELINE, ranks, None, "", NOW)
    assert found == G.Finding("stopped", "spark3", "the serve container on spark3 is not running" + tail)


def test_assess_goes_in_rank_order():
    ranks = [G.RankObservation("spark1", running=False, exit_code=0), G.RankObservation("spark2", exists=False), up("spark3")]
    assert G.assess(config(), BASELINE, ranks, None, "", NOW).rank == "spark1"


@pytest.mark.parametrize("head_finished, worker_finished, named", [
    ("2026-12-06T15:56:21.9Z", "2026-12-06T15:56:20.123456789Z", "spark2"),   # the worker died, the head followed
    ("2026-12-06T15:56:20Z", "2026-12-06T15:56:20.5Z", "spark1"),             # no fraction: .0, before .5
    ("2026-12-06T15:56:20.5Z", "2026-12-06T15:56:20.25Z", "spark2"),          # fractions of different lengths
    ("", "2026-12-06T15:56:20Z", "spark2"),                                   # a time against none: the time
    ("", "", "spark1"),                                                       # no time: rank order
    ("2026-12-06T15:56:20Z", "2026-12-06T15:56:20Z", "spark1"),               # the same time: rank order
])
def test_assess_names_the_rank_that_stopped_first(head_finished, worker_finished, named):
    ranks = [G.RankObservation("spark1", running=False, exit_code=0, finished_at=head_finished),
             G.RankObservation("spark2", running=False, exit_code=137, finished_at=worker_finished), up("spark3")]
    found = G.assess(config(), BASELINE, ranks, None, "", NOW)
    code = {"spark1": 0, "spark2": 137}[named]
    assert found == G.Finding("stopped", named, f"the serve container on {named} is not running (exit code {code})")


def test_assess_stopped_beats_restarted_and_api():
    ranks = [up("spark1", T2), up("spark2"), G.RankObservation("spark3", running=False, exit_code=1)]
    found = G.assess(config(), BASELINE, ranks, NOW - 1000, "x", NOW)
    assert (found.kind, found.rank) == ("stopped", "spark3")


def test_assess_restarted_against_baseline():
    ranks = [up("spark1"), up("spark2", T2), up("spark3")]
    found = G.assess(config(), BASELINE, ranks, None, "", NOW)
    assert (found.kind, found.rank) == ("restarted", "spark2")
    assert f"started again on its own at {T2} (the group started it at {T1})" in found.reason


@pytest.mark.parametrize("baseline, started_at", [
    ({"spark1": T1, "spark3": T1}, T2),    # no baseline for the rank yet
    ({}, T2),                              # no baseline at all
    (BASELINE, ""),                        # Docker gave no start time
    (BASELINE, T1),                        # the same start
])
def test_assess_restarted_needs_two_known_different_starts(baseline, started_at):
    ranks = [up("spark1"), up("spark2", started_at), up("spark3")]
    assert G.assess(config(), baseline, ranks, None, "", NOW) is None


def test_assess_restarted_beats_api():
    ranks = [up("spark1"), up("spark2"), up("spark3", T2)]
    assert G.assess(config(), BASELINE, ranks, NOW - 1000, "x", NOW).kind == "restarted"


def test_assess_api_failing_within_grace_is_not_broken():
    assert G.assess(config(grace_seconds=60), BASELINE, all_up(), NOW - 59.9, "GET /health: 503", NOW) is None


def test_assess_api_failing_past_grace_is_broken_at_the_head():
    found = G.assess(config(grace_seconds=60), BASELINE, all_up(), NOW - 60, "GET /health: 503", NOW)
    assert found == G.Finding("api", "spark1", "the head's API has been failing for 60 s (grace 60 s) while every "
                                               "container runs: GET /health: 503")


@pytest.mark.parametrize("obs, problem", [
    (up("spark2"), None),
    (G.RankObservation("spark2", reachable=False, exists=False, error="ssh: timeout"), None),   # the caller's
    (G.RankObservation("spark2", running=False, started_at=T1, exit_code=137),
     "the serve container on spark2 died during the restore (exit code 137)"),
    (G.RankObservation("spark2", running=False, started_at=T1), "the serve container on spark2 died during the restore"),
    (G.RankObservation("spark2", exists=False), "the serve container on spark2 is gone"),
    (up("spark2", T2), f"the serve container on spark2 started again during the restore (at {T2}; the restore "
                       f"started it at {T1})"),
    (G.RankObservation("spark2", running=True, paused=True, started_at=T1),
     "the serve container on spark2 is paused (docker pause) during the restore"),
])
def test_started_rank_problem(obs, problem):
    assert G.started_rank_problem(obs, T1) == problem


def test_started_rank_problem_without_a_known_start_judges_the_rest():
    assert G.started_rank_problem(up("spark2", T2), None) is None
    assert "paused" in G.started_rank_problem(G.RankObservation("spark2", running=True, paused=True), None)


def test_state_from_inspect():
    obs = G.state_from_inspect("spark2", {"Running": True, "Paused": True, "StartedAt": T1, "ExitCode": 0})
    assert obs == G.RankObservation("spark2", running=True, paused=True, started_at=T1, exit_code=0)
    assert G.state_from_inspect("spark2", {}) == G.RankObservation("spark2", running=False, started_at="", exit_code=None)
    stopped = G.state_from_inspect("spark2", {"Running": False, "ExitCode": 137, "FinishedAt": "2026-12-06T15:56:20.1Z"})
    assert stopped.finished_at == "2026-12-06T15:56:20.1Z"


# ------------------------------------------------------------------------------------------------ decide

def test_decide_ok_without_finding():
    state = G.GuardState(attempts=[attempt(NOW - 10)] * 5)
    assert G.decide(state, config(), None, NOW) == "ok"


def test_decide_waits_for_unreachable_nodes_even_after_failures():
    state = G.GuardState(attempts=[attempt(NOW - 100), attempt(NOW - 50), attempt(NOW - 10)])
    assert G.decide(state, config(), finding("unreachable"), NOW) == "wait_nodes"


def test_decide_gives_up_on_an_absent_container_at_once():
    assert G.decide(G.GuardState(), config(), finding("absent"), NOW) == "give_up"


def test_decide_restores_the_first_time():
    state = G.GuardState()
    assert G.decide(state, config(), finding(), NOW) == "restore"
    assert state.next_attempt_at == 0.0


@pytest.mark.parametrize("kind", ["stopped", "restarted", "api"])
def test_decide_gives_up_after_max_failed_restores_in_window(kind):
    cfg = config(max_failed_restores=3)
    attempts = [attempt(NOW - 3000), attempt(NOW - 2000)]
    assert G.decide(G.GuardState(attempts=list(attempts)), cfg, finding(kind), NOW) == "restore"
    attempts.append(attempt(NOW - 1000))
    assert G.decide(G.GuardState(attempts=attempts), cfg, finding(kind), NOW) == "give_up"


def test_decide_successes_do_not_count_towards_giving_up():
    state = G.GuardState(attempts=[attempt(NOW - 3000), attempt(NOW - 2000), attempt(NOW - 1000, ok=True)])
    assert G.decide(state, config(max_failed_restores=3), finding(), NOW) == "restore"


def test_decide_failures_outside_the_window_do_not_count():
    old = [attempt(NOW - 3600), attempt(NOW - 5000)]      # exactly at the window's edge, and before it
    state = G.GuardState(attempts=old + [attempt(NOW - 1000)])
    cfg = config(window_seconds=3600, max_failed_restores=2)
    assert G.failed_in_window(state, cfg, NOW) == [state.attempts[-1]]
    assert G.decide(state, cfg, finding(), NOW) == "restore"


def test_decide_failures_before_the_last_arm_do_not_count():
    state = G.GuardState(attempts=[attempt(NOW - 300, window_reset=True), attempt(NOW - 200, window_reset=True),
                                   attempt(NOW - 100)])
    cfg = config(max_failed_restores=2)
    assert G.decide(state, cfg, finding(), NOW) == "restore"
    state.attempts[0].pop("window_reset")
    assert G.decide(state, cfg, finding(), NOW) == "give_up"


def test_decide_backs_off_after_a_restore_in_the_window():
    cfg = config(backoff_seconds=10)
    state = G.GuardState(attempts=[attempt(NOW - 100, finished_at=NOW - 4)])
    assert G.decide(state, cfg, finding(), NOW) == "backoff"
    assert state.next_attempt_at == NOW + 6
    state.next_attempt_at = 0.0
    assert G.decide(state, cfg, finding(), NOW + 6) == "restore"
    assert state.next_attempt_at == 0.0


def test_decide_a_success_that_broke_again_soon_counts_as_a_failure():
    cfg = config(backoff_seconds=10, stable_seconds=600)
    state = G.GuardState(attempts=[attempt(NOW - 100, ok=True, finished_at=NOW - 1)])
    state.last_restore = state.attempts[-1]
    assert G.decide(state, cfg, finding(), NOW) == "backoff"
    assert state.next_attempt_at == NOW + 9
    assert state.attempts[-1]["unstable"] is True and state.attempts[-1]["served_seconds"] == 1
    assert state.last_restore["unstable"] is True
    assert G.failed_in_window(state, cfg, NOW) == state.attempts


def test_decide_a_restore_after_a_long_healthy_run_has_no_backoff():
    """Seven restores in the window, one failed long ago: the group served past stable_seconds each time."""
    cfg = config(backoff_seconds=10, stable_seconds=600, max_failed_restores=2)
    state = G.GuardState(attempts=[attempt(NOW - 3500)] + [attempt(NOW - 3000 + 700 * i, ok=True) for i in range(4)])
    state.attempts[-1]["finished_at"] = NOW - 600
    assert G.decide(state, cfg, finding("api", "spark1"), NOW) == "restore"
    assert not state.attempts[-1].get("unstable")
    assert G.backoff(state, cfg, NOW) == 0.0 and G.failed_in_window(state, cfg, NOW) == []


def test_note_break_leaves_failures_stable_runs_and_arms_alone():
    cfg = config(stable_seconds=600)
    for record in (attempt(NOW - 10), attempt(NOW - 700, ok=True), attempt(NOW - 10, ok=True, window_reset=True)):
        state = G.GuardState(attempts=[dict(record)])
        assert G.note_break(state, cfg, NOW) is False
        assert "unstable" not in state.attempts[-1]
    assert G.note_break(G.GuardState(), cfg, NOW) is False


def test_give_up_record_for_a_restore_that_did_not_last():
    cfg = config(max_failed_restores=2, stable_seconds=600)
    state = G.GuardState(attempts=[attempt(NOW - 300), attempt(NOW - 100, ok=True, finished_at=NOW - 40)])
    assert G.decide(state, cfg, finding("stopped", "spark3"), NOW) == "give_up"
    record = G.give_up_record(state, cfg, finding("stopped", "spark3"), NOW)
    assert record["reason"] == ("2 restores failed within 3600 s; the last one's group broke again after 40 s "
                                "(stable after 600 s): stopped on spark3")


@pytest.mark.parametrize("count, expect", [(0, 0.0), (1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 100.0), (12, 100.0)])
def test_backoff_doubles_and_is_capped(count, expect):
    cfg = config(backoff_seconds=10, backoff_max_seconds=100, max_failed_restores=50)
    state = G.GuardState(attempts=[attempt(NOW - 900, ok=True)] + [attempt(NOW - 500 + i) for i in range(count)])
    assert G.backoff(state, cfg, NOW) == expect


def test_backoff_counts_failures_only():
    cfg = config(backoff_seconds=10)
    state = G.GuardState(attempts=[attempt(NOW - 500), attempt(NOW - 400, ok=True), attempt(NOW - 300, ok=True)])
    assert G.backoff(state, cfg, NOW) == 0.0
    state.attempts[-1]["unstable"] = True
    assert G.backoff(state, cfg, NOW) == 10.0


def test_backoff_notice_once_per_change():
    api = G.Finding("api", "spark1", "the head's API has been failing for 20 s")
    key, line = G.backoff_notice(None, api, NOW + 10)
    assert line == f"broken (the head's API has been failing for 20 s), backing off until {G.iso(NOW + 10)}"
    later = G.Finding("api", "spark1", "the head's API has been failing for 22 s")
    assert G.backoff_notice(key, later, NOW + 10.2) == (key, None)
    assert G.backoff_notice(key, later, NOW + 30)[1] is not None
    assert G.backoff_notice(key, G.Finding("stopped", "spark2", "x"), NOW + 10)[1] is not None


def test_backoff_ignores_restores_outside_the_window_and_before_the_arm():
    cfg = config(backoff_seconds=10, window_seconds=600)
    state = G.GuardState(attempts=[attempt(NOW - 5000), attempt(NOW - 400, window_reset=True), attempt(NOW - 300)])
    assert G.backoff(state, cfg, NOW) == 10.0


def test_decide_waits_the_doubled_backoff():
    cfg = config(backoff_seconds=10, max_failed_restores=5)
    state = G.GuardState(attempts=[attempt(NOW - 100), attempt(NOW - 50, finished_at=NOW - 15)])   # backoff 20
    assert G.decide(state, cfg, finding(), NOW) == "backoff"
    assert state.next_attempt_at == NOW + 5
    assert G.decide(state, cfg, finding(), NOW + 5) == "restore"


# ------------------------------------------------------------------------------------------------ record / give up / arm

def test_record_restore_counts_and_takes_the_baseline_of_a_success():
    state = G.GuardState(baseline=dict(BASELINE))
    G.record_restore(state, config(), attempt(NOW - 10, baseline={"spark1": T2}))
    assert (state.restores_total, state.restores_failed_total, state.baseline) == (1, 1, BASELINE)
    ok = attempt(NOW, ok=True, baseline={"spark1": T2, "spark2": T2, "spark3": T2})
    G.record_restore(state, config(), ok)
    assert (state.restores_total, state.restores_failed_total) == (2, 1)
    assert state.baseline == {"spark1": T2, "spark2": T2, "spark3": T2}
    assert state.last_restore is ok and state.attempts[-1] is ok


def test_record_restore_keeps_a_bounded_history():
    state = G.GuardState()
    for i in range(G.HISTORY_KEEP + 5):
        G.record_restore(state, config(), attempt(NOW + i))
    assert len(state.attempts) == G.HISTORY_KEEP
    assert state.attempts[0]["started_at"] == NOW + 5
    assert state.restores_total == G.HISTORY_KEEP + 5


def test_give_up_record_names_the_last_failure():
    cfg = config(window_seconds=3600)
    state = G.GuardState(attempts=[attempt(NOW - 5000), attempt(NOW - 200),
                                   attempt(NOW - 100, failed_rank="spark3", failed_phase="container_started",
                                           error="no space left", last_lines=["a", "b"])])
    record = G.give_up_record(state, cfg, finding(), NOW)
    assert record["reason"] == ("2 restores failed within 3600 s; the last one failed at spark3 in phase "
                                "container_started: no space left")
    assert record["last_lines"] == ["a", "b"]
    assert record["at"] == NOW and record["finding"] == {"kind": "stopped", "rank": "spark2", "reason": "stopped on spark2"}
    assert "playbooks/launch.yml" in record["fix"]


def test_give_up_record_for_an_absent_container_is_the_finding():
    state = G.GuardState(attempts=[attempt(NOW - 10)])
    record = G.give_up_record(state, config(), G.Finding("absent", "spark2", "gone"), NOW)
    assert record["reason"] == "gone"


def test_arm_clears_give_up_and_resets_the_window():
    cfg = config(max_failed_restores=2)
    state = G.GuardState(status="gave_up", since=NOW - 50, attempts=[attempt(NOW - 30), attempt(NOW - 20)],
                         gave_up={"reason": "x"}, maintenance={"holder": "y"}, next_attempt_at=NOW + 30,
                         baseline=dict(BASELINE))
    assert G.decide(state, cfg, finding(), NOW) == "give_up"
    G.arm(state, {"spark1": T2, "spark2": T2, "spark3": T2}, NOW, "launch.yml")
    assert (state.status, state.detail, state.since) == ("armed", "armed by launch.yml", NOW)
    assert state.gave_up is None and state.maintenance is None and state.next_attempt_at == 0.0
    assert state.baseline == {"spark1": T2, "spark2": T2, "spark3": T2}
    assert len(state.attempts) == 2 and all(a["window_reset"] for a in state.attempts)   # history kept
    assert G.failed_in_window(state, cfg, NOW) == []
    assert G.backoff(state, cfg, NOW) == 0.0
    assert G.decide(state, cfg, finding(), NOW) == "restore"


def test_arm_changes_is_what_arm_changes():
    armed = G.GuardState(status="armed", baseline=dict(BASELINE), attempts=[attempt(NOW - 30, window_reset=True)])
    assert G.arm_changes(armed, BASELINE) is False
    # the arming run's own maintenance is no change
    assert G.arm_changes(G.GuardState(status="maintenance", baseline=dict(BASELINE)), BASELINE) is False
    assert G.arm_changes(armed, {"spark1": T2, "spark2": T1, "spark3": T1}) is True   # a rank started again
    assert G.arm_changes(G.GuardState(status="armed", baseline=dict(BASELINE), attempts=[attempt(NOW - 30)]),
                         BASELINE) is True                                            # a restore not yet forgotten
    for status in ("gave_up", "disarmed", "backoff"):
        assert G.arm_changes(G.GuardState(status=status, baseline=dict(BASELINE)), BASELINE) is True
    # arm() leaves nothing for a second arm to change
    state = G.GuardState(status="gave_up", baseline={}, attempts=[attempt(NOW - 30)], gave_up={"reason": "x"})
    assert G.arm_changes(state, BASELINE) is True
    G.arm(state, BASELINE, NOW, "launch.yml")
    assert G.arm_changes(state, BASELINE) is False


def test_arm_reason_says_why_a_run_must_arm_and_none_when_arming_changes_nothing():
    ranks = ["spark1", "spark2", "spark3"]
    armed = G.GuardState(status="armed", baseline=dict(BASELINE), since=NOW).to_json()
    assert G.arm_reason(armed, False, dict(BASELINE), ranks) is None
    assert G.arm_reason(armed, False, {}, ranks) == "the group was started in this run (or its containers were not read)"
    assert G.arm_reason(armed, False, {"spark1": T1, "spark2": T1}, ranks) == "no container start read for spark3"
    assert G.arm_reason(armed, False, dict(BASELINE, spark3=""), ranks) == "no container start read for spark3"
    assert G.arm_reason(None, False, dict(BASELINE), ranks) == "the guard has no state file yet"
    assert G.arm_reason(armed, True, dict(BASELINE), ranks) == "a maintenance lock is held"
    # the caller's own lock (taken once per run, given back when it is done): the guard in maintenance under it keeps
    # this group once released, so arming changes nothing; its restores still count
    held = G.GuardState(status="maintenance", baseline=dict(BASELINE), since=NOW).to_json()
    assert G.arm_reason(held, False, dict(BASELINE), ranks) is None
    assert G.arm_reason(held, False, dict(BASELINE, spark2=T2), ranks) == (
        "the guard keeps another group (its container starts differ)")
    held_restored = G.GuardState(status="maintenance", baseline=dict(BASELINE), attempts=[attempt(NOW - 5, ok=True)])
    assert G.arm_reason(held_restored.to_json(), False, dict(BASELINE), ranks) == (
        "the guard has restores not yet forgotten (arming starts its window anew)")
    disarmed = G.GuardState(status="disarmed", baseline=dict(BASELINE)).to_json()
    assert G.arm_reason(disarmed, False, dict(BASELINE), ranks) == "the guard is disarmed"
    assert G.arm_reason(armed, False, dict(BASELINE, spark2=T2), ranks) == (
        "the guard keeps another group (its container starts differ)")
    # a restore the guard made on its own: the group it keeps is the one serving, but the restore still counts
    unforgotten = G.GuardState(status="armed", baseline=dict(BASELINE), attempts=[attempt(NOW - 5, ok=True)]).to_json()
    assert G.arm_reason(unforgotten, False, dict(BASELINE), ranks) == (
        "the guard has restores not yet forgotten (arming starts its window anew)")
    forgotten = G.GuardState(status="armed", baseline=dict(BASELINE),
                             attempts=[attempt(NOW - 5, ok=True, window_reset=True)]).to_json()
    assert G.arm_reason(forgotten, False, dict(BASELINE), ranks) is None
    # an unreadable state file is a fresh state: it keeps no group
    assert G.arm_reason("{not json", False, dict(BASELINE), ranks) is not None


RUNS = {"running": True, "enabled": True}


@pytest.mark.parametrize("current, restart, arm, unit, state, install_only, mine, check, prepare, steps", [
    # a re-run that finds the guard installed, running, keeping this group, no lock held: nothing follows the plan
    (True, False, False, RUNS, True, False, False, False, [], []),
    (True, False, False, RUNS, True, False, True, False, [], ["release"]),        # the lock this run holds, given back
    (True, False, True, RUNS, True, False, True, False, [], ["arm"]),             # the arm gives it back itself
    (True, True, False, RUNS, True, False, False, False, ["restart"], []),        # older than its installed files
    (False, False, True, RUNS, True, False, False, False, ["install", "start"], ["arm"]),   # the new install starts
    (True, False, True, {"running": False, "enabled": True}, True, False, False, False, ["start"], ["arm"]),
    (True, False, True, {"running": True, "enabled": False}, True, False, False, False, ["start"], ["arm"]),
    (True, False, True, None, True, False, False, False, ["start"], ["arm"]),    # no unit read
    # never armed (no state file): the first arm starts it, prepare does not (it would take the first group it sees)
    (False, False, True, None, False, False, False, False, ["install"], ["start", "arm"]),
    (True, False, True, RUNS, False, False, False, False, [], ["arm"]),
    # install only (cache_flush.yml, before the launch): nothing started by prepare
    (False, False, True, None, True, True, False, False, ["install"], ["arm"]),
    (True, True, True, {"running": False, "enabled": False}, True, True, False, False, ["restart"], ["arm"]),
    # check mode: the install shows its differences; nothing restarted, started, armed or released
    (False, True, True, None, False, False, True, True, ["install"], []),
    (True, False, False, RUNS, True, False, True, True, [], []),
])
def test_entry_steps_are_what_follows_the_plan(current, restart, arm, unit, state, install_only, mine, check, prepare,
                                               steps):
    assert G.entry_steps(current, restart, arm, unit, state, install_only, mine, check) == {
        "prepare": prepare, "arm": steps}


def test_set_status():
    state = G.GuardState(status="armed", since=1.0)
    assert G.set_status(state, "armed", "", 5.0) is False and state.since == 1.0
    assert G.set_status(state, "armed", "serving", 6.0) is True and state.since == 1.0   # detail only
    assert G.set_status(state, "backoff", "serving", 7.0) is True and state.since == 7.0
    with pytest.raises(ValueError, match="unknown guard status 'sleeping'"):
        G.set_status(state, "sleeping", "", 8.0)


# ------------------------------------------------------------------------------------------------ maintenance

def test_maintenance_document():
    assert G.maintenance_document("site.yml", NOW, 60) == {"holder": "site.yml", "since": NOW, "expires_at": NOW + 60}
    with pytest.raises(ValueError, match="ttl must be positive"):
        G.maintenance_document("site.yml", NOW, 0)


def test_maintenance_absent():
    assert G.maintenance_active(None, NOW) is None


def test_maintenance_valid_until_it_expires():
    text = json.dumps(G.maintenance_document("staging.yml", NOW - 10, 20))
    assert G.maintenance_active(text, NOW) == {"holder": "staging.yml", "since": NOW - 10, "expires_at": NOW + 10}
    assert G.maintenance_active(text, NOW + 9.9) is not None
    assert G.maintenance_active(text, NOW + 10) is None     # expired at its expiry
    assert G.maintenance_active(text, NOW + 1000) is None


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"holder": "x"}', '{"expires_at": "soon"}', "null"])
def test_maintenance_unreadable_lock_holds_for_an_hour(text):
    assert G.maintenance_active(text, NOW) == {"holder": "an unreadable lock file", "since": NOW, "expires_at": NOW + 3600}


# ------------------------------------------------------------------------------------------------ state file

def test_state_json_round_trip():
    state = G.GuardState(status="backoff", since=NOW - 5, detail="restore failed", baseline=dict(BASELINE),
                         attempts=[attempt(NOW - 10)], restores_total=1, restores_failed_total=1,
                         last_restore=attempt(NOW - 10), gave_up=None, maintenance={"holder": "x"},
                         next_attempt_at=NOW + 10, updated_at=NOW)
    again = G.state_from_json(state.to_json())
    assert again == state
    assert json.loads(state.to_json())["status"] == "backoff"


def test_state_unknown_status_and_keys():
    text = json.dumps({"status": "sleeping", "detail": "d", "future_field": 1, "restores_total": 4})
    state = G.state_from_json(text)
    assert (state.status, state.detail, state.restores_total) == ("armed", "d", 4)


@pytest.mark.parametrize("text", ["", "not json", "[1]", "42"])
def test_state_unreadable_is_fresh(text):
    assert G.state_from_json(text) == G.GuardState()


# ------------------------------------------------------------------------------------------------ build_document

CLUSTER = {
    "head": "spark1",
    "workers": ["spark3", "spark_2.lab"],
    "nodes": {"spark1": {"cx7_ip": "10.77.1.11"}, "spark_2.lab": {"cx7_ip": "10.77.1.12"}, "spark3": {"cx7_ip": "10.77.1.13"}},
    "container_name": "vllm_glm53",
    "port": 8001,
    "served_model_name": "glm-5",
}
ADDRESSES = {"spark3": "192.168.1.13", "spark_2.lab": "192.168.1.12"}


def test_ssh_alias():
    assert G.ssh_alias("spark_2.lab") == "dgxspark-guard-spark-2.lab"
    assert G.ssh_alias("spark-3") == "dgxspark-guard-spark-3"
    assert G.ssh_alias("a b/c@d") == "dgxspark-guard-a-b-c-d"
    assert G.ssh_alias("sp\u00e4rk") == "dgxspark-guard-sp-rk"     # ASCII only: an ssh_config Host alias


def test_build_document_head_first_and_parses():
    document = G.build_document(CLUSTER, ADDRESSES, {"grace_seconds": 30, "backoff_seconds": None}, "/s.json", "/m.json")
    assert document["ranks"] == [
        {"name": "spark1", "role": "head", "ssh_host": "", "cx7_ip": "10.77.1.11"},
        {"name": "spark3", "role": "worker", "ssh_host": "dgxspark-guard-spark3", "cx7_ip": "10.77.1.13"},
        {"name": "spark_2.lab", "role": "worker", "ssh_host": "dgxspark-guard-spark-2.lab", "cx7_ip": "10.77.1.12"},
    ]
    assert document["api_url"] == "http://127.0.0.1:8001"
    assert (document["container"], document["served_model_name"]) == ("vllm_glm53", "glm-5")
    assert (document["state_path"], document["maintenance_path"]) == ("/s.json", "/m.json")
    assert document["grace_seconds"] == 30 and "backoff_seconds" not in document     # None: the default
    cfg = G.parse_config(json.loads(json.dumps(document)))
    assert cfg.head.name == "spark1" and cfg.grace_seconds == 30.0 and cfg.backoff_seconds == 10.0
    assert "ssh_config" not in document and cfg.ssh_config == "/etc/dgxspark/guard/ssh_config"
    document = G.build_document(CLUSTER, ADDRESSES, {}, "/s.json", "/m.json", ssh_config="/etc/g/ssh_config")
    assert G.parse_config(document).ssh_config == document["ssh_config"] == "/etc/g/ssh_config"


def test_build_document_unknown_tunable_and_missing_address():
    with pytest.raises(G.GuardConfigError) as info:
        G.build_document(CLUSTER, {"spark3": "192.168.1.13", "spark_2.lab": ""}, {"grace": 5}, "/s", "/m")
    assert len(info.value.problems) == 2
    assert info.value.problems[0].startswith("unknown guard setting 'grace' (known: interval_seconds, ")
    assert info.value.problems[1] == "no management address for worker spark_2.lab (its ansible_host)"


@pytest.mark.parametrize("address", ["192.168.1.12", "fd00::12", "spark-2.lab", "spark-2.lab.", "SPARK2",
                                     "spark_2.lab"])
def test_a_worker_address_is_an_ip_or_a_host_name(address):
    assert G.management_address_problem("spark_2.lab", address) is None


@pytest.mark.parametrize("address", ["192.168.1.12\n  ProxyCommand sh -c id", "spark-2\n", "spark-2.lab\n", "spark 2",
                                     "spark\"2", "-oProxyCommand=x", "a..b", "x" * 64 + ".lab", "host%name"])
def test_an_address_that_would_add_to_the_ssh_config_is_refused(address):
    with pytest.raises(G.GuardConfigError) as info:
        G.build_document(CLUSTER, dict(ADDRESSES, **{"spark_2.lab": address}), {}, "/s", "/m")
    assert info.value.problems == [
        f"worker spark_2.lab: its ansible_host {address!r} is neither an IP address nor a host name, so it cannot be "
        "the guard's HostName (set ansible_host to the worker's management address or DNS name)"]


def test_build_document_checks_the_tunables_values():
    with pytest.raises(G.GuardConfigError, match="backoff_max_seconds must not be below backoff_seconds"):
        G.build_document(CLUSTER, ADDRESSES, {"backoff_seconds": 60, "backoff_max_seconds": 30}, "/s", "/m")


def test_build_document_needs_a_worker():
    with pytest.raises(G.GuardConfigError, match="at least one worker"):
        G.build_document(dict(CLUSTER, workers=[]), {}, {}, "/s", "/m")


# ------------------------------------------------------------------------------------------------ describe

def iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def test_describe_never_armed():
    assert G.describe(None, None) == "installed, never armed (the launch arms it once the group serves)"


def test_describe_armed_without_restores():
    state = G.GuardState(status="armed", since=NOW, detail="armed by launch.yml")
    assert G.describe(state, None) == (f"armed since {iso(NOW)} (armed by launch.yml); no restore yet; "
                                       "restores: 0 (0 failed)")


def test_describe_armed_after_a_successful_restore():
    state = G.GuardState(status="armed", since=NOW, restores_total=3, restores_failed_total=2,
                         last_restore={"started_at": NOW - 60, "duration_seconds": 42.5, "ok": True, "reason": "spark2 stopped"})
    assert G.describe(state, None) == (f"armed since {iso(NOW)}; last restore {iso(NOW - 60)}, 42.5 s, ok, because "
                                       "spark2 stopped; restores: 3 (2 failed)")


def test_describe_backoff_after_a_failed_restore():
    last = attempt(NOW - 60, duration_seconds=3.0, reason="spark2 stopped")
    state = G.GuardState(status="backoff", since=NOW, detail="restore failed", last_restore=last, restores_total=1,
                         restores_failed_total=1)
    assert G.describe(state, None) == (f"BACKOFF since {iso(NOW)} (restore failed); last restore {iso(NOW - 60)}, 3.0 s, "
                                       "FAILED at spark2 in rendezvous: phase 'rendezvous' not reached, because "
                                       "spark2 stopped; restores: 1 (1 failed)")


def test_describe_gave_up():
    state = G.GuardState(status="gave_up", since=NOW - 5, detail="d", gave_up={"at": NOW, "reason": "3 restores failed"})
    assert G.describe(state, None).startswith(f"GAVE UP at {iso(NOW)}: 3 restores failed; no restore yet")
    state.gave_up = None
    assert G.describe(state, None).startswith(f"GAVE UP at {iso(NOW - 5)}: d;")


def test_describe_maintenance_wins_unless_disarmed():
    lock = {"holder": "staging.yml", "since": NOW, "expires_at": NOW + 3600}
    state = G.GuardState(status="armed", since=NOW)
    assert G.describe(state, lock).startswith(f"IN MAINTENANCE (held by staging.yml until {iso(NOW + 3600)}): restores nothing;")
    state.status = "gave_up"
    assert G.describe(state, lock).startswith("IN MAINTENANCE")
    state.status = "disarmed"
    assert G.describe(state, lock).startswith(f"DISARMED since {iso(NOW)};")


# ------------------------------------------------------------------------------------------------ the API probe

METRICS = Path(__file__).resolve().parents[3] / "fixtures" / "metrics"


@pytest.mark.parametrize("name, expect", [
    ("vllm-0.32.0-cpu-lab-captured.1.txt", 0.0),
    ("vllm-0.32.0-cpu-lab-captured.2.txt", 3.0 + 5.0),
    ("vllm-0.12-v1-assembled.2.txt", 81540.0 + 23576.0),
])
def test_engine_progress_sums_the_token_counters(name, expect):
    assert G.engine_progress((METRICS / name).read_text(encoding="utf-8")) == expect


@pytest.mark.parametrize("text, expect", [
    (None, None),
    ("", None),
    ("not a metric line {", None),                                      # unparsable
    ("# HELP x y\nfoo 1\n", None),                                      # no token counter
    ("vllm:prompt_tokens_total 5\nvllm:generation_tokens_total NaN\n", 5.0),
])
def test_engine_progress_unreadable_or_partial(text, expect):
    assert G.engine_progress(text) == expect


def test_judge_probe_ok_clears_a_failure():
    state = G.ProbeState(answered_once=True, failing_since=NOW - 30, detail="x")
    assert G.judge_probe(state, NOW, True, True, "ok", 10.0) == "ok"
    assert state == G.ProbeState(answered_once=True, failing_since=None, detail="", progress=10.0)


def test_judge_probe_warming_until_the_first_answer():
    state = G.ProbeState()
    assert G.judge_probe(state, NOW, True, False, "POST /v1/completions (1 token): timed out after 30 s", None) == "warming"
    assert state.failing_since is None
    assert G.judge_probe(state, NOW + 10, True, True, "ok", None) == "ok"
    assert G.judge_probe(state, NOW + 20, True, False, "timed out", None) == "failing"
    assert (state.failing_since, state.detail) == (NOW + 20, "timed out")


def test_judge_probe_health_failing_counts_while_warming():
    state = G.ProbeState()
    assert G.judge_probe(state, NOW, False, False, "GET /health: 503", None) == "failing"
    assert (state.failing_since, state.detail) == (NOW, "GET /health: 503")


def test_judge_probe_failing_keeps_its_start_and_the_latest_detail():
    state = G.ProbeState(answered_once=True)
    assert G.judge_probe(state, NOW, True, False, "first", 7.0) == "failing"
    assert G.judge_probe(state, NOW + 10, True, False, "second", 7.0) == "failing"      # the counters stand still
    assert (state.failing_since, state.detail) == (NOW, "second")
    assert G.judge_probe(state, NOW + 20, True, False, "third", None) == "failing"      # no counters: not moving
    assert state.progress == 7.0


def test_judge_probe_busy_when_the_counters_move():
    state = G.ProbeState(answered_once=True)
    assert G.judge_probe(state, NOW, True, False, "timed out", 100.0) == "failing"
    assert G.judge_probe(state, NOW + 10, True, False, "timed out", 150.0) == "busy"
    assert (state.failing_since, state.detail, state.progress) == (None, "", 150.0)
    assert G.judge_probe(state, NOW + 20, True, False, "timed out", 150.0) == "failing"
    assert state.failing_since == NOW + 20
    assert G.judge_probe(state, NOW + 30, False, False, "GET /health: 503", 999.0) == "failing"   # /health decides
    assert state.failing_since == NOW + 20


# ------------------------------------------------------------------------------- install_fingerprint / _current
FILES = {"dgxspark_group_guard.py": b"print('guard')\n", "_guard.py": b"X = 1\n"}
SETTINGS = {"python": "/usr/bin/python3", "lib_dir": "/usr/local/lib/dgxspark-guard"}


def _installed(document: dict) -> str:
    """The configuration file's text as the guard role writes it (to_nice_json, indent 2)."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def test_install_fingerprint_is_stable_and_follows_every_input():
    base = G.install_fingerprint(SETTINGS, FILES)
    assert base == G.install_fingerprint(dict(reversed(list(SETTINGS.items()))), dict(reversed(list(FILES.items()))))
    assert base != G.install_fingerprint(SETTINGS, dict(FILES, **{"_guard.py": b"X = 2\n"}))       # a file's bytes
    assert base != G.install_fingerprint(SETTINGS, {"_guard.py": FILES["_guard.py"]})              # a file fewer
    assert base != G.install_fingerprint(SETTINGS, {"other.py": FILES["_guard.py"],
                                                    "dgxspark_group_guard.py": FILES["dgxspark_group_guard.py"]})
    assert base != G.install_fingerprint(dict(SETTINGS, python="/opt/python3"), FILES)             # a setting


def test_install_current_only_for_the_same_document_and_fingerprint():
    document = G.build_document(CLUSTER, ADDRESSES, {"grace_seconds": 30}, "/s.json", "/m.json")
    document["_install"] = G.install_fingerprint(SETTINGS, FILES)
    assert G.install_current(_installed(document), document)
    assert not G.install_current(_installed(dict(document, grace_seconds=60)), document)        # a tunable changed
    assert not G.install_current(_installed(dict(document, _install="0" * 64)), document)      # a program changed
    assert not G.install_current(None, document)                                                # nothing installed
    assert not G.install_current("", document)
    assert not G.install_current("{not json", document)
    plain_document = {key: value for key, value in document.items() if key != "_install"}
    assert not G.install_current(_installed(plain_document), plain_document)   # no fingerprint: never skip the install


# ------------------------------------------------------------------------------------------------ memory

@pytest.mark.parametrize("text, expect", [
    ("MemTotal:       131072000 kB\nMemFree:  1 kB\nMemAvailable:   120000000 kB\n", 120000000),
    ("MemAvailable: 0 kB", 0),
    ("MemTotal: 1 kB\n", None),
    ("", None),
    (None, None),
    ("MemAvailable: lots kB", None),
])
def test_mem_available_kib(text, expect):
    assert G.mem_available_kib(text) == expect


GIB = 1024 * 1024


@pytest.mark.parametrize("available, reference, margin, expect", [
    (61 * GIB, 118 * GIB, 10,
     "memory not released on lab-worker: 61 GiB available, 118 GiB at the last good start "
     "(at least 106 GiB needed, guard_memory_margin_percent 10)"),
    (107 * GIB, 118 * GIB, 10, None),                       # within the bound
    (int(5.5 * GIB), 8 * GIB, 25,
     "memory not released on lab-worker: 5.5 GiB available, 8.0 GiB at the last good "
     "start (at least 6.0 GiB needed, guard_memory_margin_percent 25)"),
    (1, None, 10, None),                                     # no good start yet
    (None, 118 * GIB, 10, None),                             # unreadable
])
def test_memory_shortfall(available, reference, margin, expect):
    assert G.memory_shortfall("lab-worker", available, reference, margin) == expect


def test_memory_margin_must_be_below_100():
    with pytest.raises(G.GuardConfigError, match="memory_margin_percent must be below 100, got 100.0"):
        config(memory_margin_percent=100)
    assert config(memory_margin_percent=25, memory_wait_seconds=30).memory_wait_seconds == 30.0


def test_record_restore_takes_the_memory_of_a_good_start_only():
    state = G.GuardState(memory_reference={"spark1": 5, "spark2": 7})
    G.record_restore(state, config(), attempt(NOW, memory_before_start={"spark2": 1}))
    assert state.memory_reference == {"spark1": 5, "spark2": 7}
    G.record_restore(state, config(), attempt(NOW, ok=True, memory_before_start={"spark2": 9}))
    assert state.memory_reference == {"spark1": 5, "spark2": 9}


# ------------------------------------------------------------------------------------------------ metrics

def samples(text):
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_metrics_before_the_first_arm_have_every_series_the_rules_read():
    got = samples(G.metrics_text(None, None, NOW))
    assert got['dgxspark_guard_status{status="armed"}'] == 1 and got["dgxspark_guard_armed_once"] == 0
    assert got["dgxspark_guard_gave_up"] == 0 and got["dgxspark_guard_restores_total"] == 0
    assert "dgxspark_guard_last_restore_success" not in got
    assert sum(value for key, value in got.items() if key.startswith("dgxspark_guard_status{")) == 1


def test_metrics_of_a_guard_that_gave_up_on_memory():
    state = G.GuardState(status="gave_up", since=NOW - 5, restores_total=7, restores_failed_total=2,
                         last_restore=attempt(NOW - 60, duration_seconds=21.5, failed_phase="memory",
                                              memory={"node": "spark2", "available_kib": 61 * GIB, "reference_kib": 118 * GIB}),
                         memory_reference={"spark1": 100 * GIB, "spark2": 118 * GIB})
    text = G.metrics_text(state, None, NOW)
    got = samples(text)
    assert got['dgxspark_guard_status{status="gave_up"}'] == 1 and got['dgxspark_guard_status{status="armed"}'] == 0
    assert got["dgxspark_guard_gave_up"] == 1
    assert (got["dgxspark_guard_restores_total"], got["dgxspark_guard_restores_failed_total"]) == (7, 2)
    assert (got["dgxspark_guard_last_restore_success"], got["dgxspark_guard_last_restore_duration_seconds"]) == (0, 21.5)
    assert got["dgxspark_guard_last_restore_timestamp_seconds"] == NOW - 60
    assert got["dgxspark_guard_status_since_timestamp_seconds"] == NOW - 5
    assert got['dgxspark_guard_memory_reference_bytes{node="spark2"}'] == 118 * GIB * 1024
    assert got['dgxspark_guard_memory_available_bytes{node="spark2"}'] == 61 * GIB * 1024
    assert "# TYPE dgxspark_guard_restores_total counter" in text and text.endswith("\n")


def test_metrics_maintenance_lock_wins_unless_disarmed():
    lock = {"holder": "x", "since": NOW, "expires_at": NOW + 10}
    assert samples(G.metrics_text(G.GuardState(status="armed"), lock, NOW))['dgxspark_guard_status{status="maintenance"}'] == 1
    assert samples(G.metrics_text(G.GuardState(status="disarmed"), lock, NOW))['dgxspark_guard_status{status="disarmed"}'] == 1


def test_metrics_label_values_are_escaped():
    text = G.metrics_text(G.GuardState(memory_reference={'a"b\\c': 1}), None, NOW)
    assert 'dgxspark_guard_memory_reference_bytes{node="a\\"b\\\\c"} 1024' in text


def test_metrics_pass_promtool_check_metrics():
    import shutil
    import subprocess
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: install Debian's prometheus package (bin/test does: ensure_promtool in bin/lib.sh)"
    state = G.GuardState(status="restoring", restores_total=1, last_restore=attempt(NOW, ok=True, duration_seconds=3,
                         memory_before_start={"spark2": 5}), memory_reference={"spark2": 5})
    proc = subprocess.run([promtool, "check", "metrics"], input=G.metrics_text(state, None, NOW), text=True,
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("over, problem", [
    ({"metrics_port": 70000}, "metrics_port must be a port number (0: no metrics endpoint), got 70000"),
    ({"metrics_port": True}, "metrics_port must be a port number (0: no metrics endpoint), got True"),
    ({"metrics_port": 9478}, "metrics_address must be set when metrics_port is (the address the endpoint listens on)"),
    ({"metrics_port": 9478, "metrics_address": "a b"},
     "metrics_address must be an IP address or a host name the head listens on, got 'a b'"),
])
def test_parse_config_metrics_problems(over, problem):
    with pytest.raises(G.GuardConfigError) as info:
        config(**over)
    assert info.value.problems == [problem]


def test_parse_config_metrics_endpoint():
    cfg = config(metrics_port=9478, metrics_address="10.77.0.11")
    assert (cfg.metrics_address, cfg.metrics_port) == ("10.77.0.11", 9478)
    assert (config().metrics_address, config().metrics_port) == ("", 0)


# ------------------------------------------------------------------------------------------------ webhook

SLACK = "https://hooks.slack.example/services/T000/B000/sekrit-token"


@pytest.mark.parametrize("url", [SLACK, "http://10.77.0.1:19092/guard", "HTTPS://ntfy.example/topic",
                                 "http://[fd77::1]:8080/x?token=abc"])
def test_a_webhook_url_is_http_or_https_with_a_host(url):
    assert G.webhook_url_problem(url) is None
    assert G.parse_config(doc(webhook_url_file="/etc/g/webhook_url"), webhook_url=url + "\n").webhook_url == url


@pytest.mark.parametrize("url, problem", [
    ("ftp://files.example/sekrit", "the webhook URL must be an http:// or https:// URL (it starts with 'ftp:')"),
    ("hooks.slack.example/sekrit", "the webhook URL must be an http:// or https:// URL (it has no scheme)"),
    ("file:///etc/shadow", "the webhook URL must be an http:// or https:// URL (it starts with 'file:')"),
    ("https:///sekrit", "the webhook URL names no host"),
    ("http://host:port/sekrit", "the webhook URL cannot be parsed (its host or port)"),
    ("https://host/a b", "the webhook URL must not contain spaces or control characters"),
    ("https://host/a\r\nX-Injected: sekrit", "the webhook URL must not contain spaces or control characters"),
    ("", "the webhook URL is empty"),
])
def test_a_webhook_url_that_is_not_http_is_refused_without_showing_it(url, problem):
    assert G.webhook_url_problem(url) == problem
    with pytest.raises(G.GuardConfigError) as info:
        G.parse_config(doc(webhook_url_file="/etc/g/webhook_url"), webhook_url=url)
    assert info.value.problems == [problem]
    assert "sekrit" not in str(info.value)


def test_the_webhook_url_stays_out_of_the_document_and_the_repr():
    document = G.build_document(CLUSTER, ADDRESSES, {}, "/s.json", "/m.json", webhook_url=SLACK,
                                webhook_url_file="/etc/g/webhook_url")
    assert document["webhook_url_file"] == "/etc/g/webhook_url" and "sekrit" not in json.dumps(document)
    cfg = G.parse_config(document)                          # as status reads it: the file is not read
    assert (cfg.webhook_url_file, cfg.webhook_url) == ("/etc/g/webhook_url", "")
    cfg = G.parse_config(document, webhook_url=SLACK)       # as the guard reads it
    assert cfg.webhook_url == SLACK and "sekrit" not in repr(cfg)
    assert "webhook_url_file" not in G.build_document(CLUSTER, ADDRESSES, {}, "/s.json", "/m.json")
    with pytest.raises(G.GuardConfigError, match=r"^the webhook URL must be an http:// or https:// URL"):
        G.build_document(CLUSTER, ADDRESSES, {}, "/s.json", "/m.json", webhook_url="smtp://mail/sekrit",
                         webhook_url_file="/etc/g/webhook_url")
    with pytest.raises(G.GuardConfigError, match="webhook_url_file must be an absolute path"):
        G.build_document(CLUSTER, ADDRESSES, {}, "/s.json", "/m.json", webhook_url=SLACK, webhook_url_file="w")
    with pytest.raises(G.GuardConfigError, match="unknown key 'webhook_url'"):
        G.parse_config(doc(webhook_url=SLACK))              # never in the document itself


def test_the_webhook_file_is_current_when_it_holds_the_url_or_is_absent_without_one():
    text_sha = hashlib.sha256(G.webhook_file_text(SLACK).encode()).hexdigest()
    assert G.webhook_file_text(SLACK) == SLACK + "\n"
    assert G.webhook_file_current(SLACK, {"exists": True, "sha256": text_sha})
    assert not G.webhook_file_current(SLACK, {"exists": True, "sha256": "0" * 64})        # another URL
    assert not G.webhook_file_current(SLACK, {"exists": False, "sha256": None})
    assert G.webhook_file_current("", {"exists": False, "sha256": None})
    assert not G.webhook_file_current("", {"exists": True, "sha256": text_sha})           # a URL left behind
    assert G.webhook_file_current(SLACK, None)                                            # not read


def test_the_restored_body():
    state = G.GuardState(status="armed", restores_total=4, restores_failed_total=1)
    record = attempt(NOW - 42, ok=True, finished_at=NOW - 0.5, duration_seconds=41.5, kind="stopped", rank="spark2",
                     reason="the serve container on spark2 is not running (exit code 137)",
                     last_lines=["a log line"], baseline={"spark1": T1}, phases={"spark2": {"rendezvous": 2.0}})
    body = G.webhook_body("restored", config(), state, NOW, record)
    assert body == {
        "event": "restored", "head": "spark1", "container": "vllm_glm53", "served_model_name": "glm",
        "status": "armed", "time": G.iso(NOW), "timestamp": NOW, "restores_total": 4, "restores_failed_total": 1,
        "kind": "stopped", "rank": "spark2", "reason": "the serve container on spark2 is not running (exit code 137)",
        "ok": True, "error": None, "failed_rank": None, "failed_phase": None, "duration_seconds": 41.5,
        "started_at": NOW - 42, "finished_at": NOW - 0.5,
        "text": "dgxspark guard on spark1: restored, vllm_glm53 serves again after a 42 s restore (the serve "
                "container on spark2 is not running (exit code 137))"}
    assert json.loads(json.dumps(body)) == body


def test_the_restore_failed_body():
    state = G.GuardState(status="backoff", restores_total=2, restores_failed_total=2)
    record = attempt(NOW - 30, duration_seconds=29.9, kind="api", rank="spark1", reason="the head's API failed",
                     failed_phase="memory", error="memory not released on spark2: 5.0 GiB available")
    body = G.webhook_body("restore_failed", config(), state, NOW, record)
    assert (body["event"], body["ok"], body["failed_rank"], body["failed_phase"]) == ("restore_failed", False, "spark2",
                                                                                      "memory")
    assert (body["error"], body["status"], body["kind"]) == ("memory not released on spark2: 5.0 GiB available",
                                                             "backoff", "api")
    assert body["text"] == ("dgxspark guard on spark1: a restore FAILED after 30 s at spark2 in phase memory: memory "
                            "not released on spark2: 5.0 GiB available (it began because the head's API failed); the "
                            "guard is backoff")


def test_the_gave_up_body():
    state = G.GuardState(status="gave_up", restores_total=3, restores_failed_total=2)
    state.gave_up = G.give_up_record(state, config(), G.Finding("memory", "spark2", "memory not released on spark2"),
                                     NOW)
    body = G.webhook_body("gave_up", config(), state, NOW)
    assert {key: body[key] for key in ("event", "status", "reason", "kind", "rank")} == {
        "event": "gave_up", "status": "gave_up", "reason": "memory not released on spark2", "kind": "memory",
        "rank": "spark2"}
    assert body["fix"].startswith("free the node's memory") and body["fix"] == state.gave_up["fix"]
    assert body["text"] == f"dgxspark guard on spark1: GAVE UP: memory not released on spark2. Fix: {body['fix']}"
    assert "last_lines" not in body and "ok" not in body


def test_a_body_for_an_unknown_event_or_without_its_record_is_refused():
    with pytest.raises(ValueError, match="unknown webhook event 'restarted'"):
        G.webhook_body("restarted", config(), G.GuardState(), NOW, {})
    with pytest.raises(ValueError, match="needs the restore's record"):
        G.webhook_body("restored", config(), G.GuardState(), NOW)


def test_metrics_count_webhook_failures():
    got = samples(G.metrics_text(None, None, NOW))
    assert got["dgxspark_guard_webhook_failures_total"] == 0 and got["dgxspark_guard_webhook_sent_total"] == 0
    got = samples(G.metrics_text(G.GuardState(), None, NOW, {"sent": 3, "failed": 2}))
    assert got["dgxspark_guard_webhook_failures_total"] == 2 and got["dgxspark_guard_webhook_sent_total"] == 3
    assert "# TYPE dgxspark_guard_webhook_failures_total counter" in G.metrics_text(None, None, NOW)
