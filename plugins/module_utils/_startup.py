# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Startup watching for one vLLM rank: phase budgets, dead-peer detection, a verdict with its evidence.

Private to the collection; may change at any time. Pure: observations come in, verdicts go out; the
module that uses it does the I/O (docker inspect, docker logs, /proc/net/tcp) and the clock.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import PHASES, LogReport

# The one definition of the phase budgets: the configuration step's defaults (``_timing``, the ``timing`` part of
# ``dgxspark_vllm_config``) start from these, and the launch, the EXL3 kit and the guard read that fact.
DEFAULT_BUDGETS: dict[str, float] = {
    "container_started": 120.0,    # from `docker run` to a running container (the image is staged)
    "rendezvous": 300.0,       # from running to the distributed rendezvous line
    "weights_loaded": 1800.0,  # 185 GB from NVMe per node
    "kv_allocated": 1800.0,    # profiling, KV allocation (and CUDA graphs when not eager)
    "api_up": 900.0,           # warm-up, API server start
}


class StartupError(ValueError):
    """Bad options for the startup watcher."""


@dataclass(frozen=True)
class Observation:
    """What one poll saw on the node."""

    now: float
    exists: bool
    running: bool
    exit_code: int | None = None
    phase: str | None = None          # highest phase the log proves (None: nothing yet)
    engine_error: str | None = None   # short reason when the log shows a fatal error
    peers_connected: frozenset[str] = frozenset()
    paused: bool = False              # `docker pause`d (frozen): still "running" to Docker
    progress: tuple | None = None     # what moves while the engine works (see `progress_mark`); None: not read
    shards: tuple[int, int] | None = None   # checkpoint shards (loaded, in all), from the log's progress bar
    last_line: str | None = None


def progress_mark(phase: str | None, shards_done: int | None, progress_lines: int) -> tuple:
    """The part of a rank's log that moves while its engine works: phase, shards loaded, lines written."""
    return (phase, shards_done, progress_lines)


def observe(now: float, exists: bool, running: bool, exit_code: int | None, report: LogReport | None,
            peers_connected: frozenset[str] = frozenset(), paused: bool = False) -> Observation:
    """One poll's observation from the container's state and its log's report (None: no log read).

    A stopped container's log proves only the phases it reached beyond a running container."""
    if report is None:
        return Observation(now=now, exists=exists, running=running, exit_code=exit_code,
                           peers_connected=peers_connected, paused=paused)
    return Observation(
        now=now, exists=exists, running=running, exit_code=exit_code,
        phase=report.phase if running or report.phase != PHASES[0] else None,
        engine_error=report.engine_error, peers_connected=peers_connected, paused=paused,
        progress=progress_mark(report.phase, report.shards_done, report.progress_lines),
        shards=(report.shards_done, report.shards_total) if report.shards_total else None,
        last_line=report.last_line)


@dataclass
class Verdict:
    status: str                       # waiting | done | failed
    phase: str | None
    reason: str | None = None
    phase_reached_at: dict[str, float] = field(default_factory=dict)
    progress: dict = field(default_factory=dict)


@dataclass
class Watch:
    """State across polls for one rank."""

    target: str
    budgets: dict[str, float]
    started: float
    peers: tuple[str, ...] = ()
    peer_grace: float = 30.0
    peers_after: str = "rendezvous"
    reached: dict[str, float] = field(default_factory=dict)
    peers_seen: dict[str, float] = field(default_factory=dict)
    stall_seconds: float | None = None
    progress_mark: tuple | None = None
    progress_at: float | None = None
    first_shards: tuple[float, int] | None = None   # (when, shards loaded) at the first shard line seen


def phase_index(phase: str | None) -> int:
    """Position of a phase (-1 for None); StartupError for an unknown name."""
    if phase is None:
        return -1
    if phase not in PHASES:
        raise StartupError(f"unknown phase {phase!r}: expected one of {', '.join(PHASES)}")
    return PHASES.index(phase)


