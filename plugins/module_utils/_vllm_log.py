# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM log text -> startup phase, KV-cache values and engine errors.

Private module: may change at any time. Pure functions over text, no I/O and no Ansible imports, so plain
pytest can drive it with captured logs.

What a line looks like (all decorations optional, in this order)::

    2026-11-30T20:01:02.123456789Z ESC[1;36m(Worker_TP0 pid=123)ESC[0;0m INFO 11-30 20:01:02 [gpu_worker.py:391] msg
    |- docker --timestamps -------| |- vLLM process prefix -------------| |- vLLM level/time/location ------| |-msg

`normalise` strips them and keeps the process name (the rank comes from its ``_TP<k>`` part), the level and
the message. Older vLLM wrote the location as ``file.py:123]`` without the opening bracket; both are accepted.

Only the latest engine start counts. A container that was restarted keeps its old log lines, so
`find_latest_start` looks for start markers:

* hard markers, printed once at the top of every start: ``vLLM API server version`` and ``non-default args:``
  (head, API server) and ``Launching vLLM (v...) headless multiproc executor`` (headless follower);
* a marker opens a new start only when the current start has already shown progress (a phase line beyond
  ``container_started`` or an error line). The head prints two markers back to back, and those belong to one
  start; a start that crashed before any phase line still counts as progress because of its error lines;
* soft marker, only for logs without any hard marker (a trimmed or ``--since`` log): a second
  ``world_size=W rank=R`` line for a rank the current start has already reported opens a new start.

Text before the first marker belongs to no start we can name and is dropped; a log with no marker at all is
parsed whole.
"""
from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PHASES: tuple[str, ...] = ("container_started", "rendezvous", "weights_loaded", "kv_allocated", "api_up")
"""Startup phases in the order an engine goes through them."""

POLICIES: tuple[str, ...] = ("requested", "full")
"""`choose_kv_bytes` policies: fit into the requested utilisation, or fill the GPU."""

_REASON_MAX = 300


class VllmLogError(Exception):
    """Base class for errors raised by this module."""


class NoKvSuggestionError(VllmLogError):
    """No ``--kv-cache-memory=`` suggestion was found where one was needed."""


class KvChoiceError(VllmLogError, ValueError):
    """A KV budget cannot be chosen: unknown policy, negative margin, or nothing left after the margin."""


# ---------------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class LogLine:
    """One normalised log line: decorations removed, message kept with its own leading whitespace."""

    index: int
    message: str
    source: str | None = None
    pid: int | None = None
    level: str | None = None

    @property
    def tp_rank(self) -> int | None:
        """The tensor-parallel rank from a ``Worker_..._TP<k>`` process name, if any."""
        if self.source is None:
            return None
        match = _TP_RANK_RE.search(self.source)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class KvSuggestion:
    """One rank's ``--kv-cache-memory=`` suggestion (vLLM logs one per GPU worker when the flag is unset)."""

    requested_limit_bytes: int
    gpu_limit_bytes: int
    rank: int
    node: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requested_limit_bytes": self.requested_limit_bytes,
            "gpu_limit_bytes": self.gpu_limit_bytes,
            "rank": self.rank,
        }
        if self.node is not None:
            out["node"] = self.node
        return out


@dataclass(frozen=True)
class KvCacheSize:
    """``<pool> KV cache size: N tokens, Maximum concurrency for M tokens per request: X.XXx``."""

    pool: str
    tokens: int
    per_request_tokens: int | None = None
    concurrency: float | None = None


@dataclass(frozen=True)
class CpuKvCache:
    """CPU backend: ``Explicitly set (kv/total) GiB for KV cache on node N.`` or ``Auto set (...) ...``."""

    kv_gib: float
    total_gib: float
    mode: str  # "explicit" or "auto"
    numa_node: int

    def as_dict(self) -> dict[str, Any]:
        return {"kv_gib": self.kv_gib, "total_gib": self.total_gib, "mode": self.mode, "numa_node": self.numa_node}


