# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for roles/guard: the group guard daemon (roles/guard/files/dgxspark_group_guard.py) on fake nodes.

The program is a standalone script, imported by path. Each rank's Docker engine is an in-memory model behind
the runner the daemon's Docker class calls (`docker inspect/start/stop/kill/unpause/logs` as argv lists on the head;
on a worker, the guard's `ssh -F SSH_CONFIG ALIAS REQUEST`, whose request goes through the worker's own forced
command, roles/guard/files/dgxspark_guard_worker.py, exactly as sshd would hand it over: every request the guard
sends in these tests must be one that program allows); the serve containers log the fixture lines of
tests/fixtures/vllm_logs as the fake clock passes, so the restore's waits complete through the real phase detection.
Every docker command is journalled with the clock and node.
"""
from __future__ import annotations

import calendar
import http.server
import ipaddress
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from helpers.fixtures import read_log
from helpers.programs import load_program
from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard as G

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "guard" / "files" / "dgxspark_group_guard.py"
WORKER_SCRIPT_PATH = ROOT / "roles" / "guard" / "files" / "dgxspark_guard_worker.py"
SSH_CONFIG = "/etc/dgxspark/guard/ssh_config"
T0 = 1_800_000_000.0
HEAD, W1, W2 = "spark1", "spark2", "spark3"
CX7 = {HEAD: "10.77.1.11", W1: "10.77.1.12", W2: "10.77.1.13"}
CONTAINER = "vllm_glm53"
MUTATING = ("start", "stop", "kill", "unpause")


prog = load_program(SCRIPT, "dgxspark_group_guard")
worker_program = load_program(WORKER_SCRIPT_PATH, "dgxspark_guard_worker")
NODES_MADE = []     # every fake node of a test: none may have been sent a request its worker program refuses


def script_from_fixture(name: str, first: float, step: float = 1.0) -> list:
    """(seconds after the start, message) for every line of a fixture log, its Docker timestamp removed."""
    lines = [line.split(" ", 1)[1] for line in read_log(name).splitlines() if line.strip()]
    return [(first + i * step, line) for i, line in enumerate(lines)]


# The worker reaches rendezvous with its first line (the headless launch), 2 s after its start; the head logs
# rendezvous 5 s and api_up 10 s after its start.
WORKER_SCRIPT = script_from_fixture("fmt_cpu_worker_ready.log", 2.0)
HEAD_SCRIPT = script_from_fixture("fmt_cpu_head_ready.log", 1.0)
WORKER_RENDEZVOUS_AFTER = 2.0
HEAD_API_UP_AFTER = 10.0


def stamp(epoch: float) -> str:
    """Docker's RFC 3339 time with nanoseconds."""
    whole = int(epoch)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + ".%09dZ" % round((epoch - whole) * 1e9)


def unstamp(text: str) -> float:
    main, _dot, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.slept = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Container:
    """One serve container: its State, its starts (each with the lines it logs as time passes), its Env."""

    def __init__(self, script: list) -> None:
        self.script = list(script)      # what the next start logs
        self.running = False
        self.paused = False
        self.started_at = "0001-01-01T00:00:00Z"
        self.exit_code = 0
        self.starts = []                # [start epoch, end epoch or None, script]
        self.env = ["PATH=/usr/bin", "VLLM_API_KEY=sekrit"]
        self.ignores_stop = False       # a hung process: docker stop returns, the container still runs

    def start(self, now: float) -> None:
        self.running, self.paused, self.exit_code = True, False, 0
        self.started_at = stamp(now)
        self.starts.append([now, None, list(self.script)])

    def end(self, now: float, exit_code: int) -> None:
        self.running, self.paused, self.exit_code = False, False, exit_code
        self.starts[-1][1] = now

    def log_lines(self, now: float, since: float | None) -> list:
        out = []
        for begun, ended, script in self.starts:
            for offset, message in script:
                at = begun + offset
                if at <= now and (ended is None or at <= ended) and (since is None or at >= since):
                    out.append("%s %s\n" % (stamp(at), message))
        return out


class Node:
    """One node's Docker engine, as the docker CLI answers for it (the runner the daemon's Docker class calls): the
    head's own, or a worker's behind its forced command (the worker program parses what the guard's ssh sends)."""

    def __init__(self, name: str, clock: Clock, journal: list, script: list, remote: bool = False) -> None:
        self.name = name
        self.clock = clock
        self.journal = journal
        self.container: Container | None = Container(script)
        self.reachable = True
        self.start_rc = 0
        self.remote = remote
        self.refused = []   # the requests its forced command refused
        self.available_kib = 100 * 1024 * 1024     # MemAvailable
        self.after_drop_kib: int | None = None      # what a drop of the page cache brings it to (None: nothing)
        NODES_MADE.append(self)

    def meminfo(self) -> str:
        return "MemTotal:       134217728 kB\nMemFree:         1024 kB\nMemAvailable:   %d kB\n" % self.available_kib

    def drop_caches(self) -> None:
        self.journal.append((self.clock.now, self.name, ("drop-caches",)))
        if self.after_drop_kib is not None:
            self.available_kib = self.after_drop_kib

    def __call__(self, argv: list, timeout: float) -> tuple:
        assert timeout > 0
        if self.remote:
            assert argv[:-1] == [prog.SSH, "-F", SSH_CONFIG, G.ssh_alias(self.name)], argv
            if not self.reachable:
                return 255, "", "ssh: connect to host %s port 22: No route to host\n" % self.name
            try:   # what sshd hands the forced command as SSH_ORIGINAL_COMMAND: the ssh client's one argument
                args = worker_program.parse_request(argv[-1], CONTAINER)
            except worker_program.Refused as exc:
                self.refused.append(argv[-1])
                return worker_program.EXIT_REFUSED, "", "dgxspark-guard-worker: refused: %s\n" % exc
        else:
            assert argv[0] == "docker", argv
            args = list(argv[1:])
        if args == ["meminfo"]:
            return 0, self.meminfo(), ""
        if args == ["drop-caches"]:
            self.drop_caches()
            return 0, "", ""
        self.journal.append((self.clock.now, self.name, tuple(args)))
        if not self.reachable:
            return 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
        verb, name = args[0], args[-1]
        box = self.container if name == CONTAINER else None
        if box is None:
            return 1, "", "Error response from daemon: No such container: %s" % name
        now = self.clock.now
        if verb == "inspect":
            assert args[1] == "--format" and len(args) == 4
            if args[2] == "{{json .State}}":
                state = {"Status": "running" if box.running else "exited", "Running": box.running, "Paused": box.paused,
                         "StartedAt": box.started_at, "ExitCode": box.exit_code}
                return 0, json.dumps(state) + "\n", ""
            if args[2] == "{{json .Config.Env}}":
                return 0, json.dumps(box.env) + "\n", ""
        elif verb == "start" and len(args) == 2:
            if self.start_rc:
                return self.start_rc, "", "Error response from daemon: failed to create task: no space left on device"
            if not box.running:
                box.start(now)
            return 0, name + "\n", ""
        elif verb == "stop" and args[1] == "--time" and len(args) == 4:
            int(args[2])
            if box.paused:
                return 1, "", "Error response from daemon: cannot stop container: %s is paused" % name
            if box.running and not box.ignores_stop:
                box.end(now, 0)
            return 0, name + "\n", ""
        elif verb == "kill" and len(args) == 2:
            if not box.running:
                return 1, "", "Error response from daemon: container %s is not running" % name
            box.end(now, 137)
            return 0, name + "\n", ""
        elif verb == "unpause" and len(args) == 2:
            box.paused = False
            return 0, name + "\n", ""
        elif verb == "logs" and args[1] == "--timestamps":
            since = None
            if args[2] == "--since":
                since = unstamp(args[3])
                assert len(args) == 5
            else:
                assert len(args) == 3
            return 0, "".join(box.log_lines(now, since)), ""
        raise AssertionError("unexpected docker command %r" % argv)

    # what happens to the node behind the guard's back
    def crash(self, exit_code: int = 1) -> None:
        self.container.end(self.clock.now, exit_code)


