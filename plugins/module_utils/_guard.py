# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decisions of the group guard: is the serving group broken, restore it now, wait, or give up.

Private to the collection; may change at any time. Pure: the daemon (roles/guard/files/dgxspark_group_guard.py,
which runs on the head and ships this file with it) observes the ranks and the head's API and carries the
decisions out; the guard_config action builds and checks its configuration with the same code. Standard
library only, Python 3.8 or later: it runs on the nodes.

Times are seconds since the epoch (``time.time()``): they are written to the state file and must mean the
same after a reboot.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import time_key
from ansible_collections.dgxspark.vllm.plugins.module_utils._metrics import MetricsError, gauge_sum, parse_text
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import DEFAULT_BUDGETS, StartupError, make_watch

STATUSES = ("armed", "maintenance", "waiting_nodes", "restoring", "backoff", "gave_up", "disarmed")
ROLES = ("head", "worker")
KINDS = ("stopped", "restarted", "api", "unreachable", "absent", "memory")
HISTORY_KEEP = 20
WEBHOOK_EVENTS = ("restored", "restore_failed", "gave_up")
WEBHOOK_TIMEOUT_SECONDS = 5.0       # one POST's limit (connect, then the answer): a slow receiver never holds the guard


class GuardConfigError(ValueError):
    """A guard configuration that cannot be used: ``problems`` lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Rank:
    name: str            # inventory hostname
    role: str            # head | worker
    ssh_host: str        # "" for the head's own engine, else the worker's Host alias in the guard's ssh_config
    cx7_ip: str


@dataclass(frozen=True)
class GuardConfig:
    container: str
    ranks: tuple[Rank, ...]          # the head first, then the workers in rank order
    api_url: str                     # the head's API as the head reaches it, e.g. http://127.0.0.1:8000
    served_model_name: str
    state_path: str
    maintenance_path: str
    interval_seconds: float = 2.0           # between two looks at every rank's container
    probe_interval_seconds: float = 10.0    # between two tiny completions on the head's API
    probe_timeout_seconds: float = 30.0     # one request's limit
    grace_seconds: float = 60.0             # the API failing this long while every container is Up: broken
    stop_seconds: float = 10.0              # docker stop's SIGTERM grace, then docker kill
    poll_seconds: float = 1.0               # between two polls while a restore waits on a rank
    progress_seconds: float = 30.0          # between two progress lines per rank in the journal during a restore
    budgets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    peer_grace_seconds: float = 30.0
    stall_seconds: float | None = None      # a restore's load whose log stands still this long fails (None: off)
    node_wait_seconds: float = 600.0        # how long to wait for a node's Docker to answer (after a reboot)
    backoff_seconds: float = 10.0           # before the 2nd restore in a window; doubled for each further one
    backoff_max_seconds: float = 900.0
    max_failed_restores: int = 3            # failed restores in `window_seconds` before giving up
    window_seconds: float = 3600.0
    stable_seconds: float = 600.0           # a restore whose group broke again sooner counts as failed
    memory_margin_percent: float = 10.0     # MemAvailable before a start may be this much below the last good start's
    memory_wait_seconds: float = 120.0      # how long to wait for it (after dropping the page cache) before giving up
    log_lines: int = 30
    ssh_config: str = "/etc/dgxspark/guard/ssh_config"   # the guard's own ssh_config (its key, the workers' aliases)
    metrics_address: str = ""               # where its Prometheus endpoint listens ("" with port 0: no endpoint)
    metrics_port: int = 0
    webhook_url_file: str = ""              # root's file with the URL the guard notifies ("": none)
    webhook_url: str = field(default="", repr=False)   # that URL, once read (it may carry a token: never shown)

    @property
    def head(self) -> Rank:
        return self.ranks[0]

    @property
    def workers(self) -> tuple[Rank, ...]:
        return self.ranks[1:]


_FLOATS = ("interval_seconds", "probe_interval_seconds", "probe_timeout_seconds", "grace_seconds", "stop_seconds",
           "poll_seconds", "peer_grace_seconds", "node_wait_seconds", "backoff_seconds", "backoff_max_seconds",
           "window_seconds", "stall_seconds", "progress_seconds", "stable_seconds", "memory_margin_percent",
           "memory_wait_seconds")
_INTS = ("max_failed_restores", "log_lines")
_PORTS = ("metrics_port",)
_STRINGS = ("container", "api_url", "served_model_name", "state_path", "maintenance_path")
_OPTIONAL_PATHS = ("ssh_config", "webhook_url_file")
_SSH_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,200}")   # what ssh_alias() makes: never an option, never a space


def webhook_url_problem(url: Any) -> str | None:
    """Why ``url`` cannot be the guard's webhook, or None: an http:// or https:// URL with a host, no space and no
    control character. The message never quotes the URL (it may carry a token)."""
    if not isinstance(url, str):
        return f"the webhook URL must be a string, got {type(url).__name__}"
    if not url:
        return "the webhook URL is empty"
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "the webhook URL must not contain spaces or control characters"
    scheme = url.split(":", 1)[0] if ":" in url else ""
    if scheme.lower() not in ("http", "https"):
        shown = f"it starts with {scheme + ':'!r}" if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,15}", scheme) else \
            "it has no scheme"
        return f"the webhook URL must be an http:// or https:// URL ({shown})"
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port     # a port that is no number raises here
    except ValueError:
        return "the webhook URL cannot be parsed (its host or port)"
    if not host:
        return "the webhook URL names no host"
    return None


def parse_config(data: Any, webhook_url: str | None = None) -> GuardConfig:
    """Build a GuardConfig from its JSON document; GuardConfigError lists every problem.

    ``webhook_url`` is the text of the file ``webhook_url_file`` names (the URL, kept out of the document, which
    others may read), as a caller that reads it passes it (the guard itself, root); None: not read (``status``)."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise GuardConfigError([f"the guard configuration must be a JSON object, got {type(data).__name__}"])
    known = set(_FLOATS + _INTS + _STRINGS + _OPTIONAL_PATHS + _PORTS + ("ranks", "budgets", "metrics_address"))
    problems += [f"unknown key {key!r}" for key in sorted(data) if key not in known and not key.startswith("_")]
    values: dict[str, Any] = {}
    for key in _STRINGS:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{key} must be a non-empty string, got {value!r}")
        else:
            values[key] = value
    for key in _OPTIONAL_PATHS:
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, str) or not value.startswith("/"):
            problems.append(f"{key} must be an absolute path, got {value!r}")
        else:
            values[key] = value
    for key in _FLOATS + _INTS:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problems.append(f"{key} must be a positive number, got {value!r}")
        elif key in _INTS and int(value) != value:
            problems.append(f"{key} must be a whole number, got {value!r}")
        else:
            values[key] = int(value) if key in _INTS else float(value)
    port = data.get("metrics_port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        problems.append(f"metrics_port must be a port number (0: no metrics endpoint), got {port!r}")
        port = 0
    else:
        values["metrics_port"] = port
    address = data.get("metrics_address", "")
    if not isinstance(address, str) or (address and management_address_problem("the head", address)):
        problems.append(f"metrics_address must be an IP address or a host name the head listens on, got {address!r}")
    elif port and not address:
        problems.append("metrics_address must be set when metrics_port is (the address the endpoint listens on)")
    else:
        values["metrics_address"] = address
    if "budgets" in data:
        try:
            values["budgets"] = dict(make_watch("api_up", data["budgets"], 0.0).budgets)
        except (StartupError, AttributeError, TypeError) as exc:
            problems.append(f"budgets: {exc}")
    ranks = _parse_ranks(data.get("ranks"), problems)
    if values.get("memory_margin_percent", 10.0) >= 100:
        problems.append(f"memory_margin_percent must be below 100, got {values['memory_margin_percent']!r}")
    if values.get("backoff_max_seconds", 900.0) < values.get("backoff_seconds", 10.0):
        problems.append("backoff_max_seconds must not be below backoff_seconds")
    if webhook_url is not None:
        url = webhook_url.strip()
        problem = webhook_url_problem(url)
        if problem:
            problems.append(problem)
        else:
            values["webhook_url"] = url
    if problems:
        raise GuardConfigError(problems)
    return GuardConfig(ranks=ranks, **values)


def _parse_ranks(raw: Any, problems: list[str]) -> tuple[Rank, ...]:
    if not isinstance(raw, list) or len(raw) < 2:
        problems.append(f"ranks must list the head and at least one worker, got {raw!r}")
        return ()
    ranks = []
    for pos, item in enumerate(raw):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("name", "role", "ssh_host", "cx7_ip")):
            problems.append(f"ranks[{pos}] must have the strings name, role, ssh_host and cx7_ip, got {item!r}")
            continue
        rank = Rank(name=item["name"], role=item["role"], ssh_host=item["ssh_host"], cx7_ip=item["cx7_ip"])
        want = "head" if pos == 0 else "worker"
        if rank.role != want:
            problems.append(f"ranks[{pos}] ({rank.name}) must be the {want}, got role {rank.role!r}")
        if pos == 0 and rank.ssh_host:
            problems.append(f"the head ({rank.name}) is the guard's own node: its ssh_host must be empty")
        if pos > 0 and not _SSH_HOST.fullmatch(rank.ssh_host):
            problems.append(f"worker {rank.name}: ssh_host must be its Host alias in the guard's ssh_config (letters, "
                            f"digits, dots and dashes, not first), got {rank.ssh_host!r}")
        ranks.append(rank)
    names = [rank.name for rank in ranks]
    if len(set(names)) != len(names):
        problems.append(f"ranks name a host twice: {names}")
    return tuple(ranks)