@dataclass(frozen=True)
class EngineError:
    """The most specific fatal error found, with the line that proved it."""

    reason: str
    line: str
    priority: int
    index: int


@dataclass(frozen=True)
class LogReport:
    """Everything `parse_log` reads from one node's log (latest start only)."""

    suggestions: tuple[KvSuggestion, ...] = ()
    estimated_max_model_len: int | None = None
    kv_cache: KvCacheSize | None = None
    available_kv_cache_gib: float | None = None
    cpu_kv_cache: CpuKvCache | None = None
    phase: str = PHASES[0]
    phase_line: str | None = None
    engine_error: str | None = None
    error_line: str | None = None
    starts_seen: int = 0
    last_line: str | None = None
    shards_done: int | None = None
    shards_total: int | None = None
    progress_lines: int = 0
    start_seen: bool = False

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        """The smallest requested-limit suggestion across ranks, or None without suggestions."""
        if not self.suggestions:
            return None
        return min(s.requested_limit_bytes for s in self.suggestions)

    def as_dict(self) -> dict[str, Any]:
        """The shape `vllm_kv_estimate_info` returns."""
        kv = self.kv_cache
        return {
            "suggestions": [s.as_dict() for s in self.suggestions],
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "estimated_max_model_len": self.estimated_max_model_len,
            "kv_cache_tokens": kv.tokens if kv else None,
            "kv_cache_pool": kv.pool if kv else None,
            "max_concurrency": kv.concurrency if kv else None,
            "available_kv_cache_gib": self.available_kv_cache_gib,
            "cpu_kv_cache": self.cpu_kv_cache.as_dict() if self.cpu_kv_cache else None,
            "phase": self.phase,
            "phase_line": self.phase_line,
            "engine_error": self.engine_error,
            "error_line": self.error_line,
            "starts_seen": self.starts_seen,
            "last_line": self.last_line,
            "shards_done": self.shards_done,
            "shards_total": self.shards_total,
            "progress_lines": self.progress_lines,
            "start_seen": self.start_seen,
        }


@dataclass(frozen=True)
class ClusterReport:
    """Several nodes' reports merged: the cluster is only as far as its slowest node."""

    suggestions: tuple[KvSuggestion, ...] = ()
    estimated_max_model_len: int | None = None
    phase: str = PHASES[0]
    phases: Mapping[str, str] = field(default_factory=dict)
    engine_errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        """The smallest requested-limit suggestion across all ranks of all nodes."""
        if not self.suggestions:
            return None
        return min(s.requested_limit_bytes for s in self.suggestions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "suggestions": [s.as_dict() for s in self.suggestions],
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "estimated_max_model_len": self.estimated_max_model_len,
            "phase": self.phase,
            "phases": dict(self.phases),
            "engine_errors": dict(self.engine_errors),
        }


# ---------------------------------------------------------------------------------------------------------
# Normalisation

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_DOCKER_TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2}) ?")
_PROC_RE = re.compile(r"^\((?P<name>[A-Za-z_][\w.-]*) pid=(?P<pid>\d+)\) ?")
_LEVEL_RE = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? "
    r"\[?[^\s\]]+:\d+\] ?"
)
_TP_RANK_RE = re.compile(r"_TP(\d+)(?:_|$)")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colours, cursor moves)."""
    return _ANSI_RE.sub("", text)


def normalise_line(raw: str, index: int = 0) -> LogLine:
    """Strip Docker timestamp, ANSI colours, ``(Name pid=N)`` prefixes and vLLM's level/time/location prefix."""
    text = strip_ansi(raw).rstrip("\r\n")
    text = _DOCKER_TS_RE.sub("", text, count=1)
    source: str | None = None
    pid: int | None = None
    # Prefixes can nest when one process relays another's output: the innermost one names the writer.
    while True:
        match = _PROC_RE.match(text)
        if not match:
            break
        source, pid = match.group("name"), int(match.group("pid"))
        text = text[match.end():]
    level: str | None = None
    match = _LEVEL_RE.match(text)
    if match:
        level = match.group("level")
        text = text[match.end():]
    return LogLine(index=index, message=text.rstrip(), source=source, pid=pid, level=level)


