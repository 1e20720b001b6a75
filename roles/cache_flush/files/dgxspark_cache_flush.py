# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Page-cache flush service and MemAvailable watchdog for DGX Spark (GB10) nodes.

Installed by the dgxspark.vllm.cache_flush role and run by a systemd unit during the model-load window.
Standard library only; Python 3.8 or later.

Every ``interval_seconds`` it reads /proc/meminfo and:

* flushes the page cache (``sync``, then ``3`` into /proc/sys/vm/drop_caches) when the droppable page cache
  exceeds ``threshold_bytes``. The measure is ``Buffers + Cached - Shmem``: Shmem (tmpfs, /dev/shm, the
  ``--ipc host`` shared memory) is counted inside Cached but drop_caches cannot free it, so counting it would
  make the service flush on every tick without gaining a byte. On GB10 vLLM sizes its memory from
  MemAvailable, which page cache distorts;
* warns at priority err when MemAvailable is below ``floor_bytes`` and, with ``action`` ``stop_container``,
  stops the serve container (``docker stop --time 10 NAME``) on entering that state and again every
  60 seconds while it lasts.

/proc/meminfo's "kB" is KiB (1024 bytes); every value here is in bytes. Log lines go to stdout with
sd-daemon(3) priority prefixes (``<3>`` err ... ``<6>`` info) that journald turns into priorities.

Configuration: a JSON object (``--config``), overridden by flags. Exit status: 0 success, 1 an operation
failed (``--once``) or /proc/meminfo became unreadable, 2 bad configuration or unusable environment.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, fields, replace

LOG_ERR = 3
LOG_WARNING = 4
LOG_NOTICE = 5
LOG_INFO = 6

ACTIONS = ("log", "stop_container")
INTERVAL_MIN = 1
INTERVAL_MAX = 3600
REQUIRED_FIELDS = ("MemTotal", "MemAvailable", "Buffers", "Cached")
REMINDER_SECONDS = 60
# follow mode, idle: how often the serve container is looked at for a new start (a docker inspect), at most; a load
# shorter than interval_seconds (a restore of a small model, a lab's CPU engine) is followed from its first seconds
FOLLOW_IDLE_POLL_SECONDS = 2
DOCKER_STOP_GRACE_SECONDS = 10
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


class MeminfoError(ValueError):
    """/proc/meminfo text that cannot be used."""


class ConfigError(ValueError):
    """A configuration value that cannot be used."""


@dataclass(frozen=True)
class Config:
    threshold_bytes: int = 40000000000
    floor_bytes: int = 8 * 1024 ** 3
    interval_seconds: int = 5
    action: str = "log"
    container_name: str = "vllm_glm53"
    meminfo_path: str = "/proc/meminfo"
    drop_caches_path: str = "/proc/sys/vm/drop_caches"
    docker_bin: str = "docker"
    follow_container: str = ""
    follow_seconds: int = 3600
    follow_until_loaded: bool = True


CONFIG_KEYS = tuple(item.name for item in fields(Config))
INT_KEYS = ("threshold_bytes", "floor_bytes", "interval_seconds", "follow_seconds")
BOOL_KEYS = ("follow_until_loaded",)

# The lines with which vLLM says a start's load is over: its KV cache allocated (each rank) or its API up (the head).
# The same lines end the phases kv_allocated and api_up of the collection's log reader (module_utils/_vllm_log.py),
# which ends the launch's load watch; a unit test keeps the two in step on the recorded logs.
LOAD_END_PATTERNS = (
    re.compile(r"\bKV cache size: [\d,]+ tokens\b"),
    re.compile(r"\bGiB (?:memory )?for KV cache\b", re.IGNORECASE),
    re.compile(r"\bAvailable KV cache memory:"),
    re.compile(r"Replace gpu_memory_utilization(?: config)? with `--kv-cache-memory="),
    re.compile(r"\bStarting vLLM (?:API )?server (?:\d+ )?on\b"),
    re.compile(r"\bApplication startup complete\."),
)