# ------------------------------------------------------------------------------------------------ observing

@dataclass(frozen=True)
class RankObservation:
    """One look at one rank's serve container (``docker inspect`` on its node)."""

    name: str
    reachable: bool = True       # the node's Docker answered
    error: str = ""              # why it did not
    exists: bool = True
    running: bool = False
    paused: bool = False
    started_at: str = ""         # Docker's State.StartedAt
    exit_code: int | None = None
    finished_at: str = ""        # Docker's State.FinishedAt: when it last stopped


@dataclass(frozen=True)
class Finding:
    """Why the group is broken."""

    kind: str        # one of KINDS
    rank: str
    reason: str


def state_from_inspect(name: str, state: dict[str, Any]) -> RankObservation:
    """A RankObservation from ``docker inspect --format '{{json .State}}'``."""
    return RankObservation(name=name, exists=True, running=bool(state.get("Running")), paused=bool(state.get("Paused")),
                           started_at=str(state.get("StartedAt") or ""), exit_code=state.get("ExitCode"),
                           finished_at=str(state.get("FinishedAt") or ""))


def stop_order(obs: RankObservation) -> tuple[bool, tuple[str, str]]:
    """Sorts stopped ranks by when they stopped (Docker's FinishedAt, keyed as the log lines are merged); a rank
    without a readable time after every rank with one."""
    key = time_key(obs.finished_at)
    return key is None, key or ("", "")


