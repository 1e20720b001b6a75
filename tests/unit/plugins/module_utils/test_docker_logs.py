# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for _docker_logs: the follow command line and LogFollower, driven by real short-lived processes."""
from __future__ import annotations

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import (
    LogFollower, docker_follow_argv, merge_streams, time_key)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import notable_line

RENDEZVOUS = "(EngineCore pid=42) INFO 12-01 07:05:12 [core.py:93] world_size=2 rank=1 local_rank=0"


class Sleeps:
    """A sleep that records what it was asked to wait instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def _follow(script: str, sleep: Sleeps | None = None) -> LogFollower:
    return LogFollower(["sh", "-c", script], notable_line, sleep=sleep)


def test_the_follow_command_starts_at_the_poll_s_read_or_at_new_lines() -> None:
    assert docker_follow_argv("vllm_glm53", 1764572712.5) == [
        "docker", "logs", "--follow", "--since", "1764572712.500000", "vllm_glm53"]
    assert docker_follow_argv("vllm_glm53") == ["docker", "logs", "--follow", "--tail", "0", "vllm_glm53"]


@pytest.mark.parametrize("stream", ["", " >&2"])   # vLLM logs to stdout, tracebacks go to stderr
def test_a_phase_line_ends_the_wait_before_its_interval(stream: str) -> None:
    follower = _follow(f"echo routine{stream}; sleep 0.2; echo '{RENDEZVOUS}'{stream}; exec sleep 60")
    try:
        assert follower.wait(20) is True   # the interval would be 20 s: the line ended it
        assert follower.alive
    finally:
        follower.close()
    assert not follower.alive


def test_routine_lines_and_progress_bars_leave_the_interval_as_it_is() -> None:
    follower = _follow("printf 'Loading safetensors checkpoint shards:  50%%\\rLoading  100%%\\r\\n'; "
                       "echo 'INFO 12-01 07:05:12 [gpu_model_runner.py:1] Starting to load model'; exec sleep 60")
    try:
        assert follower.wait(0.5) is False
    finally:
        follower.close()


def test_a_line_cut_in_two_writes_is_seen_whole() -> None:
    cut = RENDEZVOUS.index("world_size") + 5   # neither piece holds the marker
    follower = _follow(f"printf '{RENDEZVOUS[:cut]}'; sleep 0.2; printf '{RENDEZVOUS[cut:]}\\n'; exec sleep 60")
    try:
        assert follower.wait(20) is True
    finally:
        follower.close()


def test_an_error_after_a_progress_bar_s_carriage_return_is_seen() -> None:
    # the bar ends with a carriage return, not a newline: the error's level starts its own line
    follower = _follow("printf 'Loading safetensors checkpoint shards: 100%%\\rERROR 12-01 07:05:40 [core.py:6] "
                       "EngineCore failed to start.\\n'; exec sleep 60")
    try:
        assert follower.wait(5) is True
    finally:
        follower.close()


def test_an_ended_stream_sleeps_the_rest_of_the_interval() -> None:
    sleeps = Sleeps()
    follower = _follow("echo routine", sleeps)   # `docker logs --follow` ends when the container stops
    try:
        assert follower.wait(30) is False
        assert not follower.alive
        assert len(sleeps.calls) == 1 and 0 < sleeps.calls[0] <= 30
    finally:
        follower.close()


def test_without_the_docker_cli_it_only_sleeps() -> None:
    sleeps = Sleeps()
    follower = LogFollower(["/nonexistent/docker", "logs", "--follow", "x"], notable_line, sleep=sleeps)
    assert not follower.alive
    assert follower.wait(2) is False
    assert len(sleeps.calls) == 1 and 0 < sleeps.calls[0] <= 2
    follower.close()


def test_a_state_time_sorts_as_the_log_lines_are_merged() -> None:
    # Docker cuts a time's trailing zeros: .5 is after .25 and .123456789, a whole second before any fraction of it
    times = ["2026-12-06T15:56:20.5Z", "2026-12-06T15:56:20Z", "2026-12-06T15:56:20.25Z",
             "2026-12-06T15:56:20.123456789Z", "2026-12-06T15:56:19.9Z"]
    assert sorted(times, key=time_key) == ["2026-12-06T15:56:19.9Z", "2026-12-06T15:56:20Z", "2026-12-06T15:56:20.123456789Z",
                                           "2026-12-06T15:56:20.25Z", "2026-12-06T15:56:20.5Z"]
    assert time_key("2026-12-06T15:56:20.25Z") == ("2026-12-06T15:56:20", "250000000")
    lines = merge_streams("2026-12-06T15:56:20.5Z out\n", "2026-12-06T15:56:20.25Z err\n")
    assert lines.splitlines() == ["2026-12-06T15:56:20.25Z err", "2026-12-06T15:56:20.5Z out"]


@pytest.mark.parametrize("value", ["", "0", "2026-12-06 15:56:20Z", "2026-12-06T15:56:20+01:00",
                                   "2026-12-06T15:56:20.1234567891Z"])
def test_what_is_not_one_of_docker_s_state_times_has_no_key(value: str) -> None:
    assert time_key(value) is None