@dataclass(frozen=True)
class Decision:
    flush: bool
    low_memory: bool
    page_cache: int
    mem_available: int
    reasons: tuple


@dataclass(frozen=True)
class WatchdogState:
    low: bool = False
    last_alert: float = 0.0


def gib(value: int) -> str:
    return "%.2f GiB" % (value / 1024 ** 3)


def parse_meminfo(text: str) -> dict:
    """Parse /proc/meminfo text into {field: int}: "kB" values in bytes, unit-less values (HugePages_*) as counts.

    Raises MeminfoError for an unreadable line, a duplicate field, or a missing field among REQUIRED_FIELDS.
    """
    values = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        key, sep, rest = raw.partition(":")
        key = key.strip()
        parts = rest.split()
        if not sep or not key or " " in key or len(parts) not in (1, 2):
            raise MeminfoError("meminfo line %d: expected 'Field: value [kB]', got %r" % (number, raw))
        if not parts[0].isdigit():
            raise MeminfoError("meminfo line %d: %s has a non-numeric value %r" % (number, key, parts[0]))
        if len(parts) == 2 and parts[1] != "kB":
            raise MeminfoError("meminfo line %d: %s has unknown unit %r (expected kB)" % (number, key, parts[1]))
        if key in values:
            raise MeminfoError("meminfo line %d: field %s appears twice" % (number, key))
        values[key] = int(parts[0]) * (1024 if len(parts) == 2 else 1)
    missing = [name for name in REQUIRED_FIELDS if name not in values]
    if missing:
        raise MeminfoError("meminfo lacks required field(s): %s" % ", ".join(missing))
    return values


def page_cache_bytes(meminfo: dict) -> int:
    """The page cache drop_caches can free: Buffers + Cached - Shmem (Shmem counts as 0 when absent)."""
    return max(0, meminfo["Buffers"] + meminfo["Cached"] - meminfo.get("Shmem", 0))


def below_floor(available: int, floor: int) -> str:
    return "MemAvailable %d B (%s) is below the floor %d B (%s)" % (available, gib(available), floor, gib(floor))


def decide(meminfo: dict, threshold: int, floor: int) -> Decision:
    """Flush when page cache > threshold; low memory when MemAvailable < floor (bytes, both > 0)."""
    if threshold <= 0 or floor <= 0:
        raise ValueError("threshold and floor must be > 0 bytes, got %r and %r" % (threshold, floor))
    cache = page_cache_bytes(meminfo)
    available = meminfo["MemAvailable"]
    reasons = []
    flush = cache > threshold
    if flush:
        reasons.append("page cache %d B (%s, Buffers+Cached-Shmem) exceeds the threshold %d B (%s)"
                       % (cache, gib(cache), threshold, gib(threshold)))
    low = available < floor
    if low:
        reasons.append(below_floor(available, floor))
    return Decision(flush=flush, low_memory=low, page_cache=cache, mem_available=available, reasons=tuple(reasons))


def watchdog_step(state: WatchdogState, low_memory: bool, now: float, reminder: float = REMINDER_SECONDS) -> tuple:
    """Return (new state, event): "enter", "remind" (still low, `reminder` seconds on), "recover" or ""."""
    if low_memory:
        if not state.low:
            return WatchdogState(low=True, last_alert=now), "enter"
        if now - state.last_alert >= reminder:
            return WatchdogState(low=True, last_alert=now), "remind"
        return state, ""
    if state.low:
        return WatchdogState(), "recover"
    return state, ""