def assess(config: GuardConfig, baseline: dict[str, str], ranks: list[RankObservation],
           api_failing_since: float | None, api_detail: str, now: float) -> Finding | None:
    """The first reason the group is broken (ranks in rank order), or None when it serves.

    Of several stopped ranks, the one that stopped first is named (rank order between equal or unknown times): a
    worker that dies takes the head down with it within seconds, and the worker is the cause.

    Broken: a node's Docker does not answer; a serve container is gone, or not running; a rank started again
    since the group was (its StartedAt differs from the baseline: a rank restarted alone cannot rejoin its
    group); the head's API failing for ``grace_seconds`` or longer while every container runs (a hung collective,
    a frozen rank).
    """
    for obs in ranks:
        if not obs.reachable:
            return Finding("unreachable", obs.name, f"Docker on {obs.name} does not answer: {obs.error}")
    for obs in ranks:
        if not obs.exists:
            return Finding("absent", obs.name, f"the serve container {config.container} is gone from {obs.name}: the "
                                               "guard creates nothing; run the launch (playbooks/launch.yml)")
        if not obs.running:
            first = min((other for other in ranks if other.exists and not other.running), key=stop_order)
            code = "" if first.exit_code is None else f" (exit code {first.exit_code})"
            return Finding("stopped", first.name, f"the serve container on {first.name} is not running{code}")
    for obs in ranks:
        known = baseline.get(obs.name)
        if known and obs.started_at and obs.started_at != known:
            return Finding("restarted", obs.name, f"the serve container on {obs.name} started again on its own at "
                                                  f"{obs.started_at} (the group started it at {known}): a rank "
                                                  "restarted alone cannot rejoin its group")
    if api_failing_since is not None and now - api_failing_since >= config.grace_seconds:
        return Finding("api", config.head.name, f"the head's API has been failing for {now - api_failing_since:.0f} s "
                                                f"(grace {config.grace_seconds:.0f} s) while every container runs: "
                                                f"{api_detail}")
    return None


def started_rank_problem(obs: RankObservation, started_at: str | None) -> str | None:
    """Why a rank a restore started can no longer join its group, or None while it may.

    ``started_at`` is the start the restore gave the rank (Docker's State.StartedAt read after ``docker start``).
    Watched for every started rank on every poll of a restore, so that a rank whose container dies, starts again
    or is frozen (``docker pause``) after its rendezvous ends the restore at once, not when the head's dead-peer
    grace runs out. An unreachable node is left to the caller (it names the node's Docker, not the rank)."""
    if not obs.reachable:
        return None
    if not obs.exists:
        return f"the serve container on {obs.name} is gone"
    if not obs.running:
        code = "" if obs.exit_code is None else f" (exit code {obs.exit_code})"
        return f"the serve container on {obs.name} died during the restore{code}"
    if started_at and obs.started_at and obs.started_at != started_at:
        return (f"the serve container on {obs.name} started again during the restore (at {obs.started_at}; the "
                f"restore started it at {started_at})")
    if obs.paused:
        return f"the serve container on {obs.name} is paused (docker pause) during the restore"
    return None


# ------------------------------------------------------------------------------------------------ the API probe

PROGRESS_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def engine_progress(metrics_text: str | None) -> float | None:
    """Tokens the engine has processed so far (prompt + generated, from vLLM's /metrics); None when unreadable."""
    if not metrics_text:
        return None
    try:
        scrape = parse_text(metrics_text)
    except MetricsError:
        return None
    values = [gauge_sum(scrape, name) for name in PROGRESS_COUNTERS]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


@dataclass
class ProbeState:
    """What the API probe knows across probes."""

    answered_once: bool = False        # a completion succeeded since the group (re)started
    failing_since: float | None = None
    detail: str = ""
    progress: float | None = None      # the engine's token counter at the last probe


def judge_probe(state: ProbeState, now: float, health_ok: bool, completion_ok: bool, detail: str,
                progress: float | None) -> str:
    """Fold one probe into the state; return ok | busy | failing | warming.

    The API counts as failing when /health fails, or when the one-token completion fails while the engine's
    token counters did not move since the previous probe (a hung collective, a frozen rank). A completion that
    times out while the counters move is a busy engine (a benchmark filling every sequence slot), not a hang.
    Until the first completion succeeds after a (re)start, a slow completion is the engine warming up (its first
    request compiles or captures graphs); /health failing still counts.
    """
    moved = progress is not None and state.progress is not None and progress > state.progress
    if progress is not None:
        state.progress = progress
    if health_ok and completion_ok:
        state.answered_once = True
        state.failing_since, state.detail = None, ""
        return "ok"
    if health_ok and moved:
        state.failing_since, state.detail = None, ""
        return "busy"
    if health_ok and not state.answered_once:
        return "warming"
    if state.failing_since is None:
        state.failing_since = now
    state.detail = detail
    return "failing"


# ------------------------------------------------------------------------------------------------ deciding

