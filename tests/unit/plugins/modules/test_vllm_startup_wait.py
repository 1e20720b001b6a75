# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_startup_wait module (docker inspect / docker logs answered by a fake run_command)."""
from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any
from unittest import mock
from urllib.error import HTTPError, URLError

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.module_utils import _http
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import parse_log
from ansible_collections.dgxspark.vllm.plugins.modules import vllm_startup_wait
from helpers.fixtures import read_log
from helpers.module_runner import ModuleFail, run_module


class FakeDocker:
    """`docker inspect` answers a state, `docker logs` a captured log; every call is recorded."""

    def __init__(self, log: str, running: bool = True, exists: bool = True) -> None:
        self.log, self.running, self.exists = log, running, exists
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **_kwargs: Any) -> tuple[int, str, str]:
        argv = list(argv)
        self.calls.append(argv)
        if not self.exists:
            return 1, "", "Error: No such container: %s" % argv[-1]
        if "inspect" in argv:
            return 0, json.dumps({"Running": self.running, "ExitCode": 0 if self.running else 1}), ""
        if "logs" in argv:
            return 0, self.log, ""
        raise AssertionError("unexpected command %r" % argv)


class SleepingFollower:
    """A follower that sees no line: each wait is the whole interval (time.sleep, patched by the tests)."""

    def __init__(self) -> None:
        self.alive, self.closed = True, False

    def wait(self, seconds: float) -> bool:
        vllm_startup_wait.time.sleep(seconds)
        return False

    def close(self) -> None:
        self.closed = True


def _run(args: dict[str, Any], fake: FakeDocker, check_mode: bool = False, may_poll: bool = False,
         follow: Any = None) -> dict[str, Any]:
    def run_command(_self: Any, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        return fake(argv, **kwargs)

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(vllm_startup_wait, "_follow", follow or (lambda _name, _since: SleepingFollower())), \
            mock.patch.object(vllm_startup_wait.time, "sleep",
                              side_effect=None if may_poll else AssertionError("polled again")):
        return run_module(vllm_startup_wait.main, args, check_mode=check_mode)


class ChangingDocker(FakeDocker):
    """Each `docker logs` answers the next log of a list (the last one from then on)."""

    def __init__(self, logs: list[str]) -> None:
        super().__init__(logs[0])
        self.logs = list(logs)

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        if "logs" in argv:
            self.log = self.logs.pop(0) if len(self.logs) > 1 else self.logs[0]
        return super().__call__(argv, **kwargs)


def test_a_notable_line_polls_again_at_once_instead_of_sleeping() -> None:
    worker = read_log("lab_cpu_tp2_worker_ready.log.gz")
    lines = worker.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "world_size=" in line or "headless multiproc executor" in line)
    fake = ChangingDocker(["".join(lines[:at]), worker])   # the first read is before the rendezvous line
    made: list[tuple[str, float]] = []

    class Woken(SleepingFollower):
        def wait(self, seconds: float) -> bool:
            return True   # the rendezvous line was written: no sleep

    def follow(name: str, since: float) -> Woken:
        made.append((name, since))
        made_follower.append(Woken())
        return made_follower[-1]

    made_follower: list[Woken] = []
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous", "poll_interval": 3600}, fake,
                  follow=follow)   # time.sleep fails the test: the follower's wake alone led to the second poll
    assert result["ok"] is True and result["status"] == "done"
    assert [argv[1] for argv in fake.calls] == ["inspect", "logs", "inspect", "logs"]
    assert [name for name, _since in made] == ["vllm_glm53"] and made[0][1] > 0
    assert made_follower[0].closed   # the docker CLI's follow process does not outlive the wait


def test_a_follower_whose_stream_ended_is_replaced_while_the_container_runs() -> None:
    worker = read_log("lab_cpu_tp2_worker_ready.log.gz")
    lines = worker.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "world_size=" in line or "headless multiproc executor" in line)
    fake = ChangingDocker(["".join(lines[:at])] * 2 + [worker])
    made: list[SleepingFollower] = []

    class Ended(SleepingFollower):
        def wait(self, seconds: float) -> bool:
            self.alive = False   # `docker logs --follow` ended (the daemon restarted, say)
            return False

    def follow(_name: str, _since: float) -> Ended:
        made.append(Ended())
        return made[-1]

    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous", "poll_interval": 0.001}, fake,
                  may_poll=True, follow=follow)
    assert result["ok"] is True
    assert len(made) == 2 and all(f.closed for f in made)   # the ended one closed before its successor started