def validate_config(values: dict) -> Config:
    """Build a Config from {key: value}; raise ConfigError listing every bad or unknown key."""
    problems = ["unknown setting %r (known: %s)" % (key, ", ".join(CONFIG_KEYS)) for key in sorted(values) if key not in CONFIG_KEYS]
    clean = {}
    for key in CONFIG_KEYS:
        if key not in values:
            continue
        value = values[key]
        if key in BOOL_KEYS:
            if not isinstance(value, bool):
                problems.append("%s must be true or false, got %r" % (key, value))
                continue
        elif key in INT_KEYS:
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append("%s must be an integer, got %r" % (key, value))
                continue
        elif not isinstance(value, str):
            problems.append("%s must be a string, got %r" % (key, value))
            continue
        clean[key] = value
    config = replace(Config(), **clean)
    if config.threshold_bytes <= 0:
        problems.append("threshold_bytes must be > 0, got %d" % config.threshold_bytes)
    if config.floor_bytes <= 0:
        problems.append("floor_bytes must be > 0, got %d" % config.floor_bytes)
    if not INTERVAL_MIN <= config.interval_seconds <= INTERVAL_MAX:
        problems.append("interval_seconds must be within %d..%d, got %d" % (INTERVAL_MIN, INTERVAL_MAX, config.interval_seconds))
    if config.action not in ACTIONS:
        problems.append("action must be one of %s, got %r" % (", ".join(ACTIONS), config.action))
    if config.action == "stop_container" and not config.container_name.strip():
        problems.append("container_name must not be empty when action is stop_container")
    if config.follow_seconds <= 0:
        problems.append("follow_seconds must be > 0, got %d" % config.follow_seconds)
    for key in ("meminfo_path", "drop_caches_path", "docker_bin"):
        if not getattr(config, key):
            problems.append("%s must not be empty" % key)
    if problems:
        raise ConfigError("; ".join(problems))
    return config