@dataclass
class GuardState:
    """What the guard remembers (the state file, also read by status.yml)."""

    status: str = "armed"
    since: float = 0.0
    detail: str = ""
    baseline: dict[str, str] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)    # restores, newest last (at most HISTORY_KEEP)
    restores_total: int = 0
    restores_failed_total: int = 0
    last_restore: dict[str, Any] | None = None
    gave_up: dict[str, Any] | None = None
    maintenance: dict[str, Any] | None = None
    next_attempt_at: float = 0.0
    updated_at: float = 0.0
    memory_reference: dict[str, int] = field(default_factory=dict)   # MemAvailable (KiB) per node at the last good start

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def state_from_json(text: str) -> GuardState:
    """The state file's GuardState; an unreadable one gives a fresh state (the guard re-arms from what it sees)."""
    try:
        data = json.loads(text)
    except ValueError:
        return GuardState()
    if not isinstance(data, dict):
        return GuardState()
    known = GuardState.__dataclass_fields__
    state = GuardState(**{key: value for key, value in data.items() if key in known})
    if state.status not in STATUSES:
        state.status = "armed"
    return state


def set_status(state: GuardState, status: str, detail: str, now: float) -> bool:
    """Change the status; True when it changed (status or detail)."""
    if status not in STATUSES:
        raise ValueError(f"unknown guard status {status!r}")
    changed = state.status != status or state.detail != detail
    if state.status != status:
        state.since = now
    state.status, state.detail, state.updated_at = status, detail, now
    return changed


def failed(attempt: dict[str, Any]) -> bool:
    """A restore that counts as failed: it did not bring the group back, or the group it brought back broke again
    within ``stable_seconds`` (``unstable``, set by note_break)."""
    return not attempt.get("ok") or bool(attempt.get("unstable"))


def failed_in_window(state: GuardState, config: GuardConfig, now: float) -> list[dict[str, Any]]:
    """The failed restores that count towards backoff and giving up: those in a row in the window (not before the
    last arm), back to the last restore whose group stayed serving for ``stable_seconds``."""
    streak: list[dict[str, Any]] = []
    for attempt in reversed(_in_window(state, config, now)):
        if not failed(attempt):
            break
        streak.insert(0, attempt)
    return streak


def _in_window(state: GuardState, config: GuardConfig, now: float) -> list[dict[str, Any]]:
    return [a for a in state.attempts
            if not a.get("window_reset") and now - float(a.get("started_at", 0)) < config.window_seconds]


def note_break(state: GuardState, config: GuardConfig, now: float) -> bool:
    """The group is broken at ``now``: when the last restore succeeded less than ``stable_seconds`` ago, it did not
    last and counts as failed from now on (marked ``unstable`` with how long it served). True when marked."""
    if not state.attempts:
        return False
    last = state.attempts[-1]
    if not last.get("ok") or last.get("unstable") or last.get("window_reset"):
        return False
    served = now - float(last.get("finished_at") or now)
    if served >= config.stable_seconds:
        return False
    last["unstable"] = True
    last["served_seconds"] = round(served, 1)
    if state.last_restore is not None and state.last_restore.get("started_at") == last.get("started_at"):
        state.last_restore = last
    return True


def backoff(state: GuardState, config: GuardConfig, now: float) -> float:
    """Seconds to wait after the last failed restore before the next: 0 when no restore failed in a row (a restore
    after a healthy run starts at once), then backoff_seconds doubled for each further failure, at most
    backoff_max_seconds."""
    streak = failed_in_window(state, config, now)
    if not streak:
        return 0.0
    return min(config.backoff_max_seconds, config.backoff_seconds * 2 ** (len(streak) - 1))


def decide(state: GuardState, config: GuardConfig, finding: Finding | None, now: float) -> str:
    """What to do about a finding: ok | wait_nodes | give_up | backoff | restore."""
    if finding is None:
        return "ok"
    if finding.kind == "unreachable":
        return "wait_nodes"
    if finding.kind == "absent":
        return "give_up"
    note_break(state, config, now)
    streak = failed_in_window(state, config, now)
    if len(streak) >= config.max_failed_restores:
        return "give_up"
    if streak:
        wait = backoff(state, config, now) - (now - float(streak[-1].get("finished_at") or now))
        if wait > 0:
            state.next_attempt_at = now + wait
            return "backoff"
    return "restore"


def backoff_notice(previous: tuple | None, finding: Finding, next_attempt_at: float) -> tuple[tuple, str | None]:
    """While the guard backs off: the key of what it waits on (the broken rank, the kind, the next restore) and the
    journal line to write when that changed since ``previous`` (None otherwise: one line per change, not per look;
    the reason's own text may move every look, e.g. how long the API has failed)."""
    key = (finding.kind, finding.rank, round(next_attempt_at))
    if key == previous:
        return key, None
    return key, f"broken ({finding.reason}), backing off until {iso(next_attempt_at)}"


def record_restore(state: GuardState, config: GuardConfig, record: dict[str, Any]) -> None:
    """Remember one restore (ok or not): history, counters, last_restore; a success takes a new baseline."""
    state.attempts = (state.attempts + [record])[-HISTORY_KEEP:]
    state.restores_total += 1
    if not record.get("ok"):
        state.restores_failed_total += 1
    state.last_restore = record
    if record.get("ok") and record.get("baseline"):
        state.baseline = dict(record["baseline"])
    if record.get("ok") and record.get("memory_before_start"):
        state.memory_reference = dict(state.memory_reference, **record["memory_before_start"])