def normalise(text: str) -> list[LogLine]:
    """Split log text into normalised lines (``\\r\\n``, ``\\n`` and progress-bar ``\\r`` all end a line)."""
    return [normalise_line(raw, i) for i, raw in enumerate(text.splitlines())]


# ---------------------------------------------------------------------------------------------------------
# Start markers and phases

_START_MARKERS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bvLLM API server version\b"),
    re.compile(r"\bnon-default args:"),
    re.compile(r"\bLaunching vLLM\b.*\bheadless\b"),
)
_WORLD_RE = re.compile(r"\bworld_size=(?P<world>\d+) rank=(?P<rank>\d+)\b")

_PHASE_PATTERNS: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("rendezvous", (
        _WORLD_RE,
        re.compile(r"\bLaunching vLLM\b.*\bheadless multiproc executor\b"),
    )),
    ("weights_loaded", (
        re.compile(r"\bLoading weights took\b"),
        re.compile(r"\bModel loading took\b"),
    )),
    ("kv_allocated", (
        re.compile(r"\bKV cache size: [\d,]+ tokens\b"),
        re.compile(r"\bGiB (?:memory )?for KV cache\b", re.IGNORECASE),
        re.compile(r"\bAvailable KV cache memory:"),
        re.compile(r"Replace gpu_memory_utilization(?: config)? with `--kv-cache-memory="),
    )),
    ("api_up", (
        re.compile(r"\bStarting vLLM (?:API )?server (?:\d+ )?on\b"),
        re.compile(r"\bApplication startup complete\."),
    )),
)


def phase_index(phase: str) -> int:
    """Position of a phase name in `PHASES` (ValueError for an unknown name)."""
    return PHASES.index(phase)


def line_phase(line: LogLine) -> str | None:
    """The phase a single line proves, or None."""
    for phase, patterns in reversed(_PHASE_PATTERNS):
        if any(p.search(line.message) for p in patterns):
            return phase
    return None


def _is_start_marker(line: LogLine) -> bool:
    return any(p.search(line.message) for p in _START_MARKERS)


def notable_line(raw: str) -> bool:
    """Whether one raw log line may move a wait on: it proves a phase, marks an engine's start, or is an error.

    A wait that follows the log as it is written polls again at once on such a line instead of at its next
    interval; the other lines (progress bars, routine INFO) leave the interval as it is."""
    line = normalise_line(raw)
    return line_phase(line) is not None or _is_start_marker(line) or _is_error_line(line)


_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})


def _is_error_line(line: LogLine) -> bool:
    if line.level in ("ERROR", "CRITICAL"):
        return True
    if line.level in _QUIET_LEVELS:
        return False
    return line.message.startswith("Traceback (most recent call last)") or _specific_error(line) is not None


def find_latest_start(lines: Sequence[LogLine]) -> tuple[int, int]:
    """Return (index into lines where the latest start begins, number of starts seen).

    See the module docstring for the marker rules. A log without markers is one start from line 0 (zero
    starts for empty text).
    """
    start = 0
    starts = 0
    progress = False
    hard_seen = False
    world_ranks: set[int] = set()
    for pos, line in enumerate(lines):
        if _is_start_marker(line):
            hard_seen = True
            if starts == 0 or progress:
                start, starts, progress = pos, starts + 1, False
        world = _WORLD_RE.search(line.message)
        if world and not hard_seen:
            rank = int(world.group("rank"))
            if rank in world_ranks:
                # the same rank joining again, and no hard marker anywhere: a restart
                start, starts, progress = pos, max(starts, 1) + 1, False
                world_ranks = set()
            world_ranks.add(rank)
        if line_phase(line) is not None or _is_error_line(line):
            progress = True
    if starts == 0 and any(line.message.strip() for line in lines):
        starts = 1
    return start, starts