def load_config_file(path: str) -> dict:
    """Read a JSON object of settings; keys starting with "_" are comments and are dropped."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ConfigError("cannot read config file %s: %s" % (path, exc)) from exc
    except ValueError as exc:
        raise ConfigError("config file %s is not valid JSON: %s" % (path, exc)) from exc
    if not isinstance(data, dict):
        raise ConfigError("config file %s must hold a JSON object, got %s" % (path, type(data).__name__))
    return {key: value for key, value in data.items() if not key.startswith("_")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Flush the page cache above a threshold and watch MemAvailable (dgxspark.vllm).")
    parser.add_argument("--config", metavar="PATH", help="JSON object with the settings below (flags win)")
    parser.add_argument("--threshold-bytes", type=int, help="flush when Buffers+Cached-Shmem exceeds this (default 40000000000)")
    parser.add_argument("--floor-bytes", type=int, help="MemAvailable below this fires the watchdog (default 8 GiB)")
    parser.add_argument("--interval-seconds", type=int, help="seconds between checks, %d..%d (default 5)" % (INTERVAL_MIN, INTERVAL_MAX))
    parser.add_argument("--action", choices=ACTIONS, help="watchdog action (default log)")
    parser.add_argument("--container-name", help="container stopped by the stop_container action (default vllm_glm53)")
    parser.add_argument("--meminfo-path", help="default /proc/meminfo")
    parser.add_argument("--drop-caches-path", help="default /proc/sys/vm/drop_caches")
    parser.add_argument("--docker-bin", help="docker client used by stop_container (default: docker from PATH)")
    parser.add_argument("--follow-container", help="act only while this container is in its first follow_seconds "
                        "of running (its model load): the follow mode the group guard's restores rely on")
    parser.add_argument("--follow-seconds", type=int, help="length of the load window in follow mode (default 3600)")
    parser.add_argument("--follow-whole-window", dest="follow_until_loaded", action="store_false", default=None,
                        help="in follow mode, act for the whole window, not only until the container's log says its "
                        "load is over (its KV cache allocated or its API up)")
    parser.add_argument("--once", action="store_true", help="run one check and exit")
    parser.add_argument("--check-config", action="store_true", help="validate the configuration, print it and exit")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    values = load_config_file(args.config) if args.config else {}
    for key in CONFIG_KEYS:
        flag = getattr(args, key)
        if flag is not None:
            values[key] = flag
    return validate_config(values)


def describe(config: Config) -> str:
    return ("threshold_bytes=%d (%s) floor_bytes=%d (%s) interval_seconds=%d action=%s container_name=%s "
            "meminfo_path=%s drop_caches_path=%s docker_bin=%s measure=Buffers+Cached-Shmem%s"
            % (config.threshold_bytes, gib(config.threshold_bytes), config.floor_bytes, gib(config.floor_bytes),
               config.interval_seconds, config.action, config.container_name, config.meminfo_path,
               config.drop_caches_path, config.docker_bin,
               (" follow_container=%s follow_seconds=%d follow_until_loaded=%s"
                % (config.follow_container, config.follow_seconds, str(config.follow_until_loaded).lower()))
               if config.follow_container else ""))


def log(priority: int, message: str) -> None:
    sys.stdout.write("<%d>%s\n" % (priority, message))
    sys.stdout.flush()


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about readiness/status; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError as exc:
        log(LOG_WARNING, "cannot notify systemd at %s: %s" % (address, exc))


def read_meminfo(path: str) -> dict:
    with open(path, encoding="ascii") as handle:
        return parse_meminfo(handle.read())


def flush_page_cache(drop_caches_path: str) -> None:
    """sync, then ask the kernel to drop clean page cache, dentries and inodes."""
    os.sync()
    with open(drop_caches_path, "w", encoding="ascii") as handle:
        handle.write("3\n")


def stop_container(docker_bin: str, name: str) -> tuple:
    """Run `docker stop --time 10 NAME`; return (ok, output)."""
    command = [docker_bin, "stop", "--time", str(DOCKER_STOP_GRACE_SECONDS), name]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=DOCKER_STOP_GRACE_SECONDS + 50, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def writable(path: str) -> bool:
    if os.path.exists(path):
        return os.access(path, os.W_OK)
    return os.access(os.path.dirname(path) or ".", os.W_OK)


def check_environment(config: Config) -> None:
    """Fail early (ConfigError) when meminfo is unusable or drop_caches cannot be written."""
    try:
        read_meminfo(config.meminfo_path)
    except (OSError, MeminfoError) as exc:
        raise ConfigError("cannot use %s: %s" % (config.meminfo_path, exc)) from exc
    if not writable(config.drop_caches_path):
        raise ConfigError("%s is not writable: the service needs root (CAP_SYS_ADMIN) and a writable /proc/sys"
                          % config.drop_caches_path)


def run_iteration(config: Config, state: WatchdogState, now: float, verbose: bool = False) -> tuple:
    """One check: flush and/or act as decided. Return (new watchdog state, ok). Raises OSError/MeminfoError on meminfo."""
    ok = True
    decision = decide(read_meminfo(config.meminfo_path), config.threshold_bytes, config.floor_bytes)
    if verbose:
        log(LOG_INFO, "status: page_cache=%d (%s) mem_available=%d (%s) flush=%s low_memory=%s"
            % (decision.page_cache, gib(decision.page_cache), decision.mem_available, gib(decision.mem_available),
               decision.flush, decision.low_memory))
    if decision.flush:
        started = time.monotonic()
        try:
            flush_page_cache(config.drop_caches_path)
        except OSError as exc:
            ok = False
            log(LOG_ERR, "page cache flush FAILED: cannot write 3 to %s: %s (%s)" % (config.drop_caches_path, exc, decision.reasons[0]))
        else:
            after = decide(read_meminfo(config.meminfo_path), config.threshold_bytes, config.floor_bytes)
            log(LOG_NOTICE, "flushed page cache in %.2fs: page_cache before=%d (%s) after=%d (%s); mem_available before=%d (%s) after=%d (%s)"
                % (time.monotonic() - started, decision.page_cache, gib(decision.page_cache), after.page_cache, gib(after.page_cache),
                   decision.mem_available, gib(decision.mem_available), after.mem_available, gib(after.mem_available)))
            decision = after
    state, event = watchdog_step(state, decision.low_memory, now)
    if event in ("enter", "remind"):
        prefix = "LOW MEMORY" if event == "enter" else "STILL LOW MEMORY"
        reason = below_floor(decision.mem_available, config.floor_bytes)
        if config.action == "stop_container":
            stopped, output = stop_container(config.docker_bin, config.container_name)
            ok = ok and stopped
            log(LOG_ERR, "%s: %s; action stop_container: docker stop %s %s%s" % (
                prefix, reason, config.container_name, "succeeded" if stopped else "FAILED", (": " + output) if output else ""))
        else:
            log(LOG_ERR, "%s: %s; action log: nothing stopped" % (prefix, reason))
    elif event == "recover":
        log(LOG_NOTICE, "memory recovered: MemAvailable %d B (%s) is at or above the floor %d B (%s)"
            % (decision.mem_available, gib(decision.mem_available), config.floor_bytes, gib(config.floor_bytes)))
    below = ", BELOW FLOOR" if decision.low_memory else ""
    sd_notify("STATUS=page cache %s, MemAvailable %s%s" % (gib(decision.page_cache), gib(decision.mem_available), below))
    return state, ok


def parse_docker_time(text: str) -> float | None:
    """Seconds since the epoch of Docker's RFC 3339 time with nanoseconds (2026-12-02T03:18:45.123456789Z)."""
    text = text.strip()
    if not text or text.startswith("0001-"):
        return None
    main, _dot, rest = text.partition(".")
    zone = "Z"
    if rest:
        digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits):] or "Z"
        fraction = float("0." + digits) if digits else 0.0
    else:
        if main.endswith("Z"):
            main = main[:-1]
        elif len(main) > 19:
            main, zone = main[:19], main[19:]
        fraction = 0.0
    try:
        stamp = calendar.timegm(time.strptime(main[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    if zone not in ("Z", ""):
        sign = 1 if zone[0] == "+" else -1
        hours, _colon, minutes = zone[1:].partition(":")
        try:
            stamp -= sign * (int(hours) * 3600 + int(minutes or 0) * 60)
        except ValueError:
            return None
    return stamp + fraction


def in_load_window(state_text: str, now: float, window: int) -> tuple:
    """From `docker inspect --format '{{.State.Running}} {{.State.StartedAt}}'`: (active, why)."""
    parts = state_text.split()
    if len(parts) != 2 or parts[0] != "true":
        return False, "not running"
    started = parse_docker_time(parts[1])
    if started is None:
        return False, "unreadable start time %r" % parts[1]
    age = now - started
    if age < window:
        return True, "started %.0f s ago at %s (load window %d s)" % (age, parts[1], window)
    return False, "serving since %s for %.0f s (past the load window of %d s)" % (parts[1], age, window)


def running_start(state_text: str) -> str:
    """The StartedAt of a running container from `docker inspect --format '{{.State.Running}} {{.State.StartedAt}}'`,
    or "" when it is not running (or docker could not say)."""
    parts = state_text.split()
    return parts[1] if len(parts) == 2 and parts[0] == "true" else ""


def load_end_line(text: str) -> str | None:
    """The first line of `text` (a container's log) that says a load is over (LOAD_END_PATTERNS), stripped.
    str.splitlines ends a line at a progress bar's bare carriage return too."""
    for raw in text.splitlines():
        if any(pattern.search(raw) for pattern in LOAD_END_PATTERNS):
            return raw.strip()
    return None


class LoadEnd:
    """Whether the followed container's current start has ended its load, from its log read a piece at a time.

    `read_log(since)` returns the log's lines from `since` (seconds since the epoch) on, or None when it cannot be
    read. Each start (its StartedAt) is read from its beginning; then each call reads only what came since the last
    read (from one second before it: a line is read twice rather than missed). Once the end is seen, that start's
    log is not read again.
    """

    def __init__(self, read_log) -> None:
        self.read_log = read_log
        self.start = ""
        self.since = 0.0
        self.line = None
        self.unreadable = False

    def ended(self, state_text: str, now: float) -> str | None:
        """The line that ended the load of the start `state_text` describes (docker inspect's Running StartedAt),
        or None while it loads or its log cannot be read."""
        parts = state_text.split()
        start = parts[1] if len(parts) == 2 else ""
        if start != self.start:
            started = parse_docker_time(start)
            self.start, self.line, self.unreadable = start, None, False
            self.since = (started if started is not None else now) - 1
        if self.line is None:
            text = self.read_log(self.since)
            self.unreadable = text is None
            if text is not None:
                self.since = now - 1
                self.line = load_end_line(text)
        return self.line


def follow_log(config: Config, since: float) -> str | None:
    """The followed container's log (stdout and stderr) from `since` on; None when docker cannot give it."""
    command = [config.docker_bin, "logs", "--since", "%.3f" % since, config.follow_container]
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def follow_state(config: Config) -> str:
    command = [config.docker_bin, "inspect", "--format", "{{.State.Running}} {{.State.StartedAt}}", config.follow_container]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def serve(config: Config, stop: threading.Event) -> int:
    """Loop until `stop` is set; return the exit status."""
    state = WatchdogState()
    first = True
    # check_environment() has run: meminfo parses and drop_caches is writable. Ready before the first
    # iteration, whose sync can take a while.
    sd_notify("READY=1")
    shown = None   # (following, StartedAt) as the journal last said it
    load = LoadEnd(lambda since: follow_log(config, since))
    while not stop.is_set():
        if config.follow_container:
            state_text, now = follow_state(config), time.time()
            start = running_start(state_text)
            now_active, why = in_load_window(state_text, now, config.follow_seconds)
            if now_active and config.follow_until_loaded:
                ended = load.ended(state_text, now)
                if ended is not None:
                    now_active, why = False, "started at %s, its load is over (%s)" % (start, ended[-160:])
                elif load.unreadable:
                    why += "; its log cannot be read, so the whole window"
            # a line whenever following starts or ends, and for each new start (one that begins while the
            # previous start still loads, or one whose load was over before a tick saw it): the journal names every
            # start the service saw
            if (now_active, start) != shown:
                log(LOG_INFO, "%s %s: %s" % ("following" if now_active else "idle until the next start of",
                                             config.follow_container, why))
                shown = (now_active, start)
                first = True
            if not now_active:
                sd_notify("STATUS=idle: %s %s" % (config.follow_container, why))
                stop.wait(min(config.interval_seconds, FOLLOW_IDLE_POLL_SECONDS))
                continue
        try:
            state, _ok = run_iteration(config, state, time.monotonic(), verbose=first)
        except (OSError, MeminfoError) as exc:
            log(LOG_ERR, "cannot read %s: %s; exiting" % (config.meminfo_path, exc))
            return EXIT_FAILED
        first = False
        stop.wait(config.interval_seconds)
    return EXIT_OK


def signal_stopper(stop: threading.Event, received: list):
    """A SIGTERM/SIGINT handler that records the signal's name and sets `stop` from a new thread.

    A handler runs in the main thread between two of its bytecodes, possibly inside `stop.wait()` while that holds
    the event's (non-reentrant) lock: `stop.set()` there would wait for that lock forever, and systemd would kill the
    service at its stop timeout. A thread takes the lock once the main thread's wait has released it."""
    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        threading.Thread(target=stop.set, name="stop-on-signal", daemon=True).start()
    return on_signal


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        if args.check_config:
            print(json.dumps({key: getattr(config, key) for key in CONFIG_KEYS}, indent=2, sort_keys=True))
            return EXIT_OK
        check_environment(config)
    except ConfigError as exc:
        log(LOG_ERR, "configuration error: %s" % exc)
        return EXIT_CONFIG
    log(LOG_INFO, "dgxspark-cache-flush starting (pid %d%s): %s" % (os.getpid(), ", once" if args.once else "", describe(config)))
    if args.once:
        try:
            return EXIT_OK if run_iteration(config, WatchdogState(), time.monotonic(), verbose=True)[1] else EXIT_FAILED
        except (OSError, MeminfoError) as exc:
            log(LOG_ERR, "cannot read %s: %s" % (config.meminfo_path, exc))
            return EXIT_FAILED

    stop = threading.Event()
    received = []
    on_signal = signal_stopper(stop, received)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = serve(config, stop)
    if received:
        sd_notify("STOPPING=1")
        log(LOG_INFO, "dgxspark-cache-flush stopping on %s" % received[0])
    return status


if __name__ == "__main__":
    sys.exit(main())