def give_up_record(state: GuardState, config: GuardConfig, finding: Finding, now: float) -> dict[str, Any]:
    """Why the guard stops trying: the finding, or the failed restores in the window with the last one's cause."""
    failed = failed_in_window(state, config, now)
    if finding.kind in ("absent", "memory") or not failed:
        why = finding.reason
    else:
        last = failed[-1]
        if not last.get("ok"):
            cause = (f"the last one failed at {last.get('failed_rank') or '?'} in phase "
                     f"{last.get('failed_phase') or '?'}: {last.get('error')}")
        else:
            cause = (f"the last one's group broke again after {float(last.get('served_seconds') or 0):.0f} s "
                     f"(stable after {config.stable_seconds:.0f} s): {finding.reason}")
        why = f"{len(failed)} restores failed within {config.window_seconds:.0f} s; {cause}"
    last_lines = failed[-1].get("last_lines", []) if failed and finding.kind != "memory" else []
    if finding.kind == "memory":
        fix = ("free the node's memory (a process holding it; a node that leaked it needs a reboot), then run the "
               "launch (playbooks/launch.yml), which re-arms the guard")
    else:
        fix = ("find the cause in the reason and the last lines, then run the launch (playbooks/launch.yml), which "
               "re-arms the guard")
    return {"at": now, "finding": asdict(finding), "reason": why, "last_lines": last_lines, "fix": fix}


def arm(state: GuardState, baseline: dict[str, str], now: float, holder: str) -> None:
    """Armed by the launch: the group serves with these containers' starts; failures and give-up forgotten."""
    state.baseline = dict(baseline)
    state.gave_up = None
    state.maintenance = None
    state.next_attempt_at = 0.0
    state.attempts = [dict(a, window_reset=True) for a in state.attempts]
    set_status(state, "armed", f"armed by {holder}", now)


def arm_changes(state: GuardState, baseline: dict[str, str]) -> bool:
    """Whether arm() with this baseline changes what the guard keeps: its status (a maintenance the arming run took
    itself is no change), the group's container starts, or restores in the window not yet forgotten."""
    status = "armed" if state.status == "maintenance" else state.status
    before = (status, dict(state.baseline), [a.get("window_reset") for a in state.attempts])
    return before != ("armed", dict(baseline), [True] * len(state.attempts))


def arm_reason(state_text: str | None, maintenance_held: bool, serving: dict[str, str], ranks: list[str]) -> str | None:
    """Why a run must arm the guard now; None when arming would change nothing.

    state_text is the head's state file as read in this run (None: absent), maintenance_held whether a maintenance
    lock of another run is held (the caller gives its own lock back either way), serving each rank's serve container
    start (Docker's State.StartedAt) as read in this run by a caller that started nothing since (empty: the caller
    started the group, or did not read it)."""
    missing = [rank for rank in ranks if not serving.get(rank)]
    if missing:
        if not serving:
            return "the group was started in this run (or its containers were not read)"
        return f"no container start read for {', '.join(missing)}"
    if state_text is None:
        return "the guard has no state file yet"
    if maintenance_held:
        return "a maintenance lock is held"
    state = state_from_json(state_text)
    # in maintenance under the caller's own lock (a lock of another run is maintenance_held): the caller gives it back,
    # and the guard, released, keeps what serves then; a disarmed or given-up guard never enters maintenance
    if state.status not in ("armed", "maintenance"):
        return f"the guard is {state.status}"
    if dict(state.baseline) != {rank: serving[rank] for rank in ranks}:
        return "the guard keeps another group (its container starts differ)"
    if arm_changes(state, {rank: serving[rank] for rank in ranks}):
        return "the guard has restores not yet forgotten (arming starts its window anew)"
    return None


def entry_steps(current: bool, restart: bool, arm: bool, unit: dict[str, Any] | None, state_exists: bool,
                install_only: bool, lock_mine: bool, check_mode: bool) -> dict[str, list[str]]:
    """What the guard role's entry points carry out after the plan, in order, on the head: `prepare` - "install" (the
    access, the program, the configuration, the unit), "restart" (a guard older than its files), "start" (a guard armed
    before that does not run as planned) - and `arm` - "start" (a guard never armed: no state file), "arm", "release"
    (the lock this run holds, when the arm that would give it back is left out). An empty list: the entry point skips
    its steps whole (a re-run that finds the guard installed, running and keeping this group).

    current, restart and arm are the plan's own (guard_config); unit the guard's unit as read (running, enabled);
    state_exists whether its state file exists; install_only the role's guard_install_only (prepare installs and
    starts nothing); lock_mine whether this run holds the maintenance lock. Check mode starts, restarts, arms and
    releases nothing: only the install runs (it shows its differences)."""
    runs = bool(current and unit and unit.get("running") and unit.get("enabled"))
    prepare = ["install"] if not current else []
    if check_mode:
        return {"prepare": prepare, "arm": []}
    prepare += ["restart"] if restart else []
    prepare += ["start"] if state_exists and not runs and not install_only else []
    steps = ["start"] if not state_exists and not runs else []
    steps += ["arm"] if arm else (["release"] if lock_mine else [])
    return {"prepare": prepare, "arm": steps}


# ------------------------------------------------------------------------------------------------ memory

def mem_available_kib(meminfo_text: str | None) -> int | None:
    """MemAvailable in KiB from /proc/meminfo's text (on a GB10 the memory is unified: the GPU's too); None when
    the text has none."""
    for line in (meminfo_text or "").splitlines():
        name, _sep, rest = line.partition(":")
        if name.strip() == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                return int(fields[0])
    return None