class FakeProbe:
    """The ApiProbe's interface the Guard uses, without HTTP."""

    def __init__(self) -> None:
        self.failing_since = None
        self.detail = ""
        self.answers = []       # (ok, detail) for the next serves() calls; then ok
        self.calls = []
        self.paused = False

    def serves(self):
        self.calls.append("serves")
        return self.answers.pop(0) if self.answers else (True, "ok")

    def pause(self):
        self.calls.append("pause")
        self.failing_since, self.detail, self.paused = None, "", True

    def resume(self, answered=False):
        self.calls.append("resume(answered)" if answered else "resume")
        self.failing_since, self.detail, self.paused = None, "", False

    def hold(self):
        if not self.paused:
            self.pause()

    def watch(self):
        if self.paused:
            self.resume()

    def snapshot(self):
        return self.failing_since, self.detail


def tcp_table(peers) -> str:
    """/proc/net/tcp with an ESTABLISHED connection from the head to each peer."""
    rows = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    for i, peer in enumerate(peers):
        remote = ipaddress.ip_address(peer).packed[::-1].hex().upper()
        rows.append("  %d: 0B014D0A:7531 %s:%04X 01 00000000:00000000 00:00000000 00000000 0 0 %d" % (i, remote, 40000 + i, i))
    return "\n".join(rows) + "\n"


class Rig:
    """A head and two workers whose containers serve, a fake clock, and a Guard built on them."""

    def __init__(self, tmp_path: Path, **tunables) -> None:
        self.clock = Clock()
        self.journal = []
        self.tcp = tcp_table([CX7[W1], CX7[W2]])
        self.nodes = {HEAD: Node(HEAD, self.clock, self.journal, HEAD_SCRIPT),
                      W1: Node(W1, self.clock, self.journal, WORKER_SCRIPT, remote=True),
                      W2: Node(W2, self.clock, self.journal, WORKER_SCRIPT, remote=True)}
        for name in (W1, W2, HEAD):       # the launch: workers, then the head; the group serves at T0
            self.nodes[name].container.start(self.clock.now - 600)
        self.doc = {
            "container": CONTAINER,
            "ranks": [{"name": HEAD, "role": "head", "ssh_host": "", "cx7_ip": CX7[HEAD]}] + [
                {"name": w, "role": "worker", "ssh_host": G.ssh_alias(w), "cx7_ip": CX7[w]} for w in (W1, W2)],
            "api_url": "http://127.0.0.1:8000",
            "served_model_name": "glm",
            "state_path": str(tmp_path / "lib" / "state.json"),
            "maintenance_path": str(tmp_path / "run" / "guard-maintenance.json"),
            "poll_seconds": 1,
        }
        self.doc.update(tunables)
        self.config = G.parse_config(self.doc)
        self.guard = self.new_guard()
        self.probe = FakeProbe()
        self.guard.probe = self.probe

    def new_guard(self):
        guard = prog.Guard(self.config, docker_factory=lambda rank, **kw: prog.Docker(rank, runner=self.nodes[rank.name], **kw),
                           clock=self.clock, sleep=self.clock.sleep, proc_net_tcp=lambda: self.tcp)
        head, node = guard.nodes[HEAD], self.nodes[HEAD]
        head.meminfo = lambda: (node.meminfo(), "")         # the head reads its own /proc/meminfo
        head.drop_caches = node.drop_caches
        return guard

    @property
    def state(self) -> G.GuardState:
        return self.guard.files.state

    def saved(self) -> dict:
        return json.loads(Path(self.config.state_path).read_text(encoding="utf-8"))

    def box(self, name: str) -> Container:
        return self.nodes[name].container

    def mark(self) -> int:
        return len(self.journal)

    def actions(self, since: int = 0) -> list:
        """(node, verb) of the commands that change a container, in the order they ran."""
        return [(node, args[0]) for _t, node, args in self.journal[since:] if args[0] in MUTATING]

    def commands(self, node: str, since: int = 0) -> list:
        return [args for _t, name, args in self.journal[since:] if name == node]

    def running(self) -> dict:
        return {name: node.container.running for name, node in self.nodes.items() if node.container}

    def lock(self, holder: str = "staging.yml", ttl: float = 3600) -> None:
        path = Path(self.config.maintenance_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(G.maintenance_document(holder, self.clock.now, ttl)), encoding="utf-8")


@pytest.fixture(autouse=True)
def no_request_refused():
    """Every request a test's guard sent to a worker was one the worker's forced command runs."""
    NODES_MADE.clear()
    yield
    assert {node.name: node.refused for node in NODES_MADE if node.refused} == {}


@pytest.fixture(name="rig")
def rig_fixture(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path)
    assert rig.guard.tick() == "ok"     # takes the baseline of the serving group
    return rig


def starts(rig, name):
    return [begun for begun, _end, _script in rig.box(name).starts]


# ------------------------------------------------------------------------------------------------ watching

def test_first_tick_takes_the_baseline_and_changes_nothing(rig):
    assert rig.actions() == []
    assert rig.state.status == "armed"
    assert rig.state.baseline == {name: stamp(T0 - 600) for name in (HEAD, W1, W2)}
    assert rig.saved()["baseline"] == rig.state.baseline
    assert rig.guard.tick() == "ok"
    assert rig.actions() == []


# ------------------------------------------------------------------------------------------------ restoring

def test_stopped_worker_restores_the_group_in_order(rig, capsys):
    rig.clock.advance(30)
    rig.nodes[W1].crash(exit_code=1)
    mark = rig.mark()
    broken_at = rig.clock.now
    assert rig.guard.tick() == "restored"

    # stop the head, then the workers (the crashed one needs no stop); start the workers, then the head
    assert rig.actions(mark) == [(HEAD, "stop"), (W2, "stop"), (W1, "start"), (W2, "start"), (HEAD, "start")]
    head = rig.commands(HEAD, mark)
    at = head.index(("stop", "--time", "10", CONTAINER))      # bounded: checked before and after
    assert head[at - 1] == head[at + 1] == ("inspect", "--format", "{{json .State}}", CONTAINER)
    # a worker whose head is gone does not exit on SIGTERM: killed at once, as the launch does
    assert ("stop", "--time", "0", CONTAINER) in rig.commands(W2, mark)
    # the head started only once both workers' logs showed their rendezvous
    worker_started = starts(rig, W1)[-1]
    assert starts(rig, W2)[-1] == worker_started == broken_at
    head_started = starts(rig, HEAD)[-1]
    assert head_started >= worker_started + WORKER_RENDEZVOUS_AFTER
    for worker in (W1, W2):
        reads = [t for t, node, args in rig.journal[mark:] if node == worker and args[0] == "logs"]
        assert reads and max(reads) <= head_started
        assert ("logs", "--timestamps", "--since", stamp(worker_started), CONTAINER) in rig.commands(worker, mark)
    # the head read its own log since its new start until it served
    assert ("logs", "--timestamps", "--since", stamp(head_started), CONTAINER) in rig.commands(HEAD, mark)
    assert rig.clock.now >= head_started + HEAD_API_UP_AFTER
    assert all(rig.running().values())
    assert rig.probe.calls == ["pause", "serves", "resume(answered)"]
    assert "RESTORE: the serve container on spark2 is not running (exit code 1)" in capsys.readouterr().out


def test_successful_restore_is_recorded_with_a_new_baseline(rig):
    rig.clock.advance(30)
    rig.nodes[W2].crash(exit_code=137)
    old = dict(rig.state.baseline)
    started = rig.clock.now
    assert rig.guard.tick() == "restored"
    last = rig.state.last_restore
    assert last["ok"] is True
    assert (last["kind"], last["rank"]) == ("stopped", W2)
    assert last["started_at"] == started and last["finished_at"] == rig.clock.now
    assert last["duration_seconds"] == round(rig.clock.now - started, 1) >= HEAD_API_UP_AFTER + WORKER_RENDEZVOUS_AFTER
    assert last["baseline"] == {name: rig.box(name).started_at for name in (HEAD, W1, W2)}
    assert rig.state.baseline == last["baseline"] != old
    assert last["phases"][W1]["rendezvous"] == WORKER_RENDEZVOUS_AFTER
    assert last["phases"][HEAD]["api_up"] >= HEAD_API_UP_AFTER
    assert (rig.state.status, rig.state.detail) == ("armed", "restored")
    assert (rig.state.restores_total, rig.state.restores_failed_total) == (1, 0)
    saved = rig.saved()
    assert saved["status"] == "armed" and saved["last_restore"]["ok"] is True and saved["baseline"] == last["baseline"]
    # the new starts are the group's: the next look finds nothing wrong
    mark = rig.mark()
    assert rig.guard.tick() == "ok"
    assert rig.actions(mark) == []


