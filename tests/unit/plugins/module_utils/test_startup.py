"""Startup watching: phase budgets, engine errors, dead peers, on a fake clock."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import (
    Observation, StartupError, established_peers, make_watch, step,
)

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