def test_a_container_that_does_not_run_is_not_followed() -> None:
    made: list[str] = []
    fake = FakeDocker("", running=False)
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous", "poll_interval": 0.001,
                   "budgets": {"container_started": 0.05}}, fake, may_poll=True,
                  follow=lambda name, _since: made.append(name) or SleepingFollower())
    assert result["ok"] is False
    assert made == []


@pytest.mark.parametrize("log_name", ["lab_cpu_tp2_head_ready.log.gz", "fmt_gpu_single_node_tp2_ready.log"])
def test_a_serving_head_returns_the_log_report_of_the_same_read(log_name: str) -> None:
    text = read_log(log_name)
    fake = FakeDocker(text)
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, fake)
    assert result["ok"] is True and result["status"] == "done"
    # the KV cache the head reports comes with the wait: the same values vllm_kv_estimate_info reads
    assert result["log_report"] == parse_log(text).as_dict()
    assert result["log_report"]["kv_cache_tokens"] is not None
    assert result["log_report"]["phase"] == "api_up"
    # one inspect and one read of the log: the report costs no second docker call
    assert [argv[1] for argv in fake.calls] == ["inspect", "logs"]


def test_the_cpu_head_reports_its_pool_and_concurrency() -> None:
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, FakeDocker(read_log("lab_cpu_tp2_head_ready.log.gz")))
    assert result["log_report"]["kv_cache_tokens"] == 4194304
    assert result["log_report"]["kv_cache_pool"] == "CPU"
    assert result["log_report"]["max_concurrency"] == 1024.0


def test_a_missing_container_has_no_log_report() -> None:
    fake = FakeDocker("", exists=False)
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous",
                   "budgets": {"container_started": 0.01}, "poll_interval": 0.001}, fake, may_poll=True)
    assert result["ok"] is False
    assert result["log_report"] is None


def test_check_mode_waits_for_nothing() -> None:
    fake = FakeDocker("")
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"}, fake, check_mode=True)
    assert result["status"] == "check_mode" and result["log_report"] is None
    assert fake.calls == []


class FakeResponse:
    def __init__(self, code: int) -> None:
        self.code = code

    def getcode(self) -> int:
        return self.code

    def read(self) -> bytes:
        return b"{}"