def detect_phase(lines: Sequence[LogLine]) -> tuple[str, str | None]:
    """Highest phase reached, and the (first) line that proved it; ``container_started``/None when nothing did."""
    best = 0
    proof: str | None = None
    for line in lines:
        phase = line_phase(line)
        if phase is None:
            continue
        pos = phase_index(phase)
        if pos > best:
            best, proof = pos, line.message.strip()
    return PHASES[best], proof


# ---------------------------------------------------------------------------------------------------------
# KV values

_SUGGESTION_RE = re.compile(
    r"Replace gpu_memory_utilization(?: config)? with `--kv-cache-memory=(?P<req>\d+)`"
    r"(?: \((?P<req_gib>[\d.]+) GiB\))? to fit into requested memory, or "
    r"`--kv-cache-memory=(?P<full>\d+)`(?: \((?P<full_gib>[\d.]+) GiB\))? to fully utilize"
)
_MAX_LEN_RE = re.compile(r"estimated maximum model length is (?P<n>\d[\d,]*)")
_KV_SIZE_RE = re.compile(r"(?P<pool>\b[A-Za-z]+(?: \+ [A-Za-z]+)?) KV cache size: (?P<tokens>\d[\d,]*) tokens")
_CONCURRENCY_RE = re.compile(
    r"Maximum concurrency for (?P<per>\d[\d,]*) tokens per request: (?P<conc>\d[\d,]*(?:\.\d+)?)x"
)
_AVAILABLE_RE = re.compile(r"Available KV cache memory: (?P<gib>-?\d+(?:\.\d+)?) GiB")
_CPU_KV_RE = re.compile(
    r"\b(?P<mode>Explicitly|Auto) set \((?P<kv>\d+(?:\.\d+)?)/(?P<total>\d+(?:\.\d+)?)\) GiB "
    r"for KV cache on node (?P<node>\d+)"
)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_kv_suggestions(lines: Iterable[LogLine]) -> list[KvSuggestion]:
    """Every ``--kv-cache-memory=`` suggestion line, in log order.

    The rank comes from the ``Worker_TP<k>`` process prefix; without one (TP=1 runs the worker inside
    EngineCore) it is the line's position among the suggestions of this log.
    """
    out: list[KvSuggestion] = []
    for line in lines:
        match = _SUGGESTION_RE.search(line.message)
        if not match:
            continue
        rank = line.tp_rank
        out.append(KvSuggestion(
            requested_limit_bytes=int(match.group("req")),
            gpu_limit_bytes=int(match.group("full")),
            rank=rank if rank is not None else len(out),
        ))
    return out


def parse_estimated_max_model_len(lines: Iterable[LogLine]) -> int | None:
    """N from ``Based on the available memory, the estimated maximum model length is N.`` (smallest if several)."""
    values = [_int(m.group("n")) for m in (_MAX_LEN_RE.search(line.message) for line in lines) if m]
    return min(values) if values else None


def parse_kv_cache_size(lines: Sequence[LogLine]) -> KvCacheSize | None:
    """The pool line (smallest pool if several engines logged one).

    Older vLLM printed ``Maximum concurrency ...`` on the next line of the same process; that is accepted.
    """
    found: list[KvCacheSize] = []
    for pos, line in enumerate(lines):
        match = _KV_SIZE_RE.search(line.message)
        if not match:
            continue
        conc = _CONCURRENCY_RE.search(line.message)
        if conc is None:
            for later in lines[pos + 1:pos + 4]:
                if later.source == line.source and later.pid == line.pid:
                    conc = _CONCURRENCY_RE.search(later.message)
                    break
        found.append(KvCacheSize(
            pool=match.group("pool"),
            tokens=_int(match.group("tokens")),
            per_request_tokens=_int(conc.group("per")) if conc else None,
            concurrency=float(conc.group("conc").replace(",", "")) if conc else None,
        ))
    return min(found, key=lambda k: k.tokens) if found else None