def gib(kib: float) -> str:
    """KiB as GiB for a person: whole GiB from 10 up, one decimal below."""
    value = kib / 1024 / 1024
    return f"{value:.0f} GiB" if value >= 10 else f"{value:.1f} GiB"


def memory_shortfall(node: str, available_kib: int | None, reference_kib: int | None, margin_percent: float) -> str | None:
    """Why ``node``'s memory has not come back for a start, or None: its MemAvailable now must be at least the level
    recorded at the last good start less ``margin_percent``. Nothing to compare (no good start yet, or meminfo
    unreadable): None."""
    if available_kib is None or not reference_kib:
        return None
    needed = reference_kib * (1 - margin_percent / 100.0)
    if available_kib >= needed:
        return None
    return (f"memory not released on {node}: {gib(available_kib)} available, {gib(reference_kib)} at the last good "
            f"start (at least {gib(needed)} needed, guard_memory_margin_percent {margin_percent:g})")


# ------------------------------------------------------------------------------------------------ metrics

def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(state: GuardState | None, lock: dict[str, Any] | None, now: float,
                 webhook: dict[str, int] | None = None) -> str:
    """The guard's state in Prometheus' text exposition format (version 0.0.4): what its HTTP endpoint serves.

    ``state`` is the state file's (None: never armed), ``lock`` the maintenance lock when it holds, ``webhook`` the
    running guard's notifications (``sent``, ``failed``) since it started (None: none yet). Every series is there
    from the start (0 when nothing happened yet), so that alert rules see a value, not an absence."""
    webhook = webhook or {}
    status = "armed" if state is None else state.status
    if lock is not None and status != "disarmed":
        status = "maintenance"
    last = (state.last_restore if state else None) or {}
    reference = state.memory_reference if state else {}
    memory_before = last.get("memory_before_start") or (last.get("memory") and {
        last["memory"]["node"]: last["memory"].get("available_kib")}) or {}
    families: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        ("dgxspark_guard_status", "gauge", "1 for the guard's current status (armed, maintenance, waiting_nodes, "
         "restoring, backoff, gave_up, disarmed), 0 for the others",
         [(f'{{status="{name}"}}', 1.0 if name == status else 0.0) for name in STATUSES]),
        ("dgxspark_guard_armed_once", "gauge", "1 once the guard has a state file (a launch armed it)",
         [("", 0.0 if state is None else 1.0)]),
        ("dgxspark_guard_gave_up", "gauge", "1 while the guard has given up (it restores nothing until the next launch)",
         [("", 1.0 if status == "gave_up" else 0.0)]),
        ("dgxspark_guard_status_since_timestamp_seconds", "gauge", "when the guard entered its current status",
         [("", float(state.since if state else 0.0))]),
        ("dgxspark_guard_restores_total", "counter", "restores the guard ran (since its state file was made)",
         [("", float(state.restores_total if state else 0))]),
        ("dgxspark_guard_restores_failed_total", "counter", "restores that did not bring the group back",
         [("", float(state.restores_failed_total if state else 0))]),
        ("dgxspark_guard_last_restore_success", "gauge", "1 when the last restore brought the group back, 0 when it "
         "failed (absent before the first restore)", [("", 1.0 if last.get("ok") else 0.0)] if last else []),
        ("dgxspark_guard_last_restore_duration_seconds", "gauge", "how long the last restore took",
         [("", float(last.get("duration_seconds") or 0.0))] if last else []),
        ("dgxspark_guard_last_restore_timestamp_seconds", "gauge", "when the last restore began",
         [("", float(last.get("started_at") or 0.0))] if last else []),
        ("dgxspark_guard_memory_reference_bytes", "gauge", "each node's MemAvailable before the last good start",
         [(f'{{node="{_label(node)}"}}', float(kib) * 1024) for node, kib in sorted(reference.items())]),
        ("dgxspark_guard_memory_available_bytes", "gauge", "each node's MemAvailable before the last restore's start",
         [(f'{{node="{_label(node)}"}}', float(kib) * 1024) for node, kib in sorted(memory_before.items())
          if kib is not None]),
        ("dgxspark_guard_webhook_sent_total", "counter", "notifications the webhook receiver accepted (a 2xx answer) "
         "since the guard started", [("", float(webhook.get("sent", 0)))]),
        ("dgxspark_guard_webhook_failures_total", "counter", "notifications that did not reach the webhook receiver "
         "(no answer within the timeout, refused, or not a 2xx answer) since the guard started",
         [("", float(webhook.get("failed", 0)))]),
        ("dgxspark_guard_scrape_timestamp_seconds", "gauge", "when this page was made", [("", now)]),
    ]
    lines = []
    for name, kind, helptext, samples in families:
        lines += [f"# HELP {name} {helptext}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {value:.17g}" for labels, value in samples]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ notifying

_RESTORE_FIELDS = ("kind", "rank", "reason", "ok", "error", "failed_rank", "failed_phase", "duration_seconds",
                   "started_at", "finished_at")