def test_worker_that_never_starts_fails_backs_off_then_gives_up(rig):
    rig.nodes[W2].start_rc = 1
    rig.clock.advance(30)
    rig.nodes[W1].crash(exit_code=1)

    mark = rig.mark()
    assert rig.guard.tick() == "restore_failed"
    # w1 was started before w2 failed: the whole group is stopped again, no rank left running alone
    assert rig.actions(mark) == [(HEAD, "stop"), (W2, "stop"), (W1, "start"), (W2, "start"), (W1, "stop")]
    assert not any(rig.running().values())
    last = rig.state.last_restore
    assert (last["ok"], last["failed_rank"], last["failed_phase"]) == (False, W2, "container_started")
    assert "no space left on device" in last["error"]
    assert last["last_lines"] and "Auto set" in last["last_lines"][-1]          # w2's log before it was stopped
    assert rig.state.status == "backoff" and rig.saved()["status"] == "backoff"

    # backoff: 10 s after the first failure, then 20 s after the second
    for wait, count in ((10, 2), (20, 3)):
        rig.clock.now = rig.state.last_restore["finished_at"] + wait - 1
        mark = rig.mark()
        assert rig.guard.tick() == "backoff"
        assert rig.actions(mark) == []
        assert rig.state.status == "backoff" and rig.state.next_attempt_at == rig.clock.now + 1
        rig.clock.advance(1)
        assert rig.guard.tick() == "restore_failed"
        assert rig.state.restores_failed_total == count
        assert not any(rig.running().values())

    # the third failure in the window: give up, and say where and why
    mark = rig.mark()
    assert rig.guard.tick() == "gave_up"
    assert rig.actions(mark) == []
    assert rig.state.status == "gave_up"
    reason = rig.state.gave_up["reason"]
    assert reason.startswith("3 restores failed within 3600 s; the last one failed at spark3 in phase container_started: ")
    assert "no space left on device" in reason
    assert rig.saved()["gave_up"]["reason"] == reason

    # and does nothing more, not even a look
    mark = rig.mark()
    for _tick in range(3):
        rig.clock.advance(1000)
        assert rig.guard.tick() == "gave_up"
    assert rig.journal[mark:] == []


def test_hung_worker_start_fails_on_its_rendezvous_budget(tmp_path, monkeypatch):
    """The new start logs nothing: its old start's rendezvous line must not count (docker logs --since)."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, budgets={"rendezvous": 20})
    assert rig.guard.tick() == "ok"
    rig.box(W1).script = []
    rig.nodes[W1].crash()
    started = rig.clock.now
    assert rig.guard.tick() == "restore_failed"
    last = rig.state.last_restore
    assert (last["failed_rank"], last["failed_phase"]) == (W1, "container_started")
    assert "phase 'rendezvous' not reached within its budget of 20 s" in last["error"]
    assert 20 < rig.clock.now - started <= 22
    assert not any(rig.running().values())
    assert (HEAD, "start") not in rig.actions()


def test_head_that_does_not_answer_fails_on_api_up(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, budgets={"api_up": 30})
    assert rig.guard.tick() == "ok"
    rig.probe.answers = [(False, "POST /v1/completions (1 token): 500 after 0 s")] * 1000
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restore_failed"
    last = rig.state.last_restore
    assert (last["failed_rank"], last["failed_phase"]) == (HEAD, "api_up")
    assert last["error"] == "the head does not answer a completion: POST /v1/completions (1 token): 500 after 0 s"
    assert 30 < rig.clock.now - last["started_at"] - WORKER_RENDEZVOUS_AFTER - HEAD_API_UP_AFTER <= 32   # the api_up budget
    assert not any(rig.running().values())
    assert rig.probe.calls[0] == "pause" and rig.probe.calls[-1] == "resume"     # not answered


def test_head_whose_log_stops_mid_load_fails_as_stalled(tmp_path, monkeypatch):
    """Budgets far away; the stall timeout (launch_stall_seconds) ends the restore, naming the head."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, stall_seconds=6, budgets={"weights_loaded": 900, "kv_allocated": 900, "api_up": 900})
    assert rig.guard.tick() == "ok"
    rig.box(HEAD).script = [line for line in HEAD_SCRIPT if "world_size=" in line[1] or line[0] < 3]
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restore_failed"
    last = rig.state.last_restore
    assert last["failed_rank"] == HEAD
    assert last["error"].startswith("stalled: no progress for 7 s (stall timeout 6 s) in phase rendezvous")
    assert rig.clock.now - last["started_at"] < 60          # not the 900 s budgets
    assert not any(rig.running().values())


def test_a_restore_writes_each_waiting_rank_s_progress_to_the_journal(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, progress_seconds=2)
    assert rig.guard.tick() == "ok"
    capsys.readouterr()
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    out = capsys.readouterr().out
    # the head takes about 10 s to serve: a line every 2 s while it waits, each with the phase it reached
    head_lines = [line for line in out.splitlines() if f"restore: {HEAD}: phase " in line]
    assert len(head_lines) >= 3
    assert "phase container_started" in head_lines[0] and "phase kv_allocated" in head_lines[-1]


def test_without_a_stall_timeout_a_quiet_head_waits_for_its_budget(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, budgets={"weights_loaded": 40})
    assert rig.guard.tick() == "ok"
    rig.box(HEAD).script = [line for line in HEAD_SCRIPT if "world_size=" in line[1] or line[0] < 3]
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restore_failed"
    assert "phase 'weights_loaded' not reached within its budget of 40 s" in rig.state.last_restore["error"]


def test_head_whose_peers_never_connect_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, peer_grace_seconds=3)
    assert rig.guard.tick() == "ok"
    rig.tcp = tcp_table([CX7[W1]])       # w2's engine never connects to the head
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restore_failed"
    last = rig.state.last_restore
    assert last["failed_rank"] == HEAD
    assert "peer 10.77.1.13 never connected" in last["error"]


def kill_when(rig, at: float, name: str, what: str = "crash"):
    """Make `name`'s container die (or be paused) once the fake clock reaches `at`, while the guard sleeps."""
    sleep = rig.guard.sleep
    done = []

    def sleep_then(seconds):
        sleep(seconds)
        if not done and rig.clock.now >= at:
            done.append(rig.clock.now)
            if what == "crash":
                rig.nodes[name].crash(exit_code=137)
            else:
                rig.box(name).paused = True

    rig.guard.sleep = sleep_then
    return done


@pytest.mark.parametrize("what, why", [("crash", "died during the restore (exit code 137)"),
                                       ("pause", "is paused (docker pause) during the restore")])
def test_a_worker_lost_after_its_rendezvous_ends_the_restore_at_once(tmp_path, monkeypatch, what, why):
    """The head waits for every rank (peer grace 30 s): the worker's death is seen at the next poll, not then."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, peer_grace_seconds=30)
    assert rig.guard.tick() == "ok"
    rig.nodes[W1].crash()
    # the workers reach their rendezvous 2 s after their start, the head is started then and serves 10 s later
    died = kill_when(rig, rig.clock.now + WORKER_RENDEZVOUS_AFTER + 4, W2, what)
    mark = rig.mark()
    assert rig.guard.tick() == "restore_failed"
    last = rig.state.last_restore
    assert (last["ok"], last["failed_rank"], last["failed_phase"]) == (False, W2, "api_up")
    assert last["error"] == "the serve container on %s %s" % (W2, why)
    assert rig.clock.now - died[0] <= rig.config.poll_seconds
    assert rig.state.restores_failed_total == 1
    assert not any(rig.running().values())                       # the group stopped: no rank left alone
    assert not rig.box(W2).paused
    assert rig.actions(mark)[-2:] == [(HEAD, "stop"), (W1, "stop")] if what == "crash" else \
        rig.actions(mark)[-4:] == [(HEAD, "stop"), (W1, "stop"), (W2, "unpause"), (W2, "stop")]


def test_backoff_writes_one_journal_line_per_change_not_per_look(rig, capsys):
    """The head frozen soon after a restore: the API's reason moves every look, the journal gets one line."""
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    rig.clock.advance(2)
    capsys.readouterr()
    rig.probe.failing_since, rig.probe.detail = rig.clock.now - 60, "GET /health: timed out"
    for _look in range(4):
        assert rig.guard.tick() == "backoff"
        rig.clock.advance(1)
    lines = [line for line in capsys.readouterr().out.splitlines() if "backing off" in line]
    assert len(lines) == 1 and "the head's API has been failing for 60 s" in lines[0]
    assert rig.state.status == "backoff" and rig.saved()["status"] == "backoff"
    rig.clock.advance(5)
    assert rig.guard.tick() == "restored"