def _run_api(fake: FakeDocker, answers: list[Any], **extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A worker at the rendezvous checking the head's API; answers: FakeResponse or exceptions, in order."""
    calls: list[dict[str, Any]] = []

    def open_url(url: str, **kwargs: Any) -> FakeResponse:
        calls.append({"url": url, **kwargs})
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    args = {"container": "vllm_glm53", "target_phase": "rendezvous",
            "api_url": "http://198.51.100.1:8000", "poll_interval": 0.001, **extra}
    with mock.patch.object(_http, "_open", open_url):
        return _run(args, fake, may_poll=True), calls


def test_a_worker_proves_it_runs_and_the_api_answers_from_it_in_one_call() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    result, calls = _run_api(fake, [URLError("connection refused"), FakeResponse(200)], api_key="sk-test")
    assert result["ok"] is True and result["status"] == "done"
    assert result["api"]["status"] == 200 and result["api"]["error"] is None
    assert result["api"]["url"] == "http://198.51.100.1:8000/v1/models"
    assert len(calls) == 2 and calls[1]["url"] == "http://198.51.100.1:8000/v1/models"
    assert calls[0]["headers"] == {"Authorization": "Bearer sk-test", "Accept": "application/json"}
    assert calls[0]["use_proxy"] is False
    assert "sk-test" not in json.dumps(result)


def test_a_worker_that_stops_while_the_head_comes_up_fails_the_check() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))

    def stop_after_first_inspect(argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        inspects = sum(1 for call in fake.calls if "inspect" in call)
        if "inspect" in argv and inspects >= 2:
            fake.running = False
        return FakeDocker.__call__(fake, argv, **kwargs)

    fake_call = mock.Mock(side_effect=stop_after_first_inspect)
    result, _calls = _run_api(fake_call, [URLError("connection refused")])  # type: ignore[arg-type]
    assert result["ok"] is False and result["status"] == "failed"
    assert "container stopped while waiting for the API" in result["reason"]
    assert result["api"]["status"] is None


def test_an_api_that_never_answers_fails_within_its_timeout_naming_the_url() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    result, calls = _run_api(fake, [URLError("connection refused")], api_timeout=0.02)
    assert result["ok"] is False
    assert "http://198.51.100.1:8000/v1/models did not answer HTTP 200 from this node within 0.02 s" in result["reason"]
    assert "connection refused" in result["reason"]
    assert len(calls) >= 2


def test_a_refused_key_fails_at_once() -> None:
    fake = FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz"))
    refused = HTTPError("http://198.51.100.1:8000/v1/models", 401, "Unauthorized", {}, None)  # type: ignore[arg-type]
    result, calls = _run_api(fake, [refused], api_key="wrong", api_timeout=60)
    assert result["ok"] is False and "refused the API key (HTTP 401)" in result["reason"]
    assert len(calls) == 1


def test_no_api_url_no_api_check() -> None:
    result = _run({"container": "vllm_glm53", "target_phase": "rendezvous"},
                  FakeDocker(read_log("lab_cpu_tp2_worker_ready.log.gz")))
    assert result["ok"] is True and result["api"] is None


# ---------------------------------------------------------------------------------------------------------
# load progress: stall_seconds and progress_path

TS = "2026-12-01T00:15:12.496703695Z "
HEAD_AT_40_OF_80 = "".join(TS + line + "\n" for line in [
    "(APIServer pid=1) INFO 12-01 00:15:01 [api_server.py:1] vLLM API server version 0.32.0",
    "(APIServer pid=1) INFO 12-01 00:15:01 [utils.py:1] non-default args: {'model_tag': 'm'}",
    "(Worker_TP0 pid=9) INFO 12-01 00:15:05 [parallel_state.py:1] world_size=2 rank=0 local_rank=0 "
    "distributed_init_method=tcp://10.0.0.1:29521 backend=nccl",
    "\r(Worker_TP0 pid=9) Loading safetensors checkpoint shards:  50% Completed | 40/80 [01:02<01:02,  0.64it/s]",
    "(EngineCore pid=26) INFO 12-01 00:15:14 [shm_broadcast.py:466] No available shared memory broadcast block "
    "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming "
    "work (e.g. compilation, weight/kv cache loading).",
])
PROGRESS_KEYS = {"phase", "shards_done", "shards_total", "shards_per_minute", "seconds_without_progress",
                 "stall_seconds", "paused", "last_line"}


class PausedDocker(FakeDocker):
    """`docker pause`d: Docker still says Running, with Paused; the log does not move."""

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        if "inspect" in argv:
            self.calls.append(list(argv))
            return 0, json.dumps({"Running": True, "Paused": True, "ExitCode": 0}), ""
        return super().__call__(argv, **kwargs)


class GrowingDocker(FakeDocker):
    """A head whose log gains a shard line at every read, then serves."""

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        if "logs" in argv:
            reads = sum(1 for call in self.calls if "logs" in call)
            if reads < 80:
                self.log += TS + "Loading safetensors checkpoint shards: %d%% Completed | %d/80\n" % (
                    (reads + 1) * 100 // 80, reads + 1)
            else:
                self.log += TS + "(APIServer pid=1) INFO 12-01 00:20:00 [launcher.py:1] Starting vLLM server on x\n"
        return super().__call__(argv, **kwargs)


def test_a_paused_container_whose_log_stops_moving_stalls(tmp_path: Any) -> None:
    path = tmp_path / "progress.json"
    fake = PausedDocker(HEAD_AT_40_OF_80)
    # the budget bounds the test should the stall go unseen
    result = _run({"container": "vllm_glm53", "target_phase": "api_up", "stall_seconds": 0.05,
                   "budgets": {"weights_loaded": 5}, "poll_interval": 0.001, "progress_path": str(path)},
                  fake, may_poll=True)
    assert result["ok"] is False and result["status"] == "failed"
    assert result["reason"].startswith("stalled: no progress for")
    assert "stalled" in result["reason"] and "paused" in result["reason"]
    assert "in phase rendezvous, checkpoint shards 40/80" in result["reason"]
    assert result["reason"].endswith("last line: No available shared memory broadcast block found in 60 seconds. "
                                     "This typically happens when some processes are hanging or doing some "
                                     "time-consuming work (e.g. compilation, weight/kv cache loading).")
    assert result["container"] == {"exists": True, "running": True, "exit_code": 0}
    progress = result["progress"]
    assert set(progress) == PROGRESS_KEYS
    assert (progress["phase"], progress["shards_done"], progress["shards_total"]) == ("rendezvous", 40, 80)
    assert progress["paused"] is True and progress["stall_seconds"] == 0.05
    assert progress["seconds_without_progress"] > 0.05
    assert result["log_report"]["progress_lines"] == 4   # the wait notice is not progress
    assert sum(1 for call in fake.calls if "logs" in call) >= 2
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["status"] == "failed" and written["paused"] is True and written["target"] == "api_up"
    assert "checkpoint shards 40/80" in written["summary"] and "PAUSED" in written["summary"]


def test_a_moving_log_reaches_its_target_with_a_stall_watch() -> None:
    fake = GrowingDocker("")
    result = _run({"container": "vllm_glm53", "target_phase": "api_up", "stall_seconds": 30,
                   "poll_interval": 0.001}, fake, may_poll=True)
    assert result["ok"] is True and result["status"] == "done"
    assert (result["progress"]["shards_done"], result["progress"]["shards_total"]) == (80, 80)
    assert result["progress"]["paused"] is False


class BusyWorkerDocker(FakeDocker):
    """A worker past the rendezvous: no progress bar (rank 0 only), a new log line at every read, then loaded."""

    def __call__(self, argv: Sequence[str], **kwargs: Any) -> tuple[int, str, str]:
        if "logs" in argv:
            reads = sum(1 for call in self.calls if "logs" in call)
            line = "Loading weights took 41.91 seconds" if reads >= 40 else "compiling kernel %d" % reads
            self.log += TS + "(Worker_TP1 pid=9) INFO 12-01 00:16:00 [gpu_worker.py:1] " + line + "\n"
        return super().__call__(argv, **kwargs)


def test_new_log_lines_alone_keep_a_worker_from_stalling() -> None:
    fake = BusyWorkerDocker(TS + "world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.0.0.1:29521 "
                                 "backend=nccl\n")
    # a clock that moves one second per reading: 40 polls take far longer than the 10 s stall timeout
    with mock.patch.object(vllm_startup_wait.time, "monotonic", side_effect=itertools.count(0.0, 1.0)):
        result = _run({"container": "vllm_glm53", "target_phase": "weights_loaded", "stall_seconds": 10,
                       "poll_interval": 0.001}, fake, may_poll=True)
    assert result["ok"] is True and result["status"] == "done", result["reason"]
    assert result["elapsed"] > 10
    assert (result["progress"]["shards_done"], result["progress"]["shards_total"]) == (None, None)


def test_progress_path_gets_the_progress_and_status_as_a_private_json_file(tmp_path: Any) -> None:
    path = tmp_path / "progress.json"
    path.write_text("old", encoding="utf-8")
    os.chmod(path, 0o644)
    result = _run({"container": "vllm_glm53", "target_phase": "api_up", "stall_seconds": 600,
                   "progress_path": str(path)}, FakeDocker(read_log("fmt_gpu_single_node_tp2_ready.log")))
    assert result["ok"] is True
    assert os.stat(path).st_mode & 0o777 == 0o600
    written = json.loads(path.read_text(encoding="utf-8"))
    assert set(written) == PROGRESS_KEYS | {"status", "target", "elapsed", "summary"}
    assert {key: written[key] for key in PROGRESS_KEYS} == result["progress"]
    assert (written["status"], written["target"], written["phase"]) == ("done", "api_up", "api_up")
    assert (written["shards_done"], written["shards_total"], written["stall_seconds"]) == (41, 41, 600)
    assert written["paused"] is False
    assert isinstance(written["elapsed"], float)
    assert written["summary"].startswith("phase api_up, checkpoint shards 41/41, last progress 0 s ago")
    assert os.listdir(tmp_path) == ["progress.json"]   # no temporary file left behind


def test_progress_path_in_a_missing_folder(tmp_path: Any) -> None:
    path = tmp_path / "run" / "progress.json"
    result = _run({"container": "vllm_glm53", "target_phase": "api_up", "progress_path": str(path)},
                  FakeDocker(read_log("fmt_gpu_single_node_tp2_ready.log")))
    assert result["ok"] is True
    assert json.loads(path.read_text(encoding="utf-8"))["status"] == "done"
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_without_progress_path_nothing_is_written(tmp_path: Any) -> None:
    result = _run({"container": "vllm_glm53", "target_phase": "api_up"},
                  FakeDocker(read_log("fmt_gpu_single_node_tp2_ready.log")))
    assert result["ok"] is True and result["progress"]["stall_seconds"] is None
    assert os.listdir(tmp_path) == []


def test_check_mode_reports_no_progress_and_writes_no_file(tmp_path: Any) -> None:
    fake = FakeDocker("")
    result = _run({"container": "vllm_glm53", "target_phase": "api_up", "stall_seconds": 60,
                   "progress_path": str(tmp_path / "progress.json")}, fake, check_mode=True)
    assert result["progress"] == {}
    assert fake.calls == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("stall", [0, -5])
def test_stall_seconds_must_be_positive(stall: float) -> None:
    fake = FakeDocker(HEAD_AT_40_OF_80)
    with pytest.raises(ModuleFail) as failed:
        _run({"container": "vllm_glm53", "target_phase": "api_up", "stall_seconds": stall}, fake)
    assert failed.value.result["msg"] == (
        "stall_seconds must be positive (or unset to turn stall detection off), got %r" % float(stall))
    assert fake.calls == []