def parse_available_kv_cache_gib(lines: Iterable[LogLine]) -> float | None:
    """``Available KV cache memory: X GiB`` (smallest if several ranks logged it)."""
    values = [float(m.group("gib")) for m in (_AVAILABLE_RE.search(line.message) for line in lines) if m]
    return min(values) if values else None


def parse_cpu_kv_cache(lines: Iterable[LogLine]) -> CpuKvCache | None:
    """CPU backend's ``Explicitly set``/``Auto set (kv/total) GiB for KV cache on node N`` (smallest kv)."""
    found = [
        CpuKvCache(
            kv_gib=float(m.group("kv")),
            total_gib=float(m.group("total")),
            mode="explicit" if m.group("mode") == "Explicitly" else "auto",
            numa_node=int(m.group("node")),
        )
        for m in (_CPU_KV_RE.search(line.message) for line in lines)
        if m
    ]
    return min(found, key=lambda c: c.kv_gib) if found else None


# ---------------------------------------------------------------------------------------------------------
# Engine errors
#
# Priorities, most specific first. Among the generic group (a traceback's exception, a worker that died) the
# earliest wins: it is the root cause, the rest are consequences.

_P_FOLLOWER = 10
_P_MAX_LEN = 20
_P_RENDEZVOUS = 30
_P_ADDR_IN_USE = 40
_P_OOM = 50
_P_GENERIC = 60
_P_WORKERPROC = 70
_P_ENGINE_INIT = 80
_P_INTERRUPTED = 90

_FOLLOWER_RE = re.compile(r"collective_rpc should not be called on follower node")
_RENDEZVOUS_RE = re.compile(
    r"Timed out after (?P<secs>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<total>\d+) clients joined"
)
_ADDR_IN_USE_RE = re.compile(r"EADDRINUSE")
_PORT_RE = re.compile(r"\bport: (?P<port>\d+)")
_OOM_RE = re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|\bOutOfMemoryError\b|Cannot allocate memory")
_DIED_RE = re.compile(r"Worker proc (?P<name>\S+) died unexpectedly(?: \(exit code: (?P<code>-?\d+)\))?")
_WORKERPROC_RE = re.compile(r"WorkerProc failed to start")
_ENGINE_INIT_RE = re.compile(r"Engine core initialization failed")
_EXCEPTION_RE = re.compile(r"^(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?:: (?P<msg>.*))?$")
_INTERRUPTS = frozenset({"KeyboardInterrupt", "SystemExit"})
_CHAIN_LINES = ("During handling of the above exception", "The above exception was the direct cause")