def test_a_restore_after_a_long_healthy_run_starts_without_backoff(tmp_path, monkeypatch):
    """A backoff (100 s) longer than the run that makes a restore stable (60 s): a success sets no backoff."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, stable_seconds=60, backoff_seconds=100)
    assert rig.guard.tick() == "ok"
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    rig.clock.advance(rig.config.stable_seconds)          # served that long: the restore held
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    assert rig.state.restores_total == 2 and rig.state.restores_failed_total == 0
    assert not rig.state.attempts[0].get("unstable")


def test_a_group_that_breaks_again_soon_after_a_restore_counts_as_failed(rig):
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    rig.clock.advance(3)                                   # not stable yet (600 s)
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "backoff"                   # one failure: backoff_seconds after the restore
    assert rig.state.attempts[-1]["unstable"] is True and rig.state.attempts[-1]["served_seconds"] == 3
    assert rig.state.next_attempt_at == rig.state.attempts[-1]["finished_at"] + rig.config.backoff_seconds
    rig.clock.advance(rig.config.backoff_seconds)
    assert rig.guard.tick() == "restored"


GIB = 1024 * 1024


def test_a_good_restore_records_each_nodes_memory_before_its_start(rig):
    rig.nodes[W1].available_kib = 118 * GIB
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    assert rig.state.last_restore["memory_before_start"] == {W1: 118 * GIB, W2: 100 * GIB, HEAD: 100 * GIB}
    assert rig.state.memory_reference == {W1: 118 * GIB, W2: 100 * GIB, HEAD: 100 * GIB}
    assert rig.saved()["memory_reference"][W1] == 118 * GIB


def test_memory_that_does_not_come_back_gives_up_naming_the_node(rig, capsys):
    rig.nodes[W1].available_kib = 118 * GIB
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    rig.clock.advance(rig.config.stable_seconds)
    rig.nodes[W1].available_kib = 61 * GIB           # a leak: what the last start held was not given back
    rig.nodes[W1].crash()
    mark = rig.mark()
    began = rig.clock.now
    assert rig.guard.tick() == "gave_up"
    # the group stopped, the page cache of that node dropped, nothing started
    assert rig.actions(mark) == [(HEAD, "stop"), (W2, "stop")]
    assert (W1, ("drop-caches",)) in [(node, args) for _t, node, args in rig.journal[mark:]]
    assert not any(rig.running().values())
    assert rig.config.memory_wait_seconds <= rig.clock.now - began <= rig.config.memory_wait_seconds + 2
    why = ("memory not released on spark2: 61 GiB available, 118 GiB at the last good start (at least 106 GiB "
           "needed, guard_memory_margin_percent 10)")
    assert rig.state.status == "gave_up" and rig.state.gave_up["reason"] == why
    assert rig.state.gave_up["finding"]["kind"] == "memory" and "free the node's memory" in rig.state.gave_up["fix"]
    assert rig.state.last_restore["memory"] == {"node": W1, "available_kib": 61 * GIB, "reference_kib": 118 * GIB}
    assert "GAVE UP: " + why in capsys.readouterr().out
    mark = rig.mark()
    rig.clock.advance(100)
    assert rig.guard.tick() == "gave_up" and rig.journal[mark:] == []     # no loop


def test_memory_back_after_the_page_cache_is_dropped_restores(rig):
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    rig.clock.advance(rig.config.stable_seconds)
    rig.nodes[HEAD].available_kib = 50 * GIB
    rig.nodes[HEAD].after_drop_kib = 95 * GIB
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    assert rig.state.memory_reference[HEAD] == 95 * GIB


def test_api_failing_past_grace_restores(rig):
    rig.probe.failing_since, rig.probe.detail = rig.clock.now - 59, "GET /health: 503"
    assert rig.guard.tick() == "ok"
    rig.clock.advance(1)
    assert rig.guard.tick() == "restored"
    assert rig.state.last_restore["kind"] == "api" and rig.state.last_restore["rank"] == HEAD
    assert rig.actions()[:3] == [(HEAD, "stop"), (W1, "stop"), (W2, "stop")]


def test_worker_restarted_alone_restores_the_group(rig):
    rig.clock.advance(100)
    rig.nodes[W2].crash()
    rig.box(W2).start(rig.clock.now)     # Docker's restart policy brought it back alone
    assert rig.guard.tick() == "restored"
    assert rig.state.last_restore["kind"] == "restarted" and rig.state.last_restore["rank"] == W2
    assert rig.actions()[:3] == [(HEAD, "stop"), (W1, "stop"), (W2, "stop")]


def test_paused_head_is_unpaused_before_it_is_stopped(rig):
    rig.box(HEAD).paused = True
    rig.nodes[W1].crash()
    mark = rig.mark()
    assert rig.guard.tick() == "restored"
    verbs = [args[0] for args in rig.commands(HEAD, mark)]
    assert verbs.count("unpause") == 1
    at = verbs.index("unpause")
    assert verbs[at - 1:at + 3] == ["inspect", "unpause", "stop", "inspect"]
    assert not rig.box(HEAD).paused
    assert (HEAD, "kill") not in rig.actions(mark)


def test_head_that_ignores_sigterm_is_killed(rig):
    rig.box(HEAD).ignores_stop = True
    rig.nodes[W1].crash()
    mark = rig.mark()
    assert rig.guard.tick() == "restored"
    assert rig.actions(mark)[:3] == [(HEAD, "stop"), (HEAD, "kill"), (W2, "stop")]


def test_absent_container_gives_up_at_once(rig):
    rig.nodes[W1].container = None
    mark = rig.mark()
    assert rig.guard.tick() == "gave_up"
    assert rig.actions(mark) == []
    assert rig.state.status == "gave_up"
    assert "is gone from spark2" in rig.state.gave_up["reason"]


def test_unreachable_node_is_waited_for_then_given_up(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, node_wait_seconds=60)
    assert rig.guard.tick() == "ok"
    rig.nodes[W2].reachable = False
    assert rig.guard.tick() == "wait_nodes"
    assert rig.state.status == "waiting_nodes" and "No route to host" in rig.state.detail
    rig.clock.advance(60)
    assert rig.guard.tick() == "wait_nodes"
    rig.clock.advance(1)
    assert rig.guard.tick() == "gave_up"
    assert "(waited 61 s)" in rig.state.gave_up["reason"]
    assert rig.actions() == []


def test_node_back_in_time_is_fine(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    rig = Rig(tmp_path, node_wait_seconds=60)
    assert rig.guard.tick() == "ok"
    rig.nodes[W2].reachable = False
    assert rig.guard.tick() == "wait_nodes"
    rig.clock.advance(50)
    rig.nodes[W2].reachable = True
    assert rig.guard.tick() == "ok"
    assert rig.state.status == "armed"
    rig.nodes[W2].reachable = False
    rig.clock.advance(50)
    assert rig.guard.tick() == "wait_nodes"      # the wait starts again
    rig.clock.advance(50)
    assert rig.guard.tick() == "wait_nodes"


# ------------------------------------------------------------------------------------------------ maintenance

def test_maintenance_lock_holds_the_guard_then_release_resumes(rig):
    rig.lock("staging.yml")
    rig.nodes[W1].crash()
    mark = rig.mark()
    for _tick in range(3):
        assert rig.guard.tick() == "maintenance"
        rig.clock.advance(5)
    assert rig.journal[mark:] == []              # not even a look
    assert rig.state.status == "maintenance" and rig.saved()["status"] == "maintenance"
    assert rig.state.maintenance["holder"] == "staging.yml"
    assert rig.probe.calls == ["pause"]
    os.unlink(rig.config.maintenance_path)
    assert rig.guard.tick() == "restored"
    assert rig.actions(mark)[:3] == [(HEAD, "stop"), (W2, "stop"), (W1, "start")]
    assert rig.state.status == "armed" and rig.state.maintenance is None


def test_expired_maintenance_lock_resumes(rig):
    rig.lock("killed run", ttl=60)
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "maintenance"
    rig.clock.advance(60)
    assert rig.guard.tick() == "restored"


def test_maintenance_over_takes_what_serves_as_the_group(rig):
    """Staging restarted every container under the lock: released without an arm, that is the group now."""
    rig.lock()
    assert rig.guard.tick() == "maintenance"
    rig.clock.advance(100)
    for name in (HEAD, W1, W2):
        rig.nodes[name].crash(0)
        rig.box(name).start(rig.clock.now)
    os.unlink(rig.config.maintenance_path)
    mark = rig.mark()
    assert rig.guard.tick() == "ok"
    assert rig.actions(mark) == []
    assert rig.state.baseline == {name: stamp(rig.clock.now) for name in (HEAD, W1, W2)}
    assert (rig.state.status, rig.state.detail) == ("armed", "maintenance over")
    assert rig.saved()["baseline"] == rig.state.baseline


def test_unreadable_maintenance_lock_holds(rig):
    path = Path(rig.config.maintenance_path)
    path.parent.mkdir(parents=True)
    path.write_text("{half a lock", encoding="utf-8")
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "maintenance"
    assert "an unreadable lock file" in rig.state.detail
    assert rig.actions() == []


# ------------------------------------------------------------------------------------------------ arm, disarm

def test_arm_refuses_when_a_rank_is_not_running(rig):
    rig.lock("launch.yml")
    rig.nodes[W1].crash(3)
    rig.nodes[W2].container = None
    before = Path(rig.config.state_path).read_text(encoding="utf-8")
    with pytest.raises(RuntimeError) as info:
        rig.guard.arm("launch.yml")
    assert str(info.value) == "cannot arm: spark2: not running; spark3: absent"
    assert os.path.exists(rig.config.maintenance_path)      # still held
    assert Path(rig.config.state_path).read_text(encoding="utf-8") == before


def test_arm_refuses_when_a_node_does_not_answer(rig):
    rig.nodes[W2].reachable = False
    with pytest.raises(RuntimeError, match="cannot arm: spark3: ssh: connect to host spark3 port 22: No route to host"):
        rig.guard.arm("launch.yml")


def test_arm_takes_the_baseline_and_removes_the_lock(rig):
    rig.lock("launch.yml")
    assert rig.guard.tick() == "maintenance"
    rig.clock.advance(100)
    for name in (W1, W2, HEAD):      # the launch recreated the group
        rig.nodes[name].crash(0)
        rig.box(name).start(rig.clock.now)
    result = rig.guard.arm("launch.yml")
    new = {name: stamp(rig.clock.now) for name in (HEAD, W1, W2)}
    assert result == {"changed": True, "status": "armed", "baseline": new}
    assert not os.path.exists(rig.config.maintenance_path)
    saved = rig.saved()
    assert (saved["status"], saved["detail"], saved["baseline"]) == ("armed", "armed by launch.yml", new)
    assert rig.guard.arm("launch.yml")["changed"] is False
    mark = rig.mark()
    assert rig.guard.tick() == "ok"
    assert rig.actions(mark) == []


def test_arm_after_failed_restores_forgets_them_for_good(rig):
    """A launch that changes nothing still resets the window: the running guard must see the reset."""
    rig.nodes[W2].start_rc = 1
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restore_failed"
    rig.nodes[W2].start_rc = 0
    rig.clock.advance(10)
    assert rig.guard.tick() == "restored"
    assert rig.state.status == "armed"
    assert [a.get("window_reset") for a in rig.state.attempts] == [None, None]
    other = rig.new_guard()                   # the arm sub-command: another process, same files, same containers
    assert other.arm("launch.yml") == {"changed": True, "status": "armed", "baseline": rig.state.baseline}
    assert other.arm("launch.yml")["changed"] is False
    assert rig.guard.tick() == "ok"
    assert len(rig.state.attempts) == 2 and all(a["window_reset"] for a in rig.state.attempts)
    assert G.failed_in_window(rig.state, rig.config, rig.clock.now) == []


def test_disarm_then_ticks_do_nothing(rig):
    assert rig.guard.disarm("teardown.yml") == {"changed": True, "status": "disarmed"}
    assert rig.saved()["status"] == "disarmed"
    assert rig.guard.disarm("teardown.yml") == {"changed": False, "status": "disarmed"}
    rig.nodes[W1].crash()
    mark = rig.mark()
    for _tick in range(3):
        rig.clock.advance(10)
        assert rig.guard.tick() == "disarmed"
    assert rig.journal[mark:] == []


def test_arm_by_another_process_is_picked_up_by_tick(rig):
    rig.nodes[W1].container = None
    assert rig.guard.tick() == "gave_up"
    rig.probe.calls.clear()
    # the launch recreates the container and arms the guard through the `arm` sub-command (another process)
    rig.clock.advance(300)
    rig.nodes[W1].container = Container(WORKER_SCRIPT)
    rig.box(W1).start(rig.clock.now)
    other = rig.new_guard()
    assert other.arm("launch.yml")["changed"] is True
    assert rig.state.status == "gave_up"          # the running guard has not looked yet
    assert rig.guard.tick() == "ok"
    assert (rig.state.status, rig.state.detail) == ("armed", "armed by launch.yml")
    assert rig.state.gave_up is None
    assert rig.state.baseline[W1] == stamp(rig.clock.now)
    assert rig.probe.calls == ["resume"]


def test_the_probe_asks_only_while_the_guard_watches(rig):
    # disarmed (a guard the launch starts while the ranks load, before its arm): the head's API is not asked
    rig.new_guard().disarm("teardown.yml")
    assert rig.guard.tick() == "disarmed"
    assert rig.probe.paused and rig.probe.calls[-1] == "pause"
    rig.probe.calls.clear()
    assert rig.guard.tick() == "disarmed"
    assert rig.probe.calls == []                 # held, not paused again (its state is not reset every tick)
    # a lock taken before the guard started: it holds the probe though the state says maintenance already
    rig.new_guard().arm("launch.yml")
    rig.lock("launch.yml")
    fresh = rig.new_guard()
    fresh.probe = FakeProbe()
    assert fresh.tick() == "maintenance"
    fresh.probe.calls.clear()
    assert fresh.files.state.status == "maintenance"
    restarted = rig.new_guard()                  # the service restarted during the maintenance
    restarted.probe = FakeProbe()
    assert restarted.tick() == "maintenance"
    assert restarted.probe.paused and restarted.probe.calls == ["pause"]
    # the lock released by the arm: the probe asks again
    restarted.arm("launch.yml")
    assert restarted.tick() == "ok"
    assert not restarted.probe.paused


def test_the_service_starts_its_probe_paused(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    started = []
    monkeypatch.setattr(prog.ApiProbe, "start", lambda self: started.append(self._paused.is_set()))
    rig = Rig(tmp_path)
    guard = rig.new_guard()
    guard.stopping.set()                         # one pass: serve() returns after starting the probe
    assert guard.serve() == prog.EXIT_OK
    assert started == [True]


def test_disarm_by_another_process_is_picked_up_by_tick(rig):
    rig.new_guard().disarm("teardown.yml")
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "disarmed"
    assert rig.actions() == []


# ------------------------------------------------------------------------------------------------ Docker, files

def test_docker_inspect_answers(rig):
    docker = rig.guard.nodes[W1]
    assert docker.inspect(CONTAINER) == G.RankObservation(W1, running=True, started_at=stamp(T0 - 600), exit_code=0)
    assert rig.guard.nodes[HEAD].inspect("other") == G.RankObservation(HEAD, exists=False)
    rig.nodes[W1].reachable = False
    obs = docker.inspect(CONTAINER)
    assert (obs.reachable, obs.exists) == (False, False) and "No route to host" in obs.error


def test_a_request_the_worker_refuses_is_an_unreachable_docker_naming_the_refusal(rig):
    obs = rig.guard.nodes[W1].inspect("other")
    assert obs == G.RankObservation(W1, reachable=False, exists=False, error=(
        "dgxspark-guard-worker: refused: this key acts on the serve container vllm_glm53 only, not on 'other'"))
    # the workers' containers' environment (the API key, the HF token) is not to be read through the guard's key:
    # the guard reads the key from the head's own container only
    assert rig.guard.nodes[W1].env_value(CONTAINER, "VLLM_API_KEY") is None
    assert rig.nodes[W1].refused == ["inspect --format '{{json .State}}' other",
                                     "inspect --format '{{json .Config.Env}}' vllm_glm53"]
    rig.nodes[W1].refused.clear()


def test_the_head_runs_docker_and_a_worker_is_asked_through_its_forced_command():
    head = prog.Docker(G.Rank(HEAD, "head", "", CX7[HEAD]))
    worker = prog.Docker(G.Rank(W1, "worker", G.ssh_alias(W1), CX7[W1]), ssh_config="/etc/g/ssh_config")
    args = ["inspect", "--format", "{{json .State}}", CONTAINER]
    assert head.argv(args) == ["docker"] + args
    assert worker.argv(args) == ["/usr/bin/ssh", "-F", "/etc/g/ssh_config", "dgxspark-guard-spark2",
                                 "inspect --format '{{json .State}}' vllm_glm53"]
    assert prog.Docker(G.Rank(W1, "worker", "a", "")).ssh_config == "/etc/dgxspark/guard/ssh_config"


def test_every_operation_of_the_guard_is_one_the_worker_runs_with_the_same_argv():
    """Each docker command the guard's Docker class sends to a worker reaches docker there with exactly its argv."""
    sent = []

    def runner(argv, timeout):
        sent.append(argv)
        if "--format" in argv[-1]:
            return 0, json.dumps({"Running": len(sent) < 5, "Paused": len(sent) == 1, "StartedAt": stamp(T0)}), ""
        return 0, "", ""

    docker = prog.Docker(G.Rank(W1, "worker", G.ssh_alias(W1), CX7[W1]), runner=runner)
    docker.stop(CONTAINER, 0)             # inspect (paused), unpause, stop, inspect (running), kill, inspect
    docker.start(CONTAINER)
    docker.logs(CONTAINER)
    docker.logs(CONTAINER, since=stamp(T0))
    through = []
    for argv in sent:
        assert argv[:4] == [prog.SSH, "-F", SSH_CONFIG, G.ssh_alias(W1)] and len(argv) == 5
        through.append(worker_program.parse_request(argv[4], CONTAINER))
    assert through == [
        ["inspect", "--format", "{{json .State}}", CONTAINER],
        ["unpause", CONTAINER],
        ["stop", "--time", "0", CONTAINER],
        ["inspect", "--format", "{{json .State}}", CONTAINER],
        ["kill", CONTAINER],
        ["inspect", "--format", "{{json .State}}", CONTAINER],
        ["start", CONTAINER],
        ["logs", "--timestamps", CONTAINER],
        ["logs", "--timestamps", "--since", stamp(T0), CONTAINER],
    ]
    assert {argv[0] for argv in through} == set(worker_program.OPERATIONS)   # and the worker allows no other