def make_watch(target: str, budgets: dict[str, float] | None, started: float, peers: list[str] | None = None,
               peer_grace: float = 30.0, peers_after: str = "rendezvous", stall_seconds: float | None = None) -> Watch:
    """Validate options and start a watch.

    With `stall_seconds`, a rank whose log has not moved (`Observation.progress`) for that long fails the wait,
    counted from when every peer is connected (the group is together; before that a rank may wait on the others
    for as long as their own start takes, which the phase budgets bound).
    """
    phase_index(target)
    phase_index(peers_after)
    merged = dict(DEFAULT_BUDGETS)
    for name, value in (budgets or {}).items():
        phase_index(name)
        try:
            seconds = float(value)
        except (TypeError, ValueError) as exc:
            raise StartupError(f"budget for phase {name!r} must be a number of seconds, got {value!r}") from exc
        if seconds <= 0:
            raise StartupError(f"budget for phase {name!r} must be positive, got {value!r}")
        merged[name] = seconds
    if peer_grace <= 0:
        raise StartupError(f"peer_grace_seconds must be positive, got {peer_grace!r}")
    if stall_seconds is not None and stall_seconds <= 0:
        raise StartupError(
            f"stall_seconds must be positive (or unset to turn stall detection off), got {stall_seconds!r}")
    for peer in peers or []:
        try:
            ipaddress.ip_address(peer)
        except ValueError as exc:
            raise StartupError(f"peer {peer!r} is not an IP address: give the peers' CX7 IPs") from exc
    return Watch(target=target, budgets=merged, started=started, peers=tuple(peers or ()), peer_grace=peer_grace,
                 peers_after=peers_after, stall_seconds=stall_seconds)


def progress_report(watch: Watch, obs: Observation, phase: str | None) -> dict:
    """Where the rank's load stands, for a person watching: phase, shards N/M and their rate, the quiet time."""
    done, total = obs.shards if obs.shards else (None, None)
    rate = None
    if done is not None and watch.first_shards is not None:
        t0, n0 = watch.first_shards
        if obs.now > t0 and done > n0:
            rate = round((done - n0) * 60.0 / (obs.now - t0), 2)
    quiet = None if watch.progress_at is None else round(obs.now - watch.progress_at, 1)
    return {"phase": phase, "shards_done": done, "shards_total": total, "shards_per_minute": rate,
            "seconds_without_progress": quiet, "stall_seconds": watch.stall_seconds, "paused": obs.paused,
            "last_line": obs.last_line}


def describe_progress(progress: dict) -> str:
    """One line for a person watching a load: phase, shards N/M and their rate, quiet time against the stall timeout."""
    parts = [f"phase {progress.get('phase') or 'none'}"]
    if progress.get("shards_total"):
        rate = progress.get("shards_per_minute")
        parts.append(f"checkpoint shards {progress.get('shards_done')}/{progress['shards_total']}"
                     + (f" at {rate:g} per minute" if rate else ""))
    quiet = progress.get("seconds_without_progress")
    if quiet is None:
        parts.append("waiting for every rank to connect")
    else:
        stall = progress.get("stall_seconds")
        parts.append(f"last progress {quiet:.0f} s ago" + (f" (stall timeout {stall:.0f} s)" if stall else ""))
    if progress.get("paused"):
        parts.append("PAUSED")
    return ", ".join(parts)


