# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch's decisions: what each node runs and the one next step, from what was observed.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports (the action plugin
``dgxspark.vllm.launch_plan`` reads and writes the KV record and renders; the launch role carries out the step).

A launch is at most ``MAX_ATTEMPTS`` starts of the whole group. Each call of `plan` takes the nodes' states (one
`vllm_node_state` read per node), the resolved configuration, the KV record, and - after a start - what that start
observed (every rank's waits: phase, verdict, log report, last lines). It returns every node's container and one
step:

``nothing``    the group runs the render already (every rank running with the same config hash); the launch checks
               its API and reads its /metrics, then plans once more for the report (``done``);
``start``      start the group with the render (a KV budget known: set, recorded, or calibrated now);
``calibrate``  start without a KV budget, then read every rank's own estimate and start again with it;
``refit``      the engine estimated a shorter max-model-len and the inventory accepts it: start with the fit;
``fail``       stop every rank and fail with ``message``;
``done``       the group serves; ``message`` is the KV report. A first call returns it at once when the group
               runs the render and the nodes' read found its API answering on every node and the head's /metrics.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import (
    CalibrationError,
    block_size,
    cache_key,
    choose,
    flag_values,
    key_parts,
    lookup,
    record,
    round_down_to_block,
    same_values,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import launch_refusal
from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import PinError, launch_image
from ansible_collections.dgxspark.vllm.plugins.module_utils._safe_paths import launch_refusal as folders_refusal
from ansible_collections.dgxspark.vllm.plugins.module_utils._staging_lock import locked_nodes, refusal

STEPS: tuple[str, ...] = ("nothing", "start", "calibrate", "refit", "fail", "done")
STARTS: tuple[str, ...] = ("start", "calibrate", "refit")
"""The steps that start the group."""
MAX_ATTEMPTS = 3
"""A calibration start, a refit start and the start with the fit's budget. A calibrated budget that then does not fit
would need a fourth: the launch fails instead, and the next one starts once from what the record kept."""


def carries_out(step: str, first: bool, kv_record_differs: bool, check_mode: bool) -> bool:
    """Whether the launch role's entry point run_plan has (or had) anything to do: after the first plan, a start (the
    start loop), the check of a group found serving that did not answer everywhere yet (`nothing`), a refusal
    (`fail`), a KV record the head's copy lacks, or in check mode each node's docker run line. A first plan that finds
    the group serving its render and answering everywhere (`done`) with the head's record complete leaves it the KV
    report only, which its caller gives (playbooks/launch.yml): a no-op launch runs neither the entry point's argument
    validation nor its skipped tasks. Every later plan is made inside run_plan (a start's, the API check's): true, so
    that the caller does not report a second time."""
    return not first or check_mode or step != "done" or kv_record_differs


def starts_at_most(calibrates: bool, accepts_fit: bool) -> int:
    """How many starts a launch may make, from its first plan: a start that serves is the last; a calibration start
    is followed by the start with its budget; only a max-model-len that may be refitted (the inventory's
    accept_estimated_max_model_len) adds a refit start (and a calibration it may need): the most, MAX_ATTEMPTS."""
    if accepts_fit:
        return MAX_ATTEMPTS
    return 2 if calibrates else 1


WAIT_NAMES: tuple[str, ...] = ("rendezvous", "load", "serve", "alive")
"""The waits of one start, in order (a rank takes part in some): workers at their rendezvous, every rank's load,
the head serving, every worker still up with the head's API answering from it."""
STAGES: dict[str, str] = {
    "flush": "the start of the page-cache flush service",
    "rendezvous": "workers reaching the rendezvous",
    "load": "the head starting to serve",
    "serve": "the head starting to serve",
    "alive": "the head starting to serve",
}
FLUSH_NOT_INSTALLED = "Could not find the requested service"


# The launch_plan task's arguments (the action plugin validates with it; the module's documentation stub declares it).
ARGUMENT_SPEC: dict[str, Any] = dict(
    config=dict(type="dict", required=True),
    nodes=dict(type="dict", required=True),
    api_key=dict(type="str", no_log=True),
    calibration=dict(type="dict", default={}, options=dict(
        enabled=dict(type="bool", default=True),
        path=dict(type="path"),
        policy=dict(type="str", choices=["requested", "full"], default="requested"),
        margin_bytes=dict(type="int", default=0),
        default_block_size=dict(type="int", default=16),
        accept_estimated_max_model_len=dict(type="bool", default=False),
        head_record=dict(type="raw"),
        head_path=dict(type="str", default="the head's KV record"),
    )),
    previous=dict(type="dict"),
    observed=dict(type="dict"),
    metrics=dict(type="dict"),
    diagnosis_lines=dict(type="int", default=30),
)


class PlanError(ValueError):
    """Inputs the plan cannot work from (a programming or wiring error, not a failed launch)."""


@dataclass
class Calibration:
    """The launch's KV calibration settings (the launch role's launch_kv_* variables)."""

    enabled: bool = True
    policy: str = "requested"
    margin_bytes: int = 0
    default_block_size: int = 16
    accept_estimated_max_model_len: bool = False
    record_path: str = "the KV record"


@dataclass
class Plan:
    """One decision: the step, each node's spec, and the state the next call continues from."""

    step: str
    specs: dict[str, dict[str, Any]]
    state: dict[str, Any]
    message: str = ""
    stop_first: bool = False
    any_exists: bool = True
    cache: dict[str, Any] | None = None   # the KV record to write, when it changed
    warnings: list[str] = field(default_factory=list)

    def as_result(self) -> dict[str, Any]:
        return {"step": self.step, "specs": self.specs, "state": self.state, "message": self.message,
                "stop_first": self.stop_first, "any_exists": self.any_exists,
                "attempt": self.state.get("attempt", 0), "kv": self.state.get("kv", {}),
                "max_model_len": self.state.get("max_model_len"), "notes": list(self.state.get("notes", [])),
                "image": dict(self.state.get("image", {})),
                "serving": dict(self.state.get("serving", {})), "steps": list(self.state.get("steps", [])),
                # the launch's one start loop runs over the first plan's: the starts it may make (each planned by the
                # one before it; a start that serves, or a failure, leaves the rest idle through `step`)
                "attempts": list(range(1, int(self.state.get("starts", 0)) + 1)) if self.step in STARTS else []}


Render = Callable[[Mapping[str, Any]], "dict[str, dict[str, Any]]"]
"""settings -> node name -> spec result (`vllm_serve_spec`'s result)."""


# --------------------------------------------------------------------------------------------- inputs

def rank_order(config: Mapping[str, Any]) -> list[str]:
    """The nodes, head first, then the workers in inventory order."""
    return [config["head"]] + list(config["workers"])


def in_play(config: Mapping[str, Any], nodes: Mapping[str, Any]) -> None:
    """PlanError unless every node of the cluster was read in this play (a --limit takes a whole cluster)."""
    missing = [name for name in rank_order(config) if name not in nodes]
    if missing:
        raise PlanError(f"the launch needs every node of the cluster in this play (missing: {', '.join(missing)}): a "
                        "--limit that selects a cluster selects all of it")


def _node_state(nodes: Mapping[str, Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    state = nodes.get(name)
    if not isinstance(state, Mapping) or "node" not in state:
        raise PlanError(f"no node state for {name}: read every node with dgxspark.vllm.vllm_node_state (name given) "
                        "before the plan")
    return state


def described_nodes(config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The render's node list (head first) from the node states (every node of the cluster read in this play)."""
    in_play(config, nodes)
    return [dict(_node_state(nodes, name)["node"]) for name in rank_order(config)]


def pinned_image(config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The configuration with the image every rank runs: the digest staging resolved (``repo@sha256:...``, from each
    node's record and local image), so that every node runs one build; PlanError when the nodes hold different ones."""
    image = config.get("image") or config["settings"].get("image")
    if not image:
        return dict(config), {}   # the render names the missing image
    try:
        chosen = launch_image(str(image), {name: _node_state(nodes, name) for name in rank_order(config)})
    except PinError as exc:
        raise PlanError(str(exc)) from exc
    settings = dict(config["settings"], image=chosen.reference)
    return dict(config, settings=settings), chosen.as_dict()


def settings_with(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved settings with this launch's overrides (a KV budget, a max-model-len fit)."""
    out = dict(config["settings"])
    out.update(overrides)
    return out


def max_model_len_text(command: Sequence[str]) -> str:
    value = flag_values(command).get("--max-model-len")
    return str(value) if value not in (None, True) else "the model's own"


# ------------------------------------------------------------------------------------------------ KV

def _key_inputs(config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]],
                specs: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    head = config["head"]
    stamp = _node_state(nodes, head).get("stamp") or {}
    revision = stamp.get("commit") or f"configured:{config.get('model_revision') or ''}"
    return {"command": specs[head]["container"]["command"],
            "model_path": settings.get("model_path") or config.get("model_path") or "",
            "model_revision": revision,
            "nodes": [dict(_node_state(nodes, name).get("identity") or {}) for name in rank_order(config)]}


def _key(inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    parts = key_parts(inputs["command"], inputs["model_path"], inputs["model_revision"], inputs["nodes"])
    return cache_key(parts), parts


@dataclass
class _Kv:
    """Where the KV budget of a render comes from."""

    source: str                      # inventory | off | cache | calibrate | calibrated | unavailable
    bytes: int | None = None
    key: str | None = None
    parts: dict[str, Any] | None = None
    recorded_at: str | None = None
    chosen: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "bytes": self.bytes, "key": self.key, "parts": self.parts,
                "recorded_at": self.recorded_at, "chosen": self.chosen}


def _kv_from(data: Mapping[str, Any]) -> _Kv:
    return _Kv(source=data["source"], bytes=data.get("bytes"), key=data.get("key"), parts=data.get("parts"),
               recorded_at=data.get("recorded_at"), chosen=data.get("chosen"))


def kv_source_text(kv: Mapping[str, Any], record_path: str) -> str:
    """Where the KV budget came from, for the report."""
    source = kv.get("source")
    if source == "inventory":
        return "set in the inventory (dgxspark_vllm_kv_cache_memory_bytes)"
    if source == "off":
        return "no calibration (launch_kv_calibration: false)"
    if source == "cache":
        return f"recorded {kv.get('recorded_at')} in {record_path} for key {kv.get('key')}"
    if source == "calibrated":
        chosen = kv.get("chosen") or {}
        per_node = ", ".join(f'"{k}": {v}' for k, v in sorted((chosen.get("per_node") or {}).items()))
        return (f"calibrated now ({chosen.get('source')}, policy {chosen.get('policy')}, per node {{{per_node}}}), "
                f"recorded for key {kv.get('key')}")
    if source == "unavailable":
        return f"no calibration key: {(kv.get('chosen') or {}).get('reason')}"
    return "sized by vLLM for this start (calibration pending)"


class _Resolver:
    """Renders and the KV budget of a render, against one read of the record."""

    def __init__(self, config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], render: Render,
                 cache: dict[str, Any], calibration: Calibration) -> None:
        self.config, self.nodes, self.render, self.cache, self.calibration = config, nodes, render, cache, calibration
        self.changed = False

    def resolve(self, overrides: dict[str, Any], notes: list[str], may_fit: bool
                ) -> tuple[dict[str, dict[str, Any]], _Kv, dict[str, Any]]:
        """Render with overrides, then find the KV budget: the inventory's, the record's, or to be calibrated.
        With may_fit, a recorded max-model-len estimate for the key is taken (the inventory opted in)."""
        settings = settings_with(self.config, overrides)
        specs = self.render(settings)
        if settings.get("kv_cache_memory_bytes") is not None and "kv_cache_memory_bytes" not in overrides:
            return specs, _Kv("inventory", bytes=int(settings["kv_cache_memory_bytes"])), overrides
        if not self.calibration.enabled:
            return specs, _Kv("off"), overrides
        try:
            key, parts = _key(_key_inputs(self.config, self.nodes, specs, settings))
        except CalibrationError as exc:   # e.g. the serve image is not on a node yet: nothing can start
            return specs, _Kv("unavailable", chosen={"reason": str(exc)}), overrides
        entry = lookup(self.cache, key)
        # the estimate first: an entry holding both had its budget calibrated and then not fit this max-model-len
        if (may_fit and entry and entry.get("estimated_max_model_len") and "max_model_len" not in overrides):
            block = block_size(specs[self.config["head"]]["container"]["command"],
                               self.calibration.default_block_size)
            fit = round_down_to_block(int(entry["estimated_max_model_len"]), block)
            if fit > 0:
                notes.append(f"max-model-len {max_model_len_text(specs[self.config['head']]['container']['command'])}"
                             f" does not fit: the engine estimated {entry['estimated_max_model_len']} (recorded "
                             f"{entry.get('recorded_at')}); {fit} is used")
                return self.resolve(dict(overrides, max_model_len=fit), notes, may_fit=False)
        if entry and entry.get("kv_cache_memory_bytes"):
            overrides = dict(overrides, kv_cache_memory_bytes=int(entry["kv_cache_memory_bytes"]))
            return (self.render(settings_with(self.config, overrides)),
                    _Kv("cache", bytes=int(entry["kv_cache_memory_bytes"]), key=key, parts=parts,
                        recorded_at=entry.get("recorded_at")), overrides)
        return specs, _Kv("calibrate", key=key, parts=parts), overrides

    def record(self, kv: _Kv, values: Mapping[str, Any], stamp: str) -> dict[str, Any] | None:
        """Merge values into the record for kv's key; the entry (None without a key)."""
        if kv.key is None or kv.parts is None:
            return None
        if not same_values(lookup(self.cache, kv.key), values):
            self.cache = record(self.cache, kv.key, kv.parts, values, stamp)
            self.changed = True
        return lookup(self.cache, kv.key)


# -------------------------------------------------------------------------------------------- observe

@dataclass
class _Failure:
    node: str
    stage: str
    text: str


def _waits(observed: Mapping[str, Any], node: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The waits that ran on node, in order (skipped ones dropped)."""
    entry = observed.get(node) or {}
    out = []
    for name in WAIT_NAMES:
        wait = entry.get(name)
        if isinstance(wait, Mapping) and not wait.get("skipped") and "ok" in wait:
            out.append((name, wait))
    return out


def failures(observed: Mapping[str, Any], order: Sequence[str]) -> list[_Failure]:
    """Every failed wait and every flush service that did not start, in rank order."""
    out = []
    for node in order:
        flush = (observed.get(node) or {}).get("flush") or {}
        if flush.get("failed"):
            msg = " ".join(str(flush.get("msg") or "").split())
            # ansible.builtin.systemd_service's failure names the unit only in its invocation
            unit = flush.get("service") or ((flush.get("invocation") or {}).get("module_args") or {}).get("name")
            why = (" it is not installed: run the main entry point of dgxspark.vllm.cache_flush (the site playbook) "
                   "before the launch" if FLUSH_NOT_INSTALLED in msg
                   else f" its journal on {node} (journalctl -u {unit or 'the flush service'}) says why")
            out.append(_Failure(node, "flush", f"{node}: the page-cache flush service did not start: {msg};{why}"))
        for name, wait in _waits(observed, node):
            if not wait.get("ok"):
                text = f"{node}: phase reached '{wait.get('phase')}': {wait.get('reason')}"
                if wait.get("engine_error") and str(wait["engine_error"]) not in str(wait.get("reason") or ""):
                    text += f" [engine: {wait['engine_error']}]"
                out.append(_Failure(node, name, text))
    return out


def latest_report(observed: Mapping[str, Any], node: str) -> Mapping[str, Any] | None:
    """The log report of node's last wait (each wait reads the log once at its end)."""
    reports = [wait.get("log_report") for _name, wait in _waits(observed, node) if wait.get("log_report")]
    return reports[-1] if reports else None


def last_lines(observed: Mapping[str, Any], node: str) -> list[str]:
    waits = _waits(observed, node)
    return list(waits[-1][1].get("last_lines") or []) if waits else []


def estimated_max_model_len(observed: Mapping[str, Any], order: Sequence[str]) -> int | None:
    """The smallest maximum model length an engine estimated (its max-model-len did not fit), or None."""
    values = [int(r["estimated_max_model_len"]) for node in order
              for r in [latest_report(observed, node)] if r and r.get("estimated_max_model_len")]
    return min(values) if values else None


def served_metrics(nodes: Mapping[str, Mapping[str, Any]], order: Sequence[str]) -> Mapping[str, Any] | None:
    """The head's /metrics figures when the nodes' read (vllm_node_state with api_url) found the API answering 200
    on every node and the head's /metrics read; None otherwise (the launch then checks the API with its retries)."""
    answers = [(nodes.get(node) or {}).get("api") or {} for node in order]
    if not all(answer.get("ok") for answer in answers):
        return None
    return answers[0].get("metrics") or None


def kv_report_text(kv_text: str, kv_bytes: int | None, report: Mapping[str, Any] | None, max_model_len: str,
                   notes: Sequence[str]) -> str:
    """The launch's closing line: bytes and their source, tokens, concurrency, max-model-len."""
    report = report or {}
    size = f"{kv_bytes} bytes" if kv_bytes is not None else "sized by vLLM"
    tokens = report.get("kv_cache_tokens") or "?"
    if report.get("max_concurrency") is not None:
        where = f" in the {report.get('kv_cache_pool')} pool, maximum concurrency {report['max_concurrency']}x"
    else:
        where = " (from the engine's /metrics)"
    text = f"KV cache: {size} ({kv_text}); {tokens} tokens{where} at max-model-len {max_model_len}"
    if notes:
        text += "; " + "; ".join(notes)
    return text + "."


# ----------------------------------------------------------------------------------------------- plan

def _restart(config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]],
             specs: Mapping[str, Mapping[str, Any]]) -> tuple[bool, bool]:
    """(restart, any_exists): any rank not running or out of date; any serve container exists at all."""
    restart, exists = False, False
    for name in rank_order(config):
        container = _node_state(nodes, name).get("container") or {}
        exists = exists or bool(container.get("exists"))
        if not container.get("running") or container.get("config_hash") != specs[name]["config_hash"]:
            restart = True
    return restart, exists


def fit_advice(estimate: int | None, fit: int | None, block: int | None, max_model_len: str, opt_in: str = "") -> list[str]:
    """What a failed start says when an engine estimated a shorter max-model-len than it was given (none without
    an estimate): the estimate, and the variable to set (``opt_in``: a further way, appended to the fix)."""
    if estimate is None:
        return []
    rounded = f" ({fit} is that rounded down to the block size {block})" if fit else ""
    return [f"The engine cannot fit max-model-len {max_model_len} into its KV cache: the estimated maximum model "
            f"length is {estimate}.",
            f"Fix: set dgxspark_vllm_max_model_len to at most {estimate}{rounded}, or give the KV cache more "
            f"memory{opt_in}."]


def _diagnosis(stage: str, found: Sequence[_Failure], observed: Mapping[str, Any], order: Sequence[str],
               estimate: int | None, fit: int | None, block: int, max_model_len: str, lines: int,
               accepted: bool = False) -> str:
    out = [f"Launch failed during {stage}."]
    out += [failure.text for failure in found]
    # the opt-in is offered only where it would act: not set yet, and a fit of at least one block
    opt_in = (f", or set launch_accept_estimated_max_model_len: true to relaunch with {fit} automatically"
              if fit and not accepted else "")
    out += fit_advice(estimate, fit, block, max_model_len, opt_in)
    out.append(f"Every rank was stopped. Last {lines} log lines of every node:")
    for node in order:
        out.append(f"----- {node} ({'head' if node == order[0] else 'worker'}) -----")
        out.append("\n".join(last_lines(observed, node)) or "(no log read: no wait ran on this rank)")
    return "\n".join(out)


def plan(config: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], render: Render,
         cache: dict[str, Any], calibration: Calibration, previous: Mapping[str, Any] | None = None,
         observed: Mapping[str, Any] | None = None, metrics: Mapping[str, Any] | None = None,
         diagnosis_lines: int = 30, now: str = "") -> Plan:
    """The next step. First call: previous None. After a start: previous = the last plan's state, observed = per
    node {flush: the flush service's start result, rendezvous/load/serve/alive: the waits}. After ``nothing``:
    metrics = the head's `vllm_metrics_info` result, for the report."""
    order = rank_order(config)
    in_play(config, nodes)
    config, image = pinned_image(config, nodes)
    resolver = _Resolver(config, nodes, render, cache, calibration)
    state: dict[str, Any] = copy.deepcopy(dict(previous)) if previous else {}

    def finish(step: str, specs: dict[str, dict[str, Any]], kv: _Kv, message: str = "", stop_first: bool = False,
               any_exists: bool = True) -> Plan:
        head_command = specs[order[0]]["container"]["command"]
        # every step this launch planned, in order: the last plan tells the whole path (["nothing", "done"])
        state.update(step=step, kv=kv.as_dict(), max_model_len=max_model_len_text(head_command),
                     steps=[*state.get("steps", []), step])
        state["kv"]["text"] = kv_source_text(state["kv"], calibration.record_path)
        return Plan(step, specs, state, message, stop_first, any_exists,
                    resolver.cache if resolver.changed else None)

    if not previous:
        state = {"attempt": 0, "overrides": {}, "notes": [], "refitted": False, "image": image}
        notes: list[str] = []
        specs, kv, overrides = resolver.resolve({}, notes, may_fit=calibration.accept_estimated_max_model_len)
        state.update(overrides=overrides, notes=notes)
        restart, any_exists = _restart(config, nodes, specs)
        if kv.source == "unavailable":
            return finish("fail", specs, kv, f"The launch cannot start: {(kv.chosen or {}).get('reason')}.",
                          any_exists=any_exists)
        # a group that runs the render but has no measured KV budget (a calibration that failed) calibrates again
        if not restart and kv.source != "calibrate":
            # the group this run found serving (each rank's container start): the guard keeps it already when armed
            state["serving"] = {name: str((_node_state(nodes, name).get("container") or {}).get("started_at") or "")
                                for name in order}
            served = served_metrics(nodes, order)
            if served is not None:   # the read found it serving: nothing to start and nothing left to check
                text = kv_report_text(kv_source_text(kv.as_dict(), calibration.record_path), kv.bytes, served,
                                      max_model_len_text(specs[order[0]]["container"]["command"]), notes)
                return finish("done", specs, kv, text, any_exists=any_exists)
            return finish("nothing", specs, kv, any_exists=any_exists)
        refused = (refusal(locked_nodes(order, nodes), config["staging_lock_path"])
                   or launch_refusal(bool(config.get("firewall")), order, nodes)
                   or folders_refusal(order, nodes))
        if refused:   # before the maintenance lock and before anything is stopped
            return finish("fail", specs, kv, refused, any_exists=any_exists)
        state.update(attempt=1, starts=starts_at_most(kv.source == "calibrate", calibration.accept_estimated_max_model_len))
        return finish("calibrate" if kv.source == "calibrate" else "start", specs, kv, any_exists=any_exists)

    last = state.get("step")
    kv = _kv_from(state["kv"])
    notes = list(state.get("notes", []))
    if last == "nothing":
        specs = render(settings_with(config, state["overrides"]))
        text = kv_report_text(kv_source_text(state["kv"], calibration.record_path), kv.bytes, metrics,
                              state["max_model_len"], notes)
        return finish("done", specs, kv, text)
    if last not in STARTS:
        raise PlanError(f"nothing follows the step {last!r}: plan again from the nodes' states (previous: none)")
    observed = observed or {}
    specs = render(settings_with(config, state["overrides"]))
    head_command = specs[order[0]]["container"]["command"]
    found = failures(observed, order)
    if not found:
        if last == "calibrate":
            reports = {node: latest_report(observed, node) or {} for node in order}
            try:
                chosen = choose(reports, calibration.policy, calibration.margin_bytes)
            except CalibrationError as exc:
                return finish("fail", specs, kv, f"KV calibration failed: {exc}. The group keeps serving with the KV "
                              "cache vLLM sized itself; the next launch calibrates again. To stop calibrating, set "
                              "dgxspark_vllm_kv_cache_memory_bytes or launch_kv_calibration: false.")
            resolver.record(kv, dict(chosen), now)
            overrides = dict(state["overrides"], kv_cache_memory_bytes=int(chosen["kv_cache_memory_bytes"]))
            kv = _Kv("calibrated", bytes=int(chosen["kv_cache_memory_bytes"]), key=kv.key, parts=kv.parts,
                     chosen=dict(chosen))
            state.update(overrides=overrides, attempt=state["attempt"] + 1)
            return _next_start(finish, "start", render(settings_with(config, overrides)), kv, state, order)
        text = kv_report_text(kv_source_text(state["kv"], calibration.record_path), kv.bytes,
                              latest_report(observed, order[0]), max_model_len_text(head_command), notes)
        return finish("done", specs, kv, text)

    estimate = estimated_max_model_len(observed, order)
    block = block_size(head_command, calibration.default_block_size)
    fit = round_down_to_block(estimate, block) if estimate is not None else None
    if estimate is not None and kv.source in ("cache", "calibrate", "calibrated"):
        resolver.record(kv, {"estimated_max_model_len": estimate}, now)
    if (estimate is not None and fit and calibration.accept_estimated_max_model_len and not state.get("refitted")):
        notes.append(f"max-model-len {max_model_len_text(head_command)} did not fit: the engine estimated {estimate}; "
                     f"relaunched with {fit} (rounded down to the block size {block})")
        overrides = {k: v for k, v in state["overrides"].items() if k != "kv_cache_memory_bytes"}
        overrides["max_model_len"] = fit
        if kv.source == "inventory":
            new_specs, new_kv = render(settings_with(config, overrides)), kv
        else:
            new_specs, new_kv, overrides = resolver.resolve(overrides, notes, may_fit=False)
        state.update(overrides=overrides, notes=notes, refitted=True, attempt=state["attempt"] + 1)
        step = "calibrate" if new_kv.source == "calibrate" else "refit"
        return _next_start(finish, step, new_specs, new_kv, state, order, stop_first=True)
    stage = STAGES[found[0].stage]
    message = _diagnosis(stage, found, observed, order, estimate, fit, block, max_model_len_text(head_command),
                         diagnosis_lines, calibration.accept_estimated_max_model_len)
    return finish("fail", specs, kv, message, stop_first=True)


def _next_start(finish: Callable[..., Plan], step: str, specs: dict[str, dict[str, Any]], kv: _Kv,
                state: dict[str, Any], order: Sequence[str], stop_first: bool = False) -> Plan:
    if state["attempt"] > MAX_ATTEMPTS:
        return finish("fail", specs, kv, f"Launch gave up after {MAX_ATTEMPTS} starts of the group ("
                      f"{', '.join(order)}); the last one needed yet another ({step}). Every rank was stopped.",
                      stop_first=True)
    return finish(step, specs, kv, stop_first=stop_first)