def test_docker_inspect_unreadable_output():
    rank = G.Rank(W1, "worker", "dgxspark-guard-x", CX7[W1])
    docker = prog.Docker(rank, runner=lambda argv, timeout: (0, "<html>", ""))
    assert docker.inspect(CONTAINER) == G.RankObservation(W1, reachable=False, exists=False, error="unreadable inspect output")
    docker = prog.Docker(rank, runner=lambda argv, timeout: (125, "", ""))
    assert docker.inspect(CONTAINER).error == "docker exit code 125"


def test_docker_env_value(rig):
    docker = rig.guard.nodes[HEAD]
    assert docker.env_value(CONTAINER, "VLLM_API_KEY") == "sekrit"
    assert docker.env_value(CONTAINER, "HF_TOKEN") is None
    assert docker.env_value("other", "VLLM_API_KEY") is None


def test_docker_env_is_the_heads_own_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://elsewhere:2375")
    monkeypatch.setenv("DOCKER_CONTEXT", "elsewhere")
    env = prog.Docker(G.Rank(HEAD, "head", "", CX7[HEAD]))._env()
    assert "DOCKER_HOST" not in env and "DOCKER_CONTEXT" not in env


def test_the_guard_builds_each_nodes_docker_with_its_ssh_config(tmp_path):
    rig = Rig(tmp_path, ssh_config="/etc/g/ssh_config")
    guard = prog.Guard(rig.config)
    assert {name: node.ssh_config for name, node in guard.nodes.items()} == dict.fromkeys((HEAD, W1, W2), "/etc/g/ssh_config")
    assert guard.nodes[W2].argv(["start", CONTAINER]) == [prog.SSH, "-F", "/etc/g/ssh_config", "dgxspark-guard-spark3",
                                                          "start vllm_glm53"]