def webhook_body(event: str, config: GuardConfig, state: GuardState, now: float,
                 record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body the guard POSTs to its webhook: ``restored`` or ``restore_failed`` (``record``, the restore
    just recorded) or ``gave_up`` (``state.gave_up``).

    Common fields: event, head, container, served_model_name, status (the guard's, after the event), time (ISO 8601,
    UTC) and timestamp (epoch seconds), restores_total and restores_failed_total, and ``text``, one line for a
    person (what chat webhooks show). A restore adds its kind, rank, reason, ok, error, failed_rank, failed_phase,
    duration_seconds, started_at and finished_at (epoch seconds); a give-up its reason, fix, kind and rank. Nothing
    else of the record goes out (no log lines, no baseline)."""
    if event not in WEBHOOK_EVENTS:
        raise ValueError(f"unknown webhook event {event!r} (known: {', '.join(WEBHOOK_EVENTS)})")
    head = config.head.name
    body: dict[str, Any] = {
        "event": event, "head": head, "container": config.container, "served_model_name": config.served_model_name,
        "status": state.status, "time": iso(now), "timestamp": now, "restores_total": state.restores_total,
        "restores_failed_total": state.restores_failed_total,
    }
    if event == "gave_up":
        gave = state.gave_up or {}
        finding = gave.get("finding") or {}
        body.update(reason=gave.get("reason", state.detail), fix=gave.get("fix", ""), kind=finding.get("kind"),
                    rank=finding.get("rank"))
        body["text"] = f"dgxspark guard on {head}: GAVE UP: {body['reason']}. Fix: {body['fix']}"
        return body
    if record is None:
        raise ValueError(f"a {event} notification needs the restore's record")
    body.update({key: record.get(key) for key in _RESTORE_FIELDS})
    body["ok"] = bool(record.get("ok"))
    took = float(record.get("duration_seconds") or 0.0)
    if event == "restored":
        body["text"] = (f"dgxspark guard on {head}: restored, {config.container} serves again after a {took:.0f} s "
                        f"restore ({record.get('reason')})")
    else:
        body["text"] = (f"dgxspark guard on {head}: a restore FAILED after {took:.0f} s at "
                        f"{record.get('failed_rank') or 'the group'} in phase {record.get('failed_phase') or '?'}: "
                        f"{record.get('error')} (it began because {record.get('reason')}); the guard is {state.status}")
    return body


# ------------------------------------------------------------------------------------------------ maintenance

def maintenance_document(holder: str, now: float, ttl_seconds: float) -> dict[str, Any]:
    if ttl_seconds <= 0:
        raise ValueError(f"the maintenance lock's ttl must be positive, got {ttl_seconds!r}")
    return {"holder": holder, "since": now, "expires_at": now + ttl_seconds}


def maintenance_active(text: str | None, now: float) -> dict[str, Any] | None:
    """The maintenance lock when it holds (present, readable, not expired); None otherwise.

    A lock that cannot be read counts as held for one hour from now: better idle than fight an Ansible run."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        expires = float(data["expires_at"])
    except (ValueError, KeyError, TypeError):
        return {"holder": "an unreadable lock file", "since": now, "expires_at": now + 3600.0}
    if expires <= now:
        return None
    return {"holder": str(data.get("holder", "?")), "since": float(data.get("since", now)), "expires_at": expires}


# ------------------------------------------------------------------------------------------------ configuring

TUNABLES = ("interval_seconds", "probe_interval_seconds", "probe_timeout_seconds", "grace_seconds", "stop_seconds",
            "poll_seconds", "peer_grace_seconds", "node_wait_seconds", "backoff_seconds", "backoff_max_seconds",
            "max_failed_restores", "window_seconds", "log_lines", "budgets", "stall_seconds", "progress_seconds",
            "stable_seconds", "memory_margin_percent", "memory_wait_seconds", "metrics_address", "metrics_port")


# The options of dgxspark.vllm.guard_config (its action and its documentation stub share them).
CONFIG_ARGUMENT_SPEC: dict[str, Any] = dict(
    config=dict(type="dict", required=True),
    tunables=dict(type="dict", default={}),
    state_path=dict(type="path", default="/var/lib/dgxspark-guard/state.json"),
    maintenance_path=dict(type="path", default="/run/dgxspark/guard-maintenance.json"),
    payload=dict(type="list", elements="path", default=[]),
    module_utils=dict(type="list", elements="str", default=[]),
    install=dict(type="dict", default={}),
    installed=dict(type="str"),
    serving=dict(type="dict", default={}),
    armed_state=dict(type="str"),
    maintenance_held=dict(type="bool", default=False),
    state_exists=dict(type="bool", default=False),
    install_only=dict(type="bool", default=False),
    lock_mine=dict(type="bool", default=False),
    ssh_config=dict(type="path", default="/etc/dgxspark/guard/ssh_config"),
    access=dict(type="dict", apply_defaults=True, options=dict(
        user=dict(type="str", default="dgxspark-guard"),
        python=dict(type="path", default="/usr/bin/python3"),
        program=dict(type="path", default="/usr/local/lib/dgxspark-guard/dgxspark_guard_worker.py"),
        home=dict(type="path", default="/var/lib/dgxspark-guard"),
        sudoers_path=dict(type="path", default="/etc/sudoers.d/dgxspark-guard"),
        ssh_from=dict(type="list", elements="str", default=[]),
    )),
    access_read=dict(type="dict"),
    unit_read=dict(type="dict"),
    installed_read=dict(type="list", elements="dict", default=[]),
    webhook_url=dict(type="str", default="", no_log=True),
    webhook_path=dict(type="path", default="/etc/dgxspark/guard/webhook_url"),
    webhook_read=dict(type="dict"),
)


def ssh_alias(host: str) -> str:
    """The Host alias of a worker in the guard's own ssh_config."""
    return "dgxspark-guard-" + "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-." else "-" for ch in host)


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")   # underscores: names /etc/hosts may give