def _shorten(text: str, limit: int = _REASON_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _exit_code_text(code: str | None) -> str:
    if code is None:
        return ""
    value = int(code)
    if value < 0:
        try:
            return f" (exit code {value}, {signal.Signals(-value).name})"
        except ValueError:
            return f" (exit code {value})"
    return f" (exit code {value})"


def _specific_error(line: LogLine) -> tuple[int, str] | None:
    """A (priority, reason) for a line that names a known failure by itself."""
    msg = line.message
    if _FOLLOWER_RE.search(msg):
        return _P_FOLLOWER, "worker started without --headless (follower assertion)"
    match = _MAX_LEN_RE.search(msg)
    if match:
        return _P_MAX_LEN, (
            "max-model-len does not fit the KV cache: the estimated maximum model length is "
            f"{_int(match.group('n'))}"
        )
    match = _RENDEZVOUS_RE.search(msg)
    if match:
        return _P_RENDEZVOUS, (
            f"rendezvous timed out after {match.group('secs')} s: {match.group('joined')}/{match.group('total')} "
            "clients joined (is every node started and able to reach --master-addr:--master-port?)"
        )
    if _ADDR_IN_USE_RE.search(msg):
        port = _PORT_RE.search(msg)
        where = f"master port {port.group('port')}" if port else "master port"
        return _P_ADDR_IN_USE, f"{where} already in use (EADDRINUSE): an earlier engine may still hold it"
    if _OOM_RE.search(msg):
        return _P_OOM, "out of memory: " + _shorten(msg.strip(), 200)
    match = _DIED_RE.search(msg)
    if match:
        return _P_GENERIC, (
            f"worker process {match.group('name')} died unexpectedly{_exit_code_text(match.group('code'))}"
        )
    if _WORKERPROC_RE.search(msg):
        return _P_WORKERPROC, "worker process failed to start (WorkerProc failed to start)"
    if _ENGINE_INIT_RE.search(msg):
        return _P_ENGINE_INIT, "engine core initialization failed"
    return None


def _traceback_exceptions(lines: Sequence[LogLine]) -> list[tuple[LogLine, str, str]]:
    """(line, exception name, message) for each exception line that ends a traceback, per writing process."""
    open_tracebacks: set[tuple[str | None, int | None]] = set()
    out: list[tuple[LogLine, str, str]] = []
    for line in lines:
        if line.level in _QUIET_LEVELS:
            continue
        key = (line.source, line.pid)
        msg = line.message
        if msg.startswith("Traceback (most recent call last)"):
            open_tracebacks.add(key)
            continue
        if key not in open_tracebacks:
            continue
        if not msg.strip() or msg[:1].isspace() or msg.lstrip().startswith(("^", "~")):
            continue
        match = _EXCEPTION_RE.match(msg)
        if match:
            out.append((line, match.group("exc"), match.group("msg") or ""))
        open_tracebacks.discard(key)
    return out


def detect_engine_error(lines: Sequence[LogLine]) -> EngineError | None:
    """The most specific fatal error in the lines, or None.

    Lines logged by vLLM at DEBUG/INFO/WARNING never count (vLLM logs some harmless tracebacks as warnings).
    """
    candidates: list[EngineError] = []
    for line in lines:
        if line.level in _QUIET_LEVELS:
            continue
        found = _specific_error(line)
        if found is not None:
            candidates.append(EngineError(reason=found[1], line=line.message.strip(), priority=found[0],
                                          index=line.index))
    for line, exc, msg in _traceback_exceptions(lines):
        if _specific_error(line) is not None:
            continue  # already a candidate with a better reason
        short = exc.rsplit(".", 1)[-1]
        if short in _INTERRUPTS:
            priority, reason = _P_INTERRUPTED, f"{exc} (engine stopped by a signal or by request)"
        else:
            priority, reason = _P_GENERIC, _shorten(f"{exc}: {msg}" if msg else exc)
        candidates.append(EngineError(reason=reason, line=line.message.strip(), priority=priority,
                                      index=line.index))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c.priority, c.index))


# ---------------------------------------------------------------------------------------------------------
# Load progress

# vLLM's own checkpoint progress bar (rank 0 only; its bar format ends every update with a newline, so each
# update is a log line): ``Loading safetensors checkpoint shards:  50% Completed | 40/80 [01:02<01:02, 0.6it/s]``
_SHARDS_RE = re.compile(r"\bcheckpoint shards(?: \([a-z]+\))?: *\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)\b")
# Lines an engine prints while it waits on another rank: they say time passes, not that the load moves.
_WAIT_NOTICE_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bNo available shared memory broadcast block found in \d+ seconds?\b"),
)


def parse_shards(lines: Iterable[LogLine]) -> tuple[int | None, int | None]:
    """(shards loaded, shards in all) from the latest checkpoint progress line, or (None, None)."""
    done: int | None = None
    total: int | None = None
    for line in lines:
        match = _SHARDS_RE.search(line.message)
        if match:
            done, total = int(match.group("done")), int(match.group("total"))
    return done, total


def count_progress_lines(lines: Iterable[LogLine]) -> int:
    """Non-blank lines that show the engine doing something (wait notices excluded)."""
    return sum(1 for line in lines
               if line.message.strip() and not any(p.search(line.message) for p in _WAIT_NOTICE_RES))