def test_a_timed_out_request_names_it(monkeypatch):
    def timeout(*_args, **_kwargs):
        raise prog.subprocess.TimeoutExpired("ssh", 30)

    monkeypatch.setattr(prog.subprocess, "run", timeout)
    worker = prog.Docker(G.Rank(W1, "worker", G.ssh_alias(W1), CX7[W1]))
    assert worker.run("start", CONTAINER) == (124, "", "ssh dgxspark-guard-spark2 start vllm_glm53 timed out after 30 s")
    head = prog.Docker(G.Rank(HEAD, "head", "", CX7[HEAD]))
    assert head.run("start", CONTAINER, timeout=120) == (124, "", "docker start vllm_glm53 timed out after 120 s")


def test_state_file_survives_a_new_guard(rig):
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    again = rig.new_guard()
    assert again.files.state == rig.state


def test_status_document(rig):
    rig.lock("site.yml")
    doc = prog.status_document(rig.config, rig.clock.now)
    assert doc["state"]["status"] == "maintenance" and doc["gave_up"] is False
    assert doc["summary"].startswith("IN MAINTENANCE (held by site.yml")
    os.unlink(rig.config.state_path)
    assert prog.status_document(rig.config, rig.clock.now)["state"] is None


# ------------------------------------------------------------------------------------------------ the API probe

class _Api(http.server.BaseHTTPRequestHandler):
    """The head's API: answers from server.answers by path, every request recorded in server.seen."""

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def _answer(self, body):
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        status, text = self.server.answers.get(self.path, (404, "not found"))
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):   # pylint: disable=arguments-differ
        pass


