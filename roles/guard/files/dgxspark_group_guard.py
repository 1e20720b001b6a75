# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Group guard for a vLLM tensor-parallel group across DGX Spark nodes (role dgxspark.vllm.guard).

Runs on the head as a systemd service. It watches every rank's serve container and the head's API and, when
the group is broken, restores it in the recipe's order: stop the head (bounded, then killed), then every
worker; start the workers' existing containers and wait until each reached its rendezvous; start the head and
wait until it serves. It creates and renders nothing: it starts and stops the containers the launch created.
The head's own Docker is its local engine; a worker's is reached with ``ssh ALIAS OPERATION`` (the guard's own
ssh_config, one master connection per worker), whose key that worker accepts for its forced command only: the
guard's worker program (dgxspark_guard_worker.py), which runs the guard's few Docker operations on the serve
container and refuses anything else.

Standard library only, Python 3.8 or later. The decisions (broken or not, restore, back off, give up) and
the startup phases come from the collection's module_utils, installed next to this file.

Sub-commands: ``run`` (the service), ``arm``, ``disarm``, ``maintenance``, ``release``, ``status``,
``check-config``. Exit status: 0 success, 1 an operation failed, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=wrong-import-position
from ansible_collections.dgxspark.vllm.plugins.module_utils import _guard as G  # noqa: E402
from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import (  # noqa: E402
    DockerLogsError, read_container_logs,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import (  # noqa: E402
    describe_progress, established_peers, make_watch, observe, step,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import parse_log  # noqa: E402

LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO = 3, 4, 5, 6
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
SSH = "/usr/bin/ssh"


def log(priority: int, message: str) -> None:
    sys.stdout.write("<%d>%s\n" % (priority, message))
    sys.stdout.flush()


def sd_notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------ Docker

class Docker:
    """The docker CLI against one node's engine: the head's own (local), or a worker's through its forced command
    (``ssh -F SSH_CONFIG ALIAS 'OPERATION ...'``: the same docker arguments, quoted into one request the worker program
    splits and checks against the guard's operations before it runs docker with them)."""

    def __init__(self, rank: G.Rank, timeout: float = 30.0, runner=None,
                 ssh_config: str = G.GuardConfig.ssh_config) -> None:
        self.rank = rank
        self.timeout = timeout
        self.ssh_config = ssh_config
        self._runner = runner or self._subprocess

    def _env(self) -> dict:
        env = dict(os.environ)
        env.pop("DOCKER_HOST", None)    # the head's own engine, never another one
        env.pop("DOCKER_CONTEXT", None)
        return env

    def argv(self, args: list) -> list:
        """The command line that runs `docker ARGS` on this rank's node."""
        if not self.rank.ssh_host:
            return ["docker"] + list(args)
        return [SSH, "-F", self.ssh_config, self.rank.ssh_host, shlex.join(args)]

    def _subprocess(self, argv: list, timeout: float) -> tuple:
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                                  env=self._env(), check=False)
        except subprocess.TimeoutExpired:
            what = " ".join(argv[:3]) if argv[0] == "docker" else "ssh %s %s" % (argv[-2], argv[-1][:60])
            return 124, "", "%s timed out after %g s" % (what, timeout)
        except OSError as exc:
            return 127, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    def run(self, *args: str, timeout: float | None = None) -> tuple:
        return self._runner(self.argv(list(args)), timeout or self.timeout)

    def run_command(self, argv: list) -> tuple:
        """AnsibleModule.run_command's shape, for _docker_logs.read_container_logs (``docker ARGS``)."""
        if not argv or argv[0] != "docker":
            raise ValueError("not a docker command line: %r" % (argv,))
        return self.run(*argv[1:])

    def inspect(self, name: str) -> G.RankObservation:
        rc, out, err = self.run("inspect", "--format", "{{json .State}}", name)
        if rc != 0:
            if "No such" in err or "no such" in err:
                return G.RankObservation(name=self.rank.name, exists=False)
            return G.RankObservation(name=self.rank.name, reachable=False, exists=False,
                                     error=(err.strip() or "docker exit code %d" % rc)[-300:])
        try:
            return G.state_from_inspect(self.rank.name, json.loads(out))
        except ValueError:
            return G.RankObservation(name=self.rank.name, reachable=False, exists=False, error="unreadable inspect output")

    def env_value(self, name: str, key: str) -> str | None:
        rc, out, _err = self.run("inspect", "--format", "{{json .Config.Env}}", name)
        if rc != 0:
            return None
        try:
            for item in json.loads(out) or []:
                if item.startswith(key + "="):
                    return item[len(key) + 1:]
        except ValueError:
            return None
        return None

    def logs(self, name: str, since: str | None = None) -> str:
        try:
            return read_container_logs(self.run_command, name, since=since)
        except DockerLogsError as exc:
            return "(no log: %s)" % exc

    def stop(self, name: str, grace: float) -> str | None:
        """Stop, bounded: SIGTERM with `grace` seconds, then SIGKILL. A paused container is unpaused first
        (a frozen process cannot take the signal). None when it no longer runs, else why."""
        obs = self.inspect(name)
        if not obs.reachable:
            return obs.error
        if not obs.exists or not obs.running:
            return None
        if obs.paused:
            self.run("unpause", name)
        self.run("stop", "--time", str(int(grace)), name, timeout=grace + 30)
        obs = self.inspect(name)
        if obs.running:
            self.run("kill", name)
            obs = self.inspect(name)
        if obs.running:
            return "the serve container on %s still runs after docker stop and docker kill" % self.rank.name
        return None

    meminfo_path = "/proc/meminfo"                  # the head's own (a worker's through its forced command)
    drop_caches_path = "/proc/sys/vm/drop_caches"

    def meminfo(self) -> tuple:
        """(the node's /proc/meminfo text or None, why not)."""
        if not self.rank.ssh_host:
            try:
                return read_text(self.meminfo_path), ""
            except OSError as exc:
                return None, str(exc)
        rc, out, err = self._runner(self.argv(["meminfo"]), self.timeout)
        return (out, "") if rc == 0 else (None, (err.strip() or "exit code %d" % rc)[-300:])

    def drop_caches(self) -> str | None:
        """Drop the node's page cache (sync, then 3 into vm.drop_caches); None when done, else why not."""
        if not self.rank.ssh_host:
            try:
                os.sync()
                with open(self.drop_caches_path, "w", encoding="ascii") as handle:
                    handle.write("3\n")
            except OSError as exc:
                return str(exc)
            return None
        rc, _out, err = self._runner(self.argv(["drop-caches"]), self.timeout)
        return None if rc == 0 else (err.strip() or "exit code %d" % rc)[-300:]

    def start(self, name: str) -> str | None:
        rc, _out, err = self.run("start", name, timeout=120)
        return None if rc == 0 else (err.strip() or "docker start exit code %d" % rc)[-500:]


# ------------------------------------------------------------------------------------------------ API

class ApiProbe(threading.Thread):
    """Asks the head's API, every probe interval, for /health and then a one-token completion, and reads the
    engine's token counters from /metrics; _guard.judge_probe says whether that is a failure (and since when).
    Paused while a restore or a maintenance runs."""

    def __init__(self, config: G.GuardConfig, head: Docker, clock=time.time) -> None:
        super().__init__(daemon=True, name="api-probe")
        self.config = config
        self.head = head
        self.clock = clock
        self.lock = threading.Lock()
        self.state = G.ProbeState()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._key: str | None = None

    def pause(self) -> None:
        self._paused.set()
        with self.lock:
            self.state = G.ProbeState()
        self._key = None

    def resume(self, answered: bool = False) -> None:
        """Watch again; `answered` when a completion just succeeded (after a restore)."""
        with self.lock:
            self.state = G.ProbeState(answered_once=answered)
        self._paused.clear()

    def hold(self) -> None:
        """Pause unless paused already: the guard watches nothing now (disarmed, gave up, in maintenance)."""
        if not self._paused.is_set():
            self.pause()

    def watch(self) -> None:
        """Resume unless it runs already: the guard watches the group now."""
        if self._paused.is_set():
            self.resume()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple:
        with self.lock:
            return self.state.failing_since, self.state.detail

    def _request(self, path: str, body: dict | None) -> tuple:
        headers = {"Content-Type": "application/json"}
        if self._key is None:
            self._key = self.head.env_value(self.config.container, "VLLM_API_KEY") or ""
        if self._key:
            headers["Authorization"] = "Bearer " + self._key
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.config.api_url + path, data=data, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never through a proxy
        try:
            with opener.open(request, timeout=self.config.probe_timeout_seconds) as response:
                return response.status, response.read(4 * 1024 * 1024).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                self._key = None    # the container may have been recreated with another key
            return exc.code, str(exc)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return None, str(getattr(exc, "reason", exc))

    def probe_once(self) -> tuple:
        """(health ok, completion ok, detail, engine progress) of /health, a one-token completion, /metrics."""
        status, text = self._request("/health", None)
        if status != 200:
            return False, False, "GET /health: %s" % (status if status is not None else text), None
        body = {"model": self.config.served_model_name, "prompt": "1", "max_tokens": 1, "temperature": 0}
        started = time.monotonic()
        status, text = self._request("/v1/completions", body)
        ok = status == 200
        detail = "ok" if ok else "POST /v1/completions (1 token): %s after %.0f s" % (
            status if status is not None else text, time.monotonic() - started)
        m_status, m_text = self._request("/metrics", None)
        return True, ok, detail, G.engine_progress(m_text if m_status == 200 else None)

    def serves(self) -> tuple:
        """(ok, detail): a one-token completion answered now."""
        health, ok, detail, _progress = self.probe_once()
        return health and ok, detail

    def run(self) -> None:
        while not self._stop.is_set():
            if not self._paused.is_set():
                asked = self.clock()   # a failure dates from the question: the API stopped answering by then
                health, ok, detail, progress = self.probe_once()
                with self.lock:
                    if not self._paused.is_set():
                        was_failing = self.state.failing_since is not None
                        verdict = G.judge_probe(self.state, asked, health, ok, detail, progress)
                        if verdict == "failing" and not was_failing:
                            log(LOG_WARNING, "the head's API failed: %s (broken after %.0f s of this)"
                                % (detail, self.config.grace_seconds))
                        elif verdict == "busy":
                            log(LOG_INFO, "the probe timed out but the engine makes progress (busy, not hung): %s" % detail)
            self._stop.wait(self.config.probe_interval_seconds)


# ------------------------------------------------------------------------------------------------ webhook

def post_json(url: str, body: dict, timeout: float) -> str | None:
    """POST ``body`` as JSON to ``url``, one attempt bounded by ``timeout`` (the connection, then each read of the
    answer); None when the receiver answered 2xx, else why not - never the URL itself (it may carry a token)."""
    data = json.dumps(body, sort_keys=True).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "dgxspark-group-guard"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:   # a proxy from the environment, if any
            response.read(64 * 1024)
            return None if 200 <= response.status < 300 else "HTTP %d" % response.status
    except urllib.error.HTTPError as exc:
        return "HTTP %d %s" % (exc.code, exc.reason)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return "no answer within %g s" % timeout
        return str(getattr(reason, "strerror", None) or reason)
    except (socket.timeout, TimeoutError):
        return "no answer within %g s" % timeout
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return "%s: %s" % (type(exc).__name__, getattr(exc, "strerror", None) or "the request failed")


class Webhook:
    """The guard's notifications (_guard.webhook_body), each POSTed once by a thread of its own, so that a slow or
    dead receiver never delays a restore: a failure is one journal line and one more in the failures counter, no
    retry (the next event is sent anyway; the state file and the metrics keep what happened)."""

    def __init__(self, url: str, timeout: float = G.WEBHOOK_TIMEOUT_SECONDS) -> None:
        self.url = url
        self.timeout = timeout
        self.lock = threading.Lock()
        self.sent = 0
        self.failed = 0

    def notify(self, body: dict) -> threading.Thread:
        thread = threading.Thread(target=self.deliver, args=(body,), name="webhook", daemon=True)
        thread.start()
        return thread

    def deliver(self, body: dict) -> str | None:
        error = post_json(self.url, body, self.timeout)
        with self.lock:
            if error:
                self.failed += 1
            else:
                self.sent += 1
        if error:
            log(LOG_WARNING, "webhook: the %s notification was not delivered: %s" % (body.get("event"), error))
        else:
            log(LOG_INFO, "webhook: the %s notification was delivered" % body.get("event"))
        return error

    def counts(self) -> dict:
        with self.lock:
            return {"sent": self.sent, "failed": self.failed}


# ------------------------------------------------------------------------------------------------ metrics

class MetricsHandler(http.server.BaseHTTPRequestHandler):
    """GET /metrics: the guard's state as the state file and the maintenance lock hold it (_guard.metrics_text)."""

    config: G.GuardConfig
    webhook: Webhook | None = None
    server_version = "dgxspark-group-guard"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        now = time.time()
        text = read_text(self.config.state_path)
        state = G.state_from_json(text) if text else None
        lock = G.maintenance_active(read_text(self.config.maintenance_path), now)
        body = G.metrics_text(state, lock, now, self.webhook.counts() if self.webhook else None).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # pylint: disable=redefined-builtin
        pass    # a scrape every few seconds is no news for the journal


def start_metrics(config: G.GuardConfig, webhook: Webhook | None = None):
    """The Prometheus endpoint on metrics_address:metrics_port in a thread of its own; None when off or when the
    address cannot be bound (logged: the guard keeps guarding without it)."""
    if not config.metrics_port:
        return None
    handler = type("Handler", (MetricsHandler,), {"config": config, "webhook": webhook})
    try:
        family = socket.AF_INET6 if ":" in config.metrics_address else socket.AF_INET
        server_class = type("Server", (http.server.ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        server = server_class((config.metrics_address, config.metrics_port), handler)
    except OSError as exc:
        log(LOG_ERR, "metrics endpoint on %s:%d not started: %s" % (config.metrics_address, config.metrics_port, exc))
        return None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log(LOG_INFO, "metrics on http://%s:%d/metrics" % (config.metrics_address, config.metrics_port))
    return server


# ------------------------------------------------------------------------------------------------ files

def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class StateFile:
    """The state file, re-read when another process (arm, disarm) wrote it since this one did."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.mine: tuple | None = None
        self.state = self.load()

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_ino, st.st_size

    def load(self) -> G.GuardState:
        text = read_text(self.path)
        self.mine = self._stamp()
        return G.state_from_json(text) if text else G.GuardState(status="armed")

    def refresh(self) -> bool:
        if self._stamp() != self.mine:
            self.state = self.load()
            return True
        return False

    def save(self) -> None:
        self.state.updated_at = time.time()
        write_atomic(self.path, self.state.to_json() + "\n")
        self.mine = self._stamp()


# ------------------------------------------------------------------------------------------------ the guard

class Guard:
    def __init__(self, config: G.GuardConfig, docker_factory=Docker, clock=time.time, sleep=time.sleep,
                 proc_net_tcp=None) -> None:
        self.config = config
        self.nodes = {rank.name: docker_factory(rank, ssh_config=config.ssh_config) for rank in config.ranks}
        self.clock = clock
        self.sleep = sleep
        self.proc_net_tcp = proc_net_tcp or (lambda: read_text("/proc/net/tcp") or "")
        self.files = StateFile(config.state_path)
        self.probe: ApiProbe | None = None
        self.stopping = threading.Event()
        self.unreachable_since: float | None = None
        self.backoff_key: tuple | None = None    # what the guard backs off on (one journal line per change)
        self.webhook = Webhook(config.webhook_url) if config.webhook_url else None

    def notify(self, event: str, record: dict | None = None) -> None:
        """Tell the webhook (when one is set) about a restore or a give-up, without waiting for it."""
        if self.webhook is not None:
            self.webhook.notify(G.webhook_body(event, self.config, self.files.state, self.clock(), record))

    # -- observing
    def observe(self) -> list:
        return [self.nodes[rank.name].inspect(self.config.container) for rank in self.config.ranks]

    def baseline(self, observed: list) -> dict:
        return {obs.name: obs.started_at for obs in observed}

    def maintenance(self) -> dict | None:
        return G.maintenance_active(read_text(self.config.maintenance_path), self.clock())

    # -- one pass of the loop
    def tick(self) -> str:
        state = self.files.state
        if self.files.refresh():
            state = self.files.state
            log(LOG_INFO, "state file changed (%s): %s" % (state.status, state.detail))
            if self.probe:
                self.probe.resume()
        now = self.clock()
        if state.status in ("disarmed", "gave_up"):
            if self.probe:
                self.probe.hold()   # nothing to judge its answers for (a guard started disarmed asks nothing)
            return state.status
        lock = self.maintenance()
        if lock is not None:
            state.maintenance = lock
            if G.set_status(state, "maintenance", "held by %s until %s" % (lock["holder"], G.iso(lock["expires_at"])), now):
                log(LOG_NOTICE, "maintenance: %s; the guard does nothing until it is released or expires" % state.detail)
                self.files.save()
            if self.probe:
                self.probe.hold()   # also when the lock was held before this guard started
            return "maintenance"
        if self.probe:
            self.probe.watch()
        observed = self.observe()
        if state.status == "maintenance":
            # released without an arm (staging alone): take what serves now as the group
            if all(o.reachable and o.running for o in observed):
                state.baseline = self.baseline(observed)
            state.maintenance = None
            G.set_status(state, "armed", "maintenance over", now)
            log(LOG_NOTICE, "maintenance over: watching the group again")
            self.files.save()
            if self.probe:
                self.probe.resume()
        failing_since, detail = self.probe.snapshot() if self.probe else (None, "")
        if not state.baseline and all(o.reachable and o.running for o in observed):
            state.baseline = self.baseline(observed)
            self.files.save()
        finding = G.assess(self.config, state.baseline, observed, failing_since, detail, now)
        action = G.decide(state, self.config, finding, now)
        if action == "ok":
            self.unreachable_since = None
            if state.status != "armed":
                G.set_status(state, "armed", "serving", now)
                self.files.save()
            sd_notify("STATUS=armed: the group serves")
            return "ok"
        if action == "wait_nodes":
            if self.unreachable_since is None:
                self.unreachable_since = now
                G.set_status(state, "waiting_nodes", finding.reason, now)
                log(LOG_WARNING, "waiting up to %.0f s for every node's Docker: %s" % (self.config.node_wait_seconds, finding.reason))
                self.files.save()
            if now - self.unreachable_since > self.config.node_wait_seconds:
                self.give_up(G.Finding("unreachable", finding.rank, "%s (waited %.0f s)" % (finding.reason, now - self.unreachable_since)), now)
                return "gave_up"
            return "wait_nodes"
        self.unreachable_since = None
        if action == "give_up":
            self.give_up(finding, now)
            return "gave_up"
        if action == "backoff":
            self.backoff_key, line = G.backoff_notice(self.backoff_key, finding, state.next_attempt_at)
            if line:
                G.set_status(state, "backoff", "%s; next restore at %s" % (finding.reason, G.iso(state.next_attempt_at)), now)
                log(LOG_WARNING, line)
                self.files.save()
            return "backoff"
        self.backoff_key = None
        record = self.restore(finding)
        if record.get("memory"):
            return "gave_up"
        return "restored" if record["ok"] else "handed_over" if record.get("aborted") else "restore_failed"

    def give_up(self, finding: G.Finding, now: float) -> None:
        state = self.files.state
        state.gave_up = G.give_up_record(state, self.config, finding, now)
        G.set_status(state, "gave_up", state.gave_up["reason"], now)
        log(LOG_ERR, "GAVE UP: %s. Fix: %s" % (state.gave_up["reason"], state.gave_up["fix"]))
        for line in state.gave_up.get("last_lines", [])[-10:]:
            log(LOG_ERR, "  | %s" % line)
        self.files.save()
        sd_notify("STATUS=gave up: %s" % state.gave_up["reason"][:200])
        self.notify("gave_up")

    # -- restoring
    def stop_group(self) -> str | None:
        """Head first (SIGTERM with stop_seconds, then SIGKILL: a hung head ignores SIGTERM), then every worker,
        killed at once as the launch does: a headless worker whose head is gone does not exit on SIGTERM."""
        errors = []
        for rank in self.config.ranks:
            grace = self.config.stop_seconds if rank.role == "head" else 0
            error = self.nodes[rank.name].stop(self.config.container, grace)
            if error:
                errors.append("%s: %s" % (rank.name, error))
        return "; ".join(errors) or None

    def _started_still_up(self, started: dict, pending: set, phase: str, record: dict) -> bool:
        """Every rank this restore started and no longer waits on still runs its start, unfrozen; else the record
        says which rank and why (_guard.started_rank_problem) and the restore ends now, not at a peer's grace."""
        for rank in self.config.ranks:
            if rank.name not in started or rank.name in pending:
                continue
            obs = self.nodes[rank.name].inspect(self.config.container)
            problem = obs.error if not obs.reachable else G.started_rank_problem(obs, started[rank.name])
            if problem:
                record.update(failed_rank=rank.name, failed_phase=phase, error=problem)
                return False
        return True

    def _wait(self, ranks: list, target: str, peers: list, started: dict, record: dict) -> bool:
        """Wait until every rank in `ranks` reached `target`; on failure fill record and return False."""
        t0 = self.clock()
        watches = {rank.name: make_watch(target, self.config.budgets, t0, peers if rank.role == "head" else None,
                                         self.config.peer_grace_seconds, stall_seconds=self.config.stall_seconds)
                   for rank in ranks}
        pending = {rank.name for rank in ranks}
        shown = {rank.name: t0 for rank in ranks}     # when each rank's last progress line went to the journal
        while pending:
            if self.stopping.is_set():
                record.update(failed_rank=sorted(pending)[0], failed_phase=target, error="the guard is stopping")
                return False
            lock = self.maintenance()
            if lock is not None:
                record.update(failed_rank=None, failed_phase=target, aborted=True,
                              error="maintenance began (%s): that run owns the cluster now" % lock["holder"])
                return False
            if not self._started_still_up(started, pending, target, record):
                return False
            for rank in ranks:
                if rank.name not in pending:
                    continue
                node = self.nodes[rank.name]
                obs = node.inspect(self.config.container)
                if not obs.reachable:
                    record.update(failed_rank=rank.name, failed_phase=target, error=obs.error)
                    return False
                report = parse_log(node.logs(self.config.container, since=started.get(rank.name))) if obs.exists else None
                connected = established_peers(self.proc_net_tcp(), peers) if peers and rank.role == "head" else frozenset()
                verdict = step(watches[rank.name], observe(self.clock(), obs.exists, obs.running, obs.exit_code, report,
                                                           connected, obs.paused))
                record.setdefault("phases", {}).setdefault(rank.name, {}).update(
                    {k: round(v - record["started_at"], 1) for k, v in verdict.phase_reached_at.items()})
                if verdict.status == "failed":
                    record.update(failed_rank=rank.name, failed_phase=verdict.phase or "container_started",
                                  error=verdict.reason)
                    return False
                problem = G.started_rank_problem(obs, started.get(rank.name))
                if problem:
                    record.update(failed_rank=rank.name, failed_phase=verdict.phase or target, error=problem)
                    return False
                if verdict.status == "waiting" and self.clock() - shown[rank.name] >= self.config.progress_seconds:
                    shown[rank.name] = self.clock()
                    waited = self.clock() - record["started_at"]
                    log(LOG_INFO, "restore: %s: %s (%.0f s)" % (rank.name, describe_progress(verdict.progress), waited))
                if verdict.status == "done":
                    pending.discard(rank.name)
                    log(LOG_INFO, "restore: %s reached %s after %.1f s" % (rank.name, target, self.clock() - record["started_at"]))
            if pending:
                self.sleep(self.config.poll_seconds)
        return True

    def _serves(self, started: dict, record: dict) -> bool:
        """The head answers a completion (bounded by the api_up budget), while every started rank still runs."""
        if self.probe is None:
            return True
        deadline = self.clock() + self.config.budgets.get("api_up", 900.0)
        while True:
            if not self._started_still_up(started, set(), "api_up", record):
                return False
            ok, detail = self.probe.serves()
            if ok:
                return True
            lock = self.maintenance()
            if lock is not None:
                record.update(failed_rank=None, failed_phase="api_up", aborted=True,
                              error="maintenance began (%s): that run owns the cluster now" % lock["holder"])
                return False
            if self.clock() > deadline or self.stopping.is_set():
                record.update(failed_rank=self.config.head.name, failed_phase="api_up", error="the head does not "
                              "answer a completion: %s" % detail)
                return False
            self.sleep(self.config.poll_seconds)

    def restore(self, finding: G.Finding) -> dict:
        state = self.files.state
        started = self.clock()
        record = {"started_at": started, "kind": finding.kind, "rank": finding.rank, "reason": finding.reason, "ok": False}
        if self.probe:
            self.probe.pause()
        G.set_status(state, "restoring", finding.reason, started)
        log(LOG_WARNING, "RESTORE: %s; stopping the head, then the workers" % finding.reason)
        self.files.save()
        sd_notify("STATUS=restoring: %s" % finding.reason[:200])
        ok = self._restore_steps(record)
        record["finished_at"] = self.clock()
        record["duration_seconds"] = round(record["finished_at"] - started, 1)
        if ok:
            record["ok"] = True
            record["baseline"] = self.baseline(self.observe())
            log(LOG_NOTICE, "RESTORED in %.1f s: the group serves again (%s)" % (record["duration_seconds"], finding.reason))
        elif record.get("aborted"):
            log(LOG_NOTICE, "restore handed over after %.1f s: %s" % (record["duration_seconds"], record.get("error")))
            if self.probe:
                self.probe.resume()
            return record   # not counted: the maintenance run decides what runs
        else:
            node = self.nodes.get(record.get("failed_rank") or "")
            if node is not None:
                lines = [line for line in node.logs(self.config.container).splitlines() if line.strip()]
                record["last_lines"] = lines[-self.config.log_lines:]
            log(LOG_ERR, "restore FAILED after %.1f s at %s in phase %s: %s" % (
                record["duration_seconds"], record.get("failed_rank"), record.get("failed_phase"), record.get("error")))
            for line in record.get("last_lines", [])[-10:]:
                log(LOG_ERR, "  | %s" % line)
            error = self.stop_group()   # never one rank left running alone
            if error:
                log(LOG_ERR, "stopping the group after the failed restore: %s" % error)
        G.record_restore(state, self.config, record)
        G.set_status(state, "armed" if ok else "backoff", "restored" if ok else "restore failed: %s" % record.get("error"),
                     self.clock())
        self.files.save()
        self.notify("restored" if ok else "restore_failed", record)
        if record.get("memory"):      # no restart loop into a node reset: give up, naming the node and the figures
            self.give_up(G.Finding("memory", record["failed_rank"], record["error"]), self.clock())
        if self.probe:
            self.probe.resume(answered=ok)
        return record

    def _memory_back(self, record: dict) -> bool:
        """Before any rank starts: each node's MemAvailable back within guard_memory_margin_percent of the level at
        the last good start (_guard.memory_shortfall); if not, its page cache dropped and memory waited for, at most
        memory_wait_seconds. Records the levels (memory_before_start); False, with record["memory"], when a node's
        memory did not come back."""
        reference = self.files.state.memory_reference
        levels = {}
        for rank in list(self.config.workers) + [self.config.head]:    # the order the restore starts them
            node = self.nodes[rank.name]
            text, why = node.meminfo()
            available = G.mem_available_kib(text)
            if available is None:
                log(LOG_WARNING, "restore: the memory of %s cannot be read (%s): not checked" % (rank.name, why or "no MemAvailable"))
                continue
            problem = G.memory_shortfall(rank.name, available, reference.get(rank.name), self.config.memory_margin_percent)
            if problem:
                log(LOG_WARNING, "restore: %s; dropping its page cache and waiting up to %.0f s" % (
                    problem, self.config.memory_wait_seconds))
                error = node.drop_caches()
                if error:
                    log(LOG_WARNING, "restore: dropping the page cache on %s failed: %s" % (rank.name, error))
                deadline = self.clock() + self.config.memory_wait_seconds
                while problem and self.clock() < deadline and not self.stopping.is_set():
                    self.sleep(self.config.poll_seconds)
                    available = G.mem_available_kib(node.meminfo()[0]) or available
                    problem = G.memory_shortfall(rank.name, available, reference.get(rank.name),
                                                 self.config.memory_margin_percent)
                if problem:
                    record.update(failed_rank=rank.name, failed_phase="memory", error=problem,
                                  memory={"node": rank.name, "available_kib": available,
                                          "reference_kib": reference.get(rank.name)})
                    return False
                log(LOG_INFO, "restore: the memory of %s came back: %s available" % (rank.name, G.gib(available)))
            levels[rank.name] = available
        record["memory_before_start"] = levels
        return True

    def _restore_steps(self, record: dict) -> bool:
        error = self.stop_group()
        if error:
            record.update(failed_rank=None, failed_phase="stop", error=error)
            return False
        if not self._memory_back(record):
            return False
        started: dict = {}
        for rank in self.config.workers:
            error = self.nodes[rank.name].start(self.config.container)
            if error:
                record.update(failed_rank=rank.name, failed_phase="container_started", error=error)
                return False
            started[rank.name] = self.nodes[rank.name].inspect(self.config.container).started_at or None
        log(LOG_INFO, "restore: workers started; waiting for their rendezvous")
        if not self._wait(list(self.config.workers), "rendezvous", [], started, record):
            return False
        head = self.config.head
        error = self.nodes[head.name].start(self.config.container)
        if error:
            record.update(failed_rank=head.name, failed_phase="container_started", error=error)
            return False
        started[head.name] = self.nodes[head.name].inspect(self.config.container).started_at or None
        log(LOG_INFO, "restore: head started; waiting until it serves")
        peers = [rank.cx7_ip for rank in self.config.workers]
        if not self._wait([head], "api_up", peers, started, record):
            return False
        return self._serves(started, record)

    # -- the service
    def serve(self) -> int:
        self.probe = ApiProbe(self.config, self.nodes[self.config.head.name])
        self.probe.pause()   # the first tick lets it ask, when the guard watches the group
        self.probe.start()
        metrics = start_metrics(self.config, self.webhook)
        sd_notify("READY=1")
        log(LOG_INFO, "dgxspark-group-guard watching %s on %s%s" % (
            self.config.container, ", ".join("%s (%s)" % (r.name, r.role) for r in self.config.ranks),
            "; restores and give-ups are POSTed to the webhook" if self.webhook else ""))
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception as exc:  # pylint: disable=broad-except
                log(LOG_ERR, "guard loop error: %s: %s" % (type(exc).__name__, exc))
            self.stopping.wait(self.config.interval_seconds)
        self.probe.stop()
        if metrics is not None:
            metrics.shutdown()
        return EXIT_OK

    # -- commands from Ansible
    def arm(self, holder: str) -> dict:
        observed = self.observe()
        missing = [o for o in observed if not (o.reachable and o.exists and o.running)]
        if missing:
            raise RuntimeError("cannot arm: %s" % "; ".join(
                "%s: %s" % (o.name, o.error or ("absent" if not o.exists else "not running")) for o in missing))
        state = self.files.state
        baseline = self.baseline(observed)
        # the maintenance the arming run itself took (and releases here) is no change of what the guard keeps
        changed = G.arm_changes(state, baseline)
        G.arm(state, baseline, self.clock(), holder)
        try:
            os.unlink(self.config.maintenance_path)
        except FileNotFoundError:
            pass
        if changed or not os.path.exists(self.config.state_path):
            self.files.save()
        return {"changed": changed, "status": state.status, "baseline": state.baseline}

    def disarm(self, holder: str) -> dict:
        state = self.files.state
        changed = G.set_status(state, "disarmed", "disarmed by %s" % holder, self.clock()) if state.status != "disarmed" else False
        if changed:
            self.files.save()
        return {"changed": changed, "status": state.status}


def status_document(config: G.GuardConfig, now: float) -> dict:
    text = read_text(config.state_path)
    state = G.state_from_json(text) if text else None
    lock = G.maintenance_active(read_text(config.maintenance_path), now)
    doc = {"state_file": config.state_path, "installed": True, "state": json.loads(state.to_json()) if state else None,
           "maintenance": lock, "now": now, "summary": G.describe(state, lock),
           "gave_up": bool(state and state.status == "gave_up")}
    if state is not None and lock is not None and state.status not in ("disarmed",):
        doc["state"]["status"] = "maintenance"
    return doc


def load_config(path: str, webhook: bool = False) -> G.GuardConfig:
    """The configuration at ``path``; with ``webhook``, the URL in the file its webhook_url_file names too (root's
    alone: only the guard and its install's check read it, never ``status``)."""
    text = read_text(path)
    if text is None:
        raise G.GuardConfigError(["no configuration file at %s" % path])
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise G.GuardConfigError(["%s is not valid JSON: %s" % (path, exc)]) from exc
    url = None
    name = data.get("webhook_url_file") if isinstance(data, dict) else None
    if webhook and isinstance(name, str) and name.startswith("/"):
        try:
            url = read_text(name)
        except OSError as exc:
            raise G.GuardConfigError(["the webhook URL file %s cannot be read: %s" % (name, exc.strerror)]) from exc
        if url is None:
            raise G.GuardConfigError(["the webhook URL file %s is missing (the guard role writes it)" % name])
    return G.parse_config(data, webhook_url=url)


def signal_stopper(stopping: threading.Event):
    """A SIGTERM/SIGINT handler that logs the signal and sets `stopping` from a new thread.

    A handler runs in the main thread between two of its bytecodes, possibly inside `stopping.wait()` while that
    holds the event's (non-reentrant) lock, or inside a write to stdout: setting the event or logging there could
    wait forever or fail, and systemd would kill the guard at its stop timeout. A thread does both once the main
    thread's wait has released the lock."""
    def stop(name: str) -> None:
        log(LOG_INFO, "dgxspark-group-guard stopping on %s" % name)
        stopping.set()

    def on_signal(signum, _frame):
        threading.Thread(target=stop, args=(signal.Signals(signum).name,), name="stop-on-signal", daemon=True).start()
    return on_signal


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description="Keep a vLLM TP group serving, restored in order (dgxspark.vllm).")
    parser.add_argument("--config", default="/etc/dgxspark/guard.json")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="the service (default)")
    for name in ("arm", "disarm", "maintenance"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--holder", default="ansible")
        if name == "maintenance":
            cmd.add_argument("--ttl", type=float, required=True, help="seconds until the lock expires by itself")
    sub.add_parser("release")
    sub.add_parser("status")
    sub.add_parser("check-config")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except G.GuardConfigError as exc:
        log(LOG_ERR, "configuration error: %s" % exc)
        return EXIT_CONFIG
    command = args.command or "run"
    if command in ("run", "check-config") and config.webhook_url_file:
        try:
            config = load_config(args.config, webhook=True)
        except G.GuardConfigError as exc:
            if command == "check-config":
                log(LOG_ERR, "configuration error: %s" % exc)
                return EXIT_CONFIG
            # the guard keeps guarding: a notification is worth less than a restore
            log(LOG_ERR, "webhook off, nobody is notified: %s" % exc)
    now = time.time()
    if command == "check-config":
        print(json.dumps({"ok": True, "ranks": [r.name for r in config.ranks]}))
        return EXIT_OK
    if command == "status":
        print(json.dumps(status_document(config, now), sort_keys=True))
        return EXIT_OK
    if command == "maintenance":
        doc = G.maintenance_document(args.holder, now, args.ttl)
        write_atomic(config.maintenance_path, json.dumps(doc) + "\n")
        print(json.dumps({"changed": True, "maintenance": doc}))
        return EXIT_OK
    if command == "release":
        existed = os.path.exists(config.maintenance_path)
        if existed:
            os.unlink(config.maintenance_path)
        print(json.dumps({"changed": existed}))
        return EXIT_OK
    guard = Guard(config)
    if command in ("arm", "disarm"):
        try:
            result = guard.arm(args.holder) if command == "arm" else guard.disarm(args.holder)
        except RuntimeError as exc:
            print(json.dumps({"changed": False, "failed": True, "msg": str(exc)}))
            return EXIT_FAILED
        print(json.dumps(result, sort_keys=True))
        return EXIT_OK

    on_signal = signal_stopper(guard.stopping)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return guard.serve()


if __name__ == "__main__":
    sys.exit(main())