# ---------------------------------------------------------------------------------------------------------
# Top level


def parse_log(text: str) -> LogReport:
    """Parse one node's log text (latest start only)."""
    lines = normalise(text)
    start, starts = find_latest_start(lines)
    current = lines[start:]
    phase, phase_line = detect_phase(current)
    error = detect_engine_error(current)
    last = next((line.message.strip() for line in reversed(current) if line.message.strip()), None)
    shards = parse_shards(current)
    return LogReport(
        suggestions=tuple(parse_kv_suggestions(current)),
        estimated_max_model_len=parse_estimated_max_model_len(current),
        kv_cache=parse_kv_cache_size(current),
        available_kv_cache_gib=parse_available_kv_cache_gib(current),
        cpu_kv_cache=parse_cpu_kv_cache(current),
        phase=phase,
        phase_line=phase_line,
        engine_error=error.reason if error else None,
        error_line=error.line if error else None,
        starts_seen=starts,
        last_line=last,
        shards_done=shards[0],
        shards_total=shards[1],
        progress_lines=count_progress_lines(current),
        # the latest start's first line (a hard start marker) is still in the log: its phases are all there;
        # without it (rotated away by the json-file log's max-size) the phase is a lower bound
        start_seen=bool(current) and _is_start_marker(current[0]),
    )


def choose_kv_bytes(suggestions: Sequence[KvSuggestion], policy: str = "requested", margin_bytes: int = 0) -> int:
    """KV budget in bytes: the minimum across ranks of the chosen field, minus a safety margin.

    ``requested`` uses ``requested_limit_bytes`` (fits the requested gpu_memory_utilization), ``full`` uses
    ``gpu_limit_bytes`` (fills the GPU). Raises `NoKvSuggestionError` without suggestions and `KvChoiceError`
    for an unknown policy, a negative margin, or a result that is not positive.
    """
    if policy not in POLICIES:
        raise KvChoiceError(f"unknown KV policy {policy!r}: use one of {', '.join(POLICIES)}")
    if margin_bytes < 0:
        raise KvChoiceError(f"margin_bytes must be >= 0, got {margin_bytes}")
    if not suggestions:
        raise NoKvSuggestionError(
            "no `--kv-cache-memory=` suggestion in the log: launch once without --kv-cache-memory-bytes and "
            "let the engine finish memory profiling (the line is GPU-only; the CPU backend never prints it)"
        )
    if policy == "requested":
        smallest = min(s.requested_limit_bytes for s in suggestions)
    else:
        smallest = min(s.gpu_limit_bytes for s in suggestions)
    value = smallest - margin_bytes
    if value <= 0:
        raise KvChoiceError(
            f"no KV budget left: smallest {policy} suggestion is {smallest} bytes and the margin is "
            f"{margin_bytes} bytes"
        )
    return value


def merge_reports(reports: Mapping[str, LogReport]) -> ClusterReport:
    """Merge node name -> report: suggestions of all ranks of all nodes (tagged with the node), the smallest
    estimated maximum model length, the lowest phase (the cluster waits for its slowest node) and each
    node's engine error."""
    suggestions: list[KvSuggestion] = []
    max_lens: list[int] = []
    phases: dict[str, str] = {}
    errors: dict[str, str] = {}
    for node, report in reports.items():
        suggestions.extend(
            KvSuggestion(s.requested_limit_bytes, s.gpu_limit_bytes, s.rank, node) for s in report.suggestions
        )
        if report.estimated_max_model_len is not None:
            max_lens.append(report.estimated_max_model_len)
        phases[node] = report.phase
        if report.engine_error is not None:
            errors[node] = report.engine_error
    lowest = min((phase_index(p) for p in phases.values()), default=0)
    return ClusterReport(
        suggestions=tuple(suggestions),
        estimated_max_model_len=min(max_lens) if max_lens else None,
        phase=PHASES[lowest],
        phases=phases,
        engine_errors=errors,
    )