def _serving(handler, **attributes):
    """A real HTTP server on 127.0.0.1 (a free port) with `attributes` set on it, served from a thread until the
    generator is closed: the body of a server fixture."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(name="api")
def api_fixture(monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")     # the probe must never go through a proxy
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    yield from _serving(_Api, seen=[], answers={})


def api_probe(tmp_path, port):
    rig = Rig(tmp_path, api_url="http://127.0.0.1:%d" % port, probe_timeout_seconds=5)
    return rig, prog.ApiProbe(rig.config, rig.guard.nodes[HEAD], clock=rig.clock)


METRICS_TEXT = (ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32.0-cpu-lab-captured.2.txt").read_text(encoding="utf-8")


def test_api_probe_asks_health_a_completion_and_metrics_with_the_key(tmp_path, api):
    api.answers = {"/health": (200, ""), "/v1/completions": (200, '{"choices": []}'), "/metrics": (200, METRICS_TEXT)}
    _rig, probe = api_probe(tmp_path, api.server_address[1])
    assert probe.probe_once() == (True, True, "ok", 8.0)
    assert api.seen == [
        ("GET", "/health", "Bearer sekrit", None),
        ("POST", "/v1/completions", "Bearer sekrit", {"model": "glm", "prompt": "1", "max_tokens": 1, "temperature": 0}),
        ("GET", "/metrics", "Bearer sekrit", None),
    ]
    assert probe.serves() == (True, "ok")


def test_api_probe_health_failing_stops_there(tmp_path, api):
    api.answers = {"/health": (503, "")}
    _rig, probe = api_probe(tmp_path, api.server_address[1])
    assert probe.probe_once() == (False, False, "GET /health: 503", None)
    assert [path for _c, path, _a, _b in api.seen] == ["/health"]
    assert probe.serves() == (False, "GET /health: 503")


def test_api_probe_failed_completion_still_reads_progress(tmp_path, api):
    api.answers = {"/health": (200, ""), "/v1/completions": (500, "boom")}
    _rig, probe = api_probe(tmp_path, api.server_address[1])
    health, ok, detail, progress = probe.probe_once()
    assert (health, ok, progress) == (True, False, None)        # /metrics answered 404: no progress
    assert detail.startswith("POST /v1/completions (1 token): 500 after ") and detail.endswith(" s")
    assert probe.serves()[0] is False


def test_api_probe_rereads_the_key_after_a_401(tmp_path, api):
    api.answers = {"/health": (200, ""), "/v1/completions": (200, "{}")}
    rig, probe = api_probe(tmp_path, api.server_address[1])
    assert probe.probe_once()[:3] == (True, True, "ok")
    rig.box(HEAD).env = ["VLLM_API_KEY=rotated"]       # the launch recreated the head with another key
    api.answers["/v1/completions"] = (401, "")
    api.seen.clear()
    assert probe.probe_once()[:2] == (True, False)
    assert [(path, auth) for _c, path, auth, _b in api.seen] == [
        ("/health", "Bearer sekrit"), ("/v1/completions", "Bearer sekrit"), ("/metrics", "Bearer rotated")]
    api.answers["/v1/completions"] = (200, "{}")
    api.seen.clear()
    assert probe.probe_once()[:3] == (True, True, "ok")
    assert {auth for _c, _p, auth, _b in api.seen} == {"Bearer rotated"}


def test_api_probe_without_a_key_sends_none(tmp_path, api):
    api.answers = {"/health": (200, ""), "/v1/completions": (200, "{}")}
    rig, probe = api_probe(tmp_path, api.server_address[1])
    rig.box(HEAD).env = ["PATH=/usr/bin"]
    assert probe.probe_once()[:3] == (True, True, "ok")
    assert {auth for _c, _p, auth, _b in api.seen} == {None}


def test_api_probe_connection_refused(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _rig, probe = api_probe(tmp_path, port)
    health, ok, detail, progress = probe.probe_once()
    assert (health, ok, progress) == (False, False, None)
    assert detail.startswith("GET /health: ") and "refused" in detail


def _run_once(probe, answer):
    """One pass of the probe thread's loop, on this thread."""
    def once():
        probe.stop()
        return answer
    probe.probe_once = once
    probe.run()


def test_api_probe_loop_judges_failures_only_after_a_first_answer(tmp_path):
    rig, probe = api_probe(tmp_path, 9)
    _run_once(probe, (True, False, "timed out", 5.0))
    assert probe.snapshot() == (None, "")                     # warming: never answered since the start
    probe.resume(answered=True)                               # a restore just saw a completion
    probe._stop.clear()                                       # pylint: disable=protected-access
    _run_once(probe, (True, False, "timed out", 5.0))
    assert probe.snapshot() == (rig.clock.now, "timed out")
    probe.pause()
    assert probe.snapshot() == (None, "")
    probe.resume()
    assert probe.snapshot() == (None, "")


def test_maintenance_taken_during_a_restore_hands_the_cluster_over(rig, capsys):
    rig.clock.advance(30)
    rig.nodes[W1].crash(exit_code=1)
    sleep = rig.guard.sleep

    def sleep_then_lock(seconds):   # a launch takes the lock while the workers load
        sleep(seconds)
        if not Path(rig.config.maintenance_path).exists():
            rig.lock("Launch vLLM")

    rig.guard.sleep = sleep_then_lock
    mark = rig.mark()
    assert rig.guard.tick() == "handed_over"
    # the workers were started, the head was not, and nothing was stopped again after the hand-over
    assert rig.actions(mark) == [(HEAD, "stop"), (W2, "stop"), (W1, "start"), (W2, "start")]
    assert rig.state.restores_total == 0 and rig.state.attempts == []
    assert "restore handed over" in capsys.readouterr().out
    assert rig.guard.tick() == "maintenance"
    assert rig.actions(mark) == [(HEAD, "stop"), (W2, "stop"), (W1, "start"), (W2, "start")]


def test_a_launch_that_restarted_nothing_arms_without_a_change(rig):
    """The idempotent re-run: the run's own maintenance lock, the same containers - nothing changed."""
    rig.lock("Launch vLLM")
    assert rig.guard.tick() == "maintenance"
    assert rig.saved()["status"] == "maintenance"
    result = rig.guard.arm("Launch vLLM")
    assert result["changed"] is False and result["status"] == "armed"
    assert not os.path.exists(rig.config.maintenance_path)
    mark = rig.mark()
    assert rig.guard.tick() == "ok"       # the running guard leaves its maintenance by itself
    assert rig.state.status == "armed" and rig.actions(mark) == []


def test_the_head_reads_its_own_meminfo_and_drops_its_own_page_cache(tmp_path):
    head = prog.Docker(G.Rank(HEAD, "head", "", CX7[HEAD]), runner=lambda argv, timeout: pytest.fail(argv))
    head.meminfo_path = str(tmp_path / "meminfo")
    head.drop_caches_path = str(tmp_path / "drop_caches")
    assert head.meminfo()[0] is None
    Path(head.meminfo_path).write_text("MemAvailable: 42 kB\n", encoding="ascii")
    assert head.meminfo() == ("MemAvailable: 42 kB\n", "")
    assert head.drop_caches() is None and Path(head.drop_caches_path).read_text(encoding="ascii") == "3\n"
    head.drop_caches_path = str(tmp_path / "no" / "drop_caches")
    assert "No such file" in head.drop_caches()