def step(watch: Watch, obs: Observation) -> Verdict:
    """Fold one observation into the watch and say where the rank stands."""
    if obs.exists and obs.running:
        watch.reached.setdefault(PHASES[0], obs.now)
    current = _highest(watch, obs)
    if current is not None:
        for name in PHASES[: phase_index(current) + 1]:
            watch.reached.setdefault(name, obs.now)
    for peer in obs.peers_connected:
        watch.peers_seen[peer] = obs.now
    together = all(peer in watch.peers_seen for peer in watch.peers)
    if obs.progress is not None and together and (watch.progress_at is None or obs.progress != watch.progress_mark):
        watch.progress_mark, watch.progress_at = obs.progress, obs.now
    if obs.shards is not None and watch.first_shards is None:
        watch.first_shards = (obs.now, obs.shards[0])

    def verdict(status: str, reason: str | None = None) -> Verdict:
        return Verdict(status=status, phase=current, reason=reason, phase_reached_at=dict(watch.reached),
                       progress=progress_report(watch, obs, current))

    if obs.engine_error:
        return verdict("failed", f"engine error: {obs.engine_error}")
    if watch.reached.get(PHASES[0]) is not None and not obs.running:
        code = "" if obs.exit_code is None else f" (exit code {obs.exit_code})"
        return verdict("failed", f"container stopped{code} after reaching phase {current or 'none'}")
    # a container that exited with an error before any poll saw it run (an engine that fails at once): not a start
    # still to come, so its budget is not waited out (a container created but not yet started has exit code 0)
    if obs.exists and not obs.running and obs.exit_code not in (None, 0):
        return verdict("failed", f"container exited (exit code {obs.exit_code}) before any poll saw it running: the "
                       f"engine failed at once; last line: {obs.last_line or 'none'}")
    if phase_index(current) >= phase_index(watch.target):
        return verdict("done")
    # dead peers: once this rank passed `peers_after`, every peer must hold a connection to it
    after = watch.reached.get(watch.peers_after)
    if watch.peers and after is not None:
        for peer in watch.peers:
            last = watch.peers_seen.get(peer, after)
            if obs.now - last > watch.peer_grace:
                what = "dropped its connection" if peer in watch.peers_seen else "never connected"
                return verdict("failed", f"peer {peer} {what} (no TCP connection for {obs.now - last:.0f} s) "
                               f"while this rank waited in phase {current}: the peer's engine is dead or hung")
    # a stalled load: the group is together and this rank's log has not moved for stall_seconds
    if watch.stall_seconds is not None and watch.progress_at is not None and obs.running:
        quiet = obs.now - watch.progress_at
        if quiet > watch.stall_seconds:
            shards = f", checkpoint shards {obs.shards[0]}/{obs.shards[1]}" if obs.shards else ""
            frozen = "; the container is paused (docker pause)" if obs.paused else ""
            return verdict("failed", f"stalled: no progress for {quiet:.0f} s (stall timeout "
                           f"{watch.stall_seconds:g} s) in phase {current}{shards}{frozen}; "
                           f"last line: {obs.last_line or 'none'}")
    # budget of the next phase, counted from when the previous one was reached
    nxt = PHASES[phase_index(current) + 1]
    since = watch.reached.get(current, watch.started) if current is not None else watch.started
    if obs.now - since > watch.budgets[nxt]:
        if not obs.exists:
            return verdict("failed", f"container does not exist after {obs.now - since:.0f} s")
        return verdict("failed", f"phase '{nxt}' not reached within its budget of {watch.budgets[nxt]:.0f} s "
                       f"(last phase reached: {current or 'none'})")
    return verdict("waiting")


def _highest(watch: Watch, obs: Observation) -> str | None:
    best = max((phase_index(p) for p in watch.reached), default=-1)
    if obs.phase is not None:
        best = max(best, phase_index(obs.phase))
    if obs.exists and obs.running:
        best = max(best, 0)
    return PHASES[best] if best >= 0 else None


def established_peers(proc_net_tcp: str, peers: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The peers (IPv4) with at least one ESTABLISHED TCP connection in a /proc/net/tcp table."""
    wanted = {}
    for peer in peers:
        addr = ipaddress.ip_address(peer)
        if addr.version == 4:
            # /proc/net/tcp prints the address as the in-memory 32-bit word: little-endian hex on x86/arm64
            wanted[addr.packed[::-1].hex().upper()] = peer
    found = set()
    for line in proc_net_tcp.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 4 or cols[3] != "01":
            continue
        remote_ip = cols[2].split(":")[0].upper()
        if remote_ip in wanted:
            found.add(wanted[remote_ip])
    return frozenset(found)