def management_address_problem(host: str, address: str) -> str | None:
    """Why `address` (a worker's ansible_host) cannot go into the guard's ssh_config as its HostName, or None: it
    must be an IP address or a DNS host name (a newline, a space or a quote would add a directive of its own)."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    name = address[:-1] if address.endswith(".") else address
    if 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        return None
    return (f"worker {host}: its ansible_host {address!r} is neither an IP address nor a host name, so it cannot be "
            "the guard's HostName (set ansible_host to the worker's management address or DNS name)")


def build_document(cluster: dict[str, Any], addresses: dict[str, str], tunables: dict[str, Any], state_path: str,
                   maintenance_path: str, ssh_config: str | None = None, webhook_url: str = "",
                   webhook_url_file: str = "") -> dict[str, Any]:
    """The guard's configuration document from the resolved cluster configuration (dgxspark_vllm_config), each
    worker's management address, the guard role's tunables and paths (``ssh_config``: the guard's own, on the head;
    None: the guard's default); GuardConfigError when it cannot be used.

    ``webhook_url`` (empty: none) is checked here but stays out of the document, which names the root-only file that
    holds it (``webhook_url_file``) instead."""
    problems = [f"unknown guard setting {key!r} (known: {', '.join(TUNABLES)})" for key in tunables if key not in TUNABLES]
    workers = list(cluster.get("workers") or [])
    problems += [f"no management address for worker {host} (its ansible_host)" for host in workers
                 if not addresses.get(host)]
    problems += [problem for host in workers if addresses.get(host)
                 for problem in [management_address_problem(host, str(addresses[host]))] if problem]
    if problems:
        raise GuardConfigError(problems)
    nodes = cluster["nodes"]
    head = cluster["head"]
    ranks = [{"name": head, "role": "head", "ssh_host": "", "cx7_ip": nodes[head]["cx7_ip"]}]
    ranks += [{"name": host, "role": "worker", "ssh_host": ssh_alias(host), "cx7_ip": nodes[host]["cx7_ip"]}
              for host in workers]
    doc: dict[str, Any] = {
        "_comment": "Managed by Ansible (role dgxspark.vllm.guard): local changes are overwritten.",
        "container": cluster["container_name"],
        "ranks": ranks,
        "api_url": f"http://127.0.0.1:{cluster['port']}",
        "served_model_name": cluster["served_model_name"],
        "state_path": state_path,
        "maintenance_path": maintenance_path,
    }
    if ssh_config is not None:
        doc["ssh_config"] = ssh_config
    doc.update({key: value for key, value in tunables.items() if value is not None})
    if webhook_url:
        doc["webhook_url_file"] = webhook_url_file
    parse_config(doc, webhook_url=webhook_url or None)
    return doc


def webhook_file_text(url: str) -> str:
    """What the guard role writes into the webhook URL file (the copy task's content: the URL and a newline)."""
    return url + "\n"


def webhook_file_current(url: str, read: dict[str, Any] | None) -> bool:
    """Whether the head's webhook URL file, as read (``exists``, ``sha256``; None: not read), is what ``url`` needs:
    its text when a URL is set, absent when none is."""
    if read is None:
        return True
    if not url:
        return not read.get("exists")
    return bool(read.get("exists")) and read.get("sha256") == hashlib.sha256(webhook_file_text(url).encode()).hexdigest()


def install_fingerprint(settings: dict[str, Any], files: dict[str, bytes]) -> str:
    """A digest of everything the guard's install puts on the head besides its configuration: the settings that
    shape the unit and the paths (``settings``) and the bytes of each installed file (``files``, by name)."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for name in sorted(files):
        digest.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def install_current(installed_text: str | None, document: dict[str, Any]) -> bool:
    """Whether the head's installed configuration (its file's text, None when absent) is ``document``: with the
    fingerprint in its ``_install`` key, the same program, module_utils, unit and settings too."""
    if not installed_text or "_install" not in document:
        return False
    try:
        return bool(json.loads(installed_text) == document)
    except ValueError:
        return False


def iso(epoch: float) -> str:
    """UTC time of an epoch second, ISO 8601."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def describe(state: GuardState | None, lock: dict[str, Any] | None) -> str:
    """One line for status.yml: armed / in maintenance / restoring / gave up, the last restore, how many."""
    if state is None:
        return "installed, never armed (the launch arms it once the group serves)"
    if lock is not None and state.status != "disarmed":
        head = f"IN MAINTENANCE (held by {lock['holder']} until {iso(lock['expires_at'])}): restores nothing"
    elif state.status == "gave_up":
        reason = (state.gave_up or {}).get("reason", state.detail)
        head = f"GAVE UP at {iso((state.gave_up or {}).get('at', state.since))}: {reason}"
    else:
        head = f"{state.status.upper() if state.status != 'armed' else 'armed'} since {iso(state.since)}" + (
            f" ({state.detail})" if state.detail else "")
    last = state.last_restore
    if last:
        result = "ok" if last.get("ok") else f"FAILED at {last.get('failed_rank')} in {last.get('failed_phase')}: {last.get('error')}"
        tail = (f"; last restore {iso(last['started_at'])}, {last.get('duration_seconds', '?')} s, {result}, "
                f"because {last.get('reason')}")
    else:
        tail = "; no restore yet"
    return f"{head}{tail}; restores: {state.restores_total} ({state.restores_failed_total} failed)"