def test_the_metrics_endpoint_serves_the_state_file(rig):
    import urllib.request
    rig.nodes[W1].crash()
    assert rig.guard.tick() == "restored"
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    config = G.parse_config(dict(rig.doc, metrics_address="127.0.0.1", metrics_port=port))
    server = prog.start_metrics(config)
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            text = response.read().decode()
        assert "dgxspark_guard_restores_total 1\n" in text and 'dgxspark_guard_status{status="armed"} 1\n' in text
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=5)
        assert info.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_metrics_endpoint_that_cannot_listen_is_logged_not_fatal(rig, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = G.parse_config(dict(rig.doc, metrics_address="127.0.0.1", metrics_port=port))
        assert prog.start_metrics(config) is None
    assert "metrics endpoint on 127.0.0.1:%d not started" % port in capsys.readouterr().out
    assert prog.start_metrics(G.parse_config(rig.doc)) is None      # off


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_real_prometheus_scrapes_the_guard_and_fires_the_give_up_alert(tmp_path):
    """Debian's Prometheus (bin/test installs it) with the shipped rules, scraping the guard's endpoint every second:
    the guard that gave up is DgxSparkGuardGaveUp firing, with the scrape config's labels."""
    import shutil
    import subprocess
    import urllib.request
    import yaml
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: install Debian's prometheus package (bin/test does: ensure_promtool)"
    state = G.GuardState(status="gave_up", since=T0, restores_total=3, restores_failed_total=2,
                         gave_up={"at": T0, "reason": "memory not released on spark2: 5.0 GiB available"})
    (tmp_path / "state.json").write_text(state.to_json(), encoding="utf-8")
    port, web = free_port(), free_port()
    doc = {"container": CONTAINER, "api_url": "http://127.0.0.1:8000", "served_model_name": "glm",
           "state_path": str(tmp_path / "state.json"), "maintenance_path": str(tmp_path / "lock.json"),
           "ranks": [{"name": HEAD, "role": "head", "ssh_host": "", "cx7_ip": CX7[HEAD]},
                     {"name": W1, "role": "worker", "ssh_host": G.ssh_alias(W1), "cx7_ip": CX7[W1]}],
           "metrics_address": "127.0.0.1", "metrics_port": port}
    server = prog.start_metrics(G.parse_config(doc))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(Path(__file__).resolve().parents[3] / "playbooks" / "files" / "dgxspark-vllm-alerts.yml")],
              "scrape_configs": [{"job_name": "dgxspark-vllm-guard", "static_configs": [
                  {"targets": ["127.0.0.1:%d" % port], "labels": {"cluster": HEAD, "head": HEAD, "component": "guard"}}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = subprocess.Popen([prometheus, "--config.file=%s" % (tmp_path / "prometheus.yml"),
                             "--storage.tsdb.path=%s" % (tmp_path / "data"), "--web.listen-address=127.0.0.1:%d" % web],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w", encoding="utf-8"))
    try:
        firing, deadline = [], time.monotonic() + 60
        while not firing and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/alerts" % web, timeout=2) as response:
                    alerts = json.load(response)["data"]["alerts"]
            except OSError:
                continue
            firing = [a for a in alerts if a["labels"]["alertname"] == "DgxSparkGuardGaveUp" and a["state"] == "firing"]
        assert firing, (tmp_path / "prometheus.log").read_text(encoding="utf-8")[-2000:]
        assert firing[0]["labels"]["component"] == "guard" and firing[0]["labels"]["cluster"] == HEAD
        assert firing[0]["annotations"]["summary"].startswith("The group guard of %s gave up" % HEAD)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------------ webhook

class _Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: records each POST (its headers and JSON body) and answers 204 (or the test's status)."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, self.headers["Content-Type"], json.loads(data)))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):   # pylint: disable=arguments-differ
        pass


@pytest.fixture(name="receiver")
def receiver_fixture(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield from _serving(_Receiver, seen=[], status=204)


def test_a_restore_and_a_give_up_are_posted_to_a_real_receiver(tmp_path, receiver, capsys):
    url = "http://127.0.0.1:%d/hook/sekrit-token" % receiver.server_address[1]
    rig = Rig(tmp_path, max_failed_restores=1)
    rig.config = G.parse_config(rig.doc, webhook_url=url)
    rig.guard = rig.new_guard()
    rig.guard.probe = rig.probe
    assert rig.guard.tick() == "ok"
    rig.nodes[W1].crash(exit_code=137)
    threads = []
    notify = rig.guard.webhook.notify
    rig.guard.webhook.notify = lambda body: threads.append(notify(body)) or threads[-1]
    assert rig.guard.tick() == "restored"
    rig.clock.advance(5)                   # within stable_seconds: the next break makes that restore a failed one
    rig.nodes[W1].crash(exit_code=1)
    assert rig.guard.tick() == "gave_up"
    for thread in threads:
        thread.join(10)
    assert [(path, kind) for path, kind, _body in receiver.seen] == [("/hook/sekrit-token", "application/json")] * 2
    restored, gave_up = sorted((body for _p, _k, body in receiver.seen), key=lambda body: body["event"] != "restored")
    last = rig.state.attempts[-1]
    assert {key: restored[key] for key in ("event", "head", "container", "kind", "rank", "ok", "error", "failed_rank",
                                           "duration_seconds", "started_at", "finished_at", "status")} == {
        "event": "restored", "head": HEAD, "container": CONTAINER, "kind": "stopped", "rank": W1, "ok": True,
        "error": None, "failed_rank": None, "duration_seconds": last["duration_seconds"],
        "started_at": last["started_at"], "finished_at": last["finished_at"], "status": "armed"}
    assert restored["reason"] == "the serve container on spark2 is not running (exit code 137)"
    assert (gave_up["event"], gave_up["status"], gave_up["kind"], gave_up["rank"]) == ("gave_up", "gave_up", "stopped", W1)
    assert gave_up["reason"] == rig.state.gave_up["reason"] and gave_up["fix"] == rig.state.gave_up["fix"]
    out = capsys.readouterr().out
    assert "webhook: the restored notification was delivered" in out and "sekrit" not in out
    assert rig.guard.webhook.counts() == {"sent": 2, "failed": 0}


def test_a_receiver_that_never_answers_delays_nothing_and_counts_as_a_failure(tmp_path, capsys):
    with socket.socket() as silent:        # accepts the connection (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = "http://127.0.0.1:%d/hook" % silent.getsockname()[1]
        webhook = prog.Webhook(url, timeout=0.5)
        began = time.monotonic()
        thread = webhook.notify({"event": "restored"})
        assert time.monotonic() - began < 0.2           # the caller (a restore) goes on at once
        assert thread.is_alive()
        thread.join(5)
        took = time.monotonic() - began
        assert not thread.is_alive() and 0.5 <= took < 2.0    # one attempt, bounded by the timeout
    assert webhook.counts() == {"sent": 0, "failed": 1}
    assert "webhook: the restored notification was not delivered: no answer within 0.5 s" in capsys.readouterr().out


def test_a_refused_or_failing_receiver_is_one_journal_line(receiver, capsys):
    receiver.status = 500
    webhook = prog.Webhook("http://127.0.0.1:%d/hook" % receiver.server_address[1], timeout=5)
    assert webhook.deliver({"event": "gave_up"}) == "HTTP 500 Internal Server Error"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = prog.Webhook("http://127.0.0.1:%d/hook/sekrit" % port, timeout=5).deliver({"event": "gave_up"})
    assert "refused" in refused.lower() and "sekrit" not in refused
    lines = [line for line in capsys.readouterr().out.splitlines() if "webhook" in line]
    assert len(lines) == 2 and all(line.startswith("<4>webhook: the gave_up notification was not delivered: ")
                                   for line in lines)
    assert webhook.counts() == {"sent": 0, "failed": 1}


def test_the_metrics_endpoint_counts_webhook_failures(rig):
    import urllib.request
    webhook = prog.Webhook("http://127.0.0.1:9/hook")
    webhook.failed = 3
    config = G.parse_config(dict(rig.doc, metrics_address="127.0.0.1", metrics_port=free_port()))
    server = prog.start_metrics(config, webhook)
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % config.metrics_port, timeout=5) as response:
            text = response.read().decode()
        assert "dgxspark_guard_webhook_failures_total 3\n" in text
    finally:
        server.shutdown()
        server.server_close()


def test_the_guard_reads_the_webhook_url_file_status_does_not(tmp_path, capsys):
    rig = Rig(tmp_path)
    hook = tmp_path / "webhook_url"
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(dict(rig.doc, webhook_url_file=str(hook))), encoding="utf-8")
    assert prog.load_config(str(path)).webhook_url == ""            # status, arm, ...: the file is not read
    with pytest.raises(G.GuardConfigError, match=r"the webhook URL file .*/webhook_url is missing"):
        prog.load_config(str(path), webhook=True)
    assert prog.main(["--config", str(path), "check-config"]) == prog.EXIT_CONFIG
    hook.write_text("ftp://files.example/sekrit\n", encoding="utf-8")
    assert prog.main(["--config", str(path), "check-config"]) == prog.EXIT_CONFIG
    out = capsys.readouterr().out
    assert "must be an http:// or https:// URL (it starts with 'ftp:')" in out and "sekrit" not in out
    hook.write_text("https://hooks.example/sekrit\n", encoding="utf-8")
    assert prog.load_config(str(path), webhook=True).webhook_url == "https://hooks.example/sekrit"
    assert prog.main(["--config", str(path), "check-config"]) == prog.EXIT_OK
    hook.write_text("ftp://files.example/sekrit\n", encoding="utf-8")
    assert prog.main(["--config", str(path), "status"]) == prog.EXIT_OK     # status never reads the URL


def test_signal_handler_does_not_wait_for_the_events_lock(capsys):
    # the signal lands while the main thread is inside stopping.wait(), holding the event's lock: the handler must
    # return at once, and the event be set and the stop logged once the lock is free
    stopping, returned = threading.Event(), threading.Event()
    handler = prog.signal_stopper(stopping)

    def interrupted_wait():
        with stopping._cond:  # pylint: disable=protected-access
            handler(signal.SIGTERM, None)
            returned.set()

    threading.Thread(target=interrupted_wait, daemon=True).start()
    assert returned.wait(5), "the signal handler blocked on the event's lock"
    assert stopping.wait(5)
    assert "dgxspark-group-guard stopping on SIGTERM" in capsys.readouterr().out  # logged before the event is set
