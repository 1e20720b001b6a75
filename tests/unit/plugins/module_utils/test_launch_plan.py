# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch planner (_launch_plan) over the two-node CPU lab: every step from recorded node states, the real
render of profile lab_cpu and the waits judged from captured engine logs (helpers/launch.py)."""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._kv_calibration import (
    GIB,
    cache_key,
    empty_cache,
    key_parts,
    lookup,
    record,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import (
    MAX_ATTEMPTS,
    STAGES,
    Calibration,
    Plan,
    PlanError,
    carries_out,
    described_nodes,
    plan,
    starts_at_most,
)
from helpers.fixtures import read_log
from helpers.launch import (
    COMMIT,
    FLUSH_UNIT,
    HEAD,
    IPS,
    LOG_LINES,
    SERVED_METRICS,
    WORKER,
    answered,
    config,
    good_start,
    log_until,
    node_state,
    nodes,
    rank,
    renderer,
    running,
    wait,
)

RECORD = "/srv/inventories/lab/dgxspark-kv-calibration.json"
NOW = "2026-12-02T10:00:00Z"
EARLIER = "2026-12-01T08:00:00Z"
MODEL_PATH = "/var/tmp/models/tiny-glm53"
ONE_GIB = 1 << 30
INVENTORY_KV = 268435456          # the lab run that captured lab_cpu_tp2_*_estimated_max_len
LONG = 2000000                    # its --max-model-len
ESTIMATE = 1048448                # what its head estimated
AUTO = ("lab_cpu_tp2_head_auto_kv.log.gz", "lab_cpu_tp2_worker_auto_kv.log.gz")
READY = ("lab_cpu_tp2_head_ready.log.gz", "lab_cpu_tp2_worker_ready.log.gz")
EST_HEAD, EST_WORKER = "lab_cpu_tp2_head_estimated_max_len.log.gz", "lab_cpu_tp2_worker_estimated_max_len.log.gz"
REPORT_READY = "4194304 tokens in the CPU pool, maximum concurrency 1024.0x"


# ----------------------------------------------------------------------------------------------- helpers

def run(cfg: dict[str, Any], states: dict[str, dict[str, Any]], cache: dict[str, Any] | None = None,
        previous: Plan | None = None, observed: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
        **calibration: Any) -> Plan:
    """One plan call as the action makes it; previous is the last call's Plan (its state, through JSON)."""
    state = json.loads(json.dumps(previous.state)) if previous is not None else None
    return plan(cfg, states, renderer(cfg, states), copy.deepcopy(cache) if cache is not None else empty_cache(),
                Calibration(record_path=RECORD, **calibration), state, observed, metrics, LOG_LINES, NOW)


def command(result: Plan, name: str = HEAD) -> list[str]:
    return result.specs[name]["container"]["command"]


def flag(result: Plan, name: str, node: str = HEAD) -> str | None:
    cmd = command(result, node)
    return cmd[cmd.index(name) + 1] if name in cmd else None


def lab_key(cfg: dict[str, Any], states: dict[str, dict[str, Any]], **settings: Any) -> tuple[str, dict[str, Any]]:
    """The KV record's key of the lab's render (computed here from the render, not by the planner)."""
    specs = renderer(cfg, states)(dict(cfg["settings"], **settings))
    parts = key_parts(specs[HEAD]["container"]["command"], MODEL_PATH, COMMIT,
                      [states[HEAD]["identity"], states[WORKER]["identity"]])
    return cache_key(parts), parts


def recorded(cfg: dict[str, Any], states: dict[str, dict[str, Any]], values: dict[str, Any],
             cache: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    key, parts = lab_key(cfg, states, **settings)
    return record(cache or empty_cache(), key, parts, values, EARLIER)


def tail(name: str, text: str | None = None) -> str:
    """A rank's block of the diagnosis: the last lines its last wait read."""
    lines = [line for line in (read_log(name) if text is None else text).splitlines() if line.strip()]
    return "\n".join(lines[-LOG_LINES:])


def logs_section(head: str, worker: str) -> str:
    return (f"Every rank was stopped. Last {LOG_LINES} log lines of every node:\n----- {HEAD} (head) -----\n{head}\n"
            f"----- {WORKER} (worker) -----\n{worker}")


NO_LOG = "(no log read: no wait ran on this rank)"


def estimate_failure(head_log: str = EST_HEAD, worker_log: str = EST_WORKER) -> dict[str, Any]:
    """The lab start whose max-model-len did not fit: every rank loaded, the head's serve wait saw its ValueError."""
    return {
        HEAD: rank(load=wait(head_log, "kv_allocated", log_until(head_log, "kv_allocated"), (IPS[WORKER],)),
                   serve=wait(head_log, "api_up", peers=(IPS[WORKER],))),
        WORKER: rank(rendezvous=wait(worker_log, "rendezvous", log_until(worker_log, "rendezvous")),
                     load=wait(worker_log, "kv_allocated", peers=(IPS[HEAD],), peers_after="weights_loaded")),
    }


def estimate_lines(length: int, estimate: int, fit: int, block: int) -> str:
    return (f"The engine cannot fit max-model-len {length} into its KV cache: the estimated maximum model length is "
            f"{estimate}.\nFix: set dgxspark_vllm_max_model_len to at most {estimate} ({fit} is that rounded down to "
            f"the block size {block}), or give the KV cache more memory, or set launch_accept_estimated_max_model_len:"
            f" true to relaunch with {fit} automatically.")


def head_engine_line(estimate: int) -> str:
    error = f"max-model-len does not fit the KV cache: the estimated maximum model length is {estimate}"
    return f"{HEAD}: phase reached 'kv_allocated': engine error: {error}"


# ------------------------------------------------------------------------------------------ first plan

def test_first_launch_without_a_record_calibrates() -> None:
    cfg, states = config(), nodes()
    result = run(cfg, states)
    key, parts = lab_key(cfg, states)
    assert (result.step, result.state["attempt"], result.stop_first) == ("calibrate", 1, False)
    assert result.any_exists is False
    assert result.message == "" and result.cache is None
    assert result.state["kv"] == {"source": "calibrate", "bytes": None, "key": key, "parts": parts, "recorded_at": None,
                                  "chosen": None, "text": "sized by vLLM for this start (calibration pending)"}
    assert "--kv-cache-memory-bytes" not in command(result, HEAD) + command(result, WORKER)
    assert result.state["max_model_len"] == "4096"
    assert parts["model_revision"] == COMMIT   # the head's stamp names the staged commit


def test_the_key_takes_the_configured_revision_without_a_stamp() -> None:
    cfg = config()
    states = nodes(head=node_state(HEAD, stamp={}))
    assert run(cfg, states).state["kv"]["parts"]["model_revision"] == "configured:main"


def test_a_recorded_budget_starts_the_group_with_it() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB, "source": "cpu_auto"})
    result = run(cfg, states, cache)
    key, _parts = lab_key(cfg, states)
    assert (result.step, result.state["attempt"], result.cache) == ("start", 1, None)
    assert flag(result, "--kv-cache-memory-bytes") == str(ONE_GIB)
    assert flag(result, "--kv-cache-memory-bytes", WORKER) == str(ONE_GIB)
    assert result.state["kv"]["text"] == f"recorded {EARLIER} in {RECORD} for key {key}"
    assert result.state["overrides"] == {"kv_cache_memory_bytes": ONE_GIB}


def test_every_rank_running_the_render_is_nothing_to_do() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    specs = run(cfg, states, cache).specs
    result = run(cfg, running(specs), cache)
    assert (result.step, result.state["attempt"], result.any_exists, result.stop_first) == ("nothing", 0, True, False)
    assert result.specs == specs and result.cache is None


def test_a_group_running_the_calibration_render_without_a_record_calibrates_again() -> None:
    # a calibration that failed left the group serving with vLLM's own sizing: no measured budget, so not "nothing"
    cfg, states = config(), nodes()
    first = run(cfg, states, {"format": 1, "entries": {}})
    assert first.step == "calibrate"
    again = run(cfg, running(first.specs), {"format": 1, "entries": {}})
    assert (again.step, again.state["attempt"], again.any_exists) == ("calibrate", 1, True)


@pytest.mark.parametrize("change, any_exists", [
    ("worker_out_of_date", True),
    ("head_stopped", True),
    ("worker_absent", True),
    ("none_exists", False),
])
def test_any_rank_not_running_the_render_restarts_the_group(change: str, any_exists: bool) -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    specs = run(cfg, states, cache).specs
    states = running(specs)
    if change == "worker_out_of_date":
        states[WORKER] = node_state(WORKER, "0000000000000000")
    elif change == "head_stopped":
        states[HEAD] = node_state(HEAD, specs[HEAD]["config_hash"], running=False)
    elif change == "worker_absent":
        states[WORKER] = node_state(WORKER)
    else:
        states = nodes()
    result = run(cfg, states, cache)
    assert (result.step, result.state["attempt"], result.any_exists) == ("start", 1, any_exists)


def test_a_budget_set_in_the_inventory_wins_and_is_never_recorded() -> None:
    cfg, states = config(kv_cache_memory_bytes=ONE_GIB), nodes()
    other = recorded(config(), states, {"kv_cache_memory_bytes": 5 * ONE_GIB})   # the same key: never used
    first = run(cfg, states, other)
    assert (first.step, first.state["kv"]["source"], first.state["kv"]["key"]) == ("start", "inventory", None)
    assert flag(first, "--kv-cache-memory-bytes") == str(ONE_GIB)
    assert first.state["overrides"] == {}
    done = run(cfg, states, other, first, good_start(*READY))
    assert (done.step, done.cache) == ("done", None)
    assert done.message == (f"KV cache: {ONE_GIB} bytes (set in the inventory (dgxspark_vllm_kv_cache_memory_bytes)); "
                            f"{REPORT_READY} at max-model-len 4096.")


def test_calibration_off_leaves_the_size_to_vllm() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    first = run(cfg, states, cache, enabled=False)
    assert (first.step, first.state["kv"]["source"], first.state["kv"]["key"]) == ("start", "off", None)
    assert "--kv-cache-memory-bytes" not in command(first)
    done = run(cfg, states, cache, first, good_start(*AUTO), enabled=False)
    assert (done.step, done.cache) == ("done", None)
    assert done.message == ("KV cache: sized by vLLM (no calibration (launch_kv_calibration: false)); 5085952 tokens "
                            "in the CPU pool, maximum concurrency 1241.69x at max-model-len 4096.")


@pytest.mark.parametrize("calibrates, accepts_fit, expected", [
    (False, False, 1), (True, False, 2), (False, True, MAX_ATTEMPTS), (True, True, MAX_ATTEMPTS)])
def test_a_launch_may_make_only_the_starts_its_first_step_can_lead_to(calibrates: bool, accepts_fit: bool,
                                                                      expected: int) -> None:
    assert starts_at_most(calibrates, accepts_fit) == expected


def test_the_start_loop_has_one_turn_per_start_the_path_can_take() -> None:
    """Every path's starts fit in the first plan's attempts, and no more turns than it can take are walked."""
    cfg, states = config(kv_cache_memory_bytes=ONE_GIB), nodes()
    first = run(cfg, states)   # a known budget: one start; it serves, or fails with nothing to refit
    assert first.as_result()["attempts"] == [1]
    assert run(cfg, states, None, first, estimate_failure()).step == "fail"
    cfg = config()
    first = run(cfg, states)   # a calibration and the start with its budget
    calibrated = run(cfg, states, None, first, good_start(*AUTO))
    assert (first.as_result()["attempts"], calibrated.step, calibrated.state["attempt"]) == ([1, 2], "start", 2)
    assert run(cfg, states, calibrated.cache, calibrated, estimate_failure()).step == "fail"
    # a refit may follow either: the most, the refit's calibration and its start included
    accepting = run(config(max_model_len=LONG), states, accept_estimated_max_model_len=True)
    assert accepting.as_result()["attempts"] == list(range(1, MAX_ATTEMPTS + 1))
    # a later plan keeps the first one's count (the loop reads the first plan's list only)
    assert calibrated.as_result()["attempts"] == [1, 2]


# ------------------------------------------------------------------------------------------ calibration

def test_calibration_starts_with_the_smallest_auto_sized_kv_records_it_once_and_is_then_idempotent() -> None:
    cfg, states = config(), nodes()
    first = run(cfg, states)
    calibrated = run(cfg, states, None, first, good_start(*AUTO))
    budget = int(1.21 * GIB)
    key, parts = lab_key(cfg, states)
    assert (calibrated.step, calibrated.state["attempt"], calibrated.stop_first) == ("start", 2, False)
    assert flag(calibrated, "--kv-cache-memory-bytes") == str(budget)
    chosen = {"kv_cache_memory_bytes": budget, "source": "cpu_auto", "policy": "requested", "margin_bytes": 0,
              "per_node": {HEAD: budget, WORKER: budget}}
    assert calibrated.cache == {"format": 1, "entries": {key: dict(chosen, parts=parts, recorded_at=NOW)}}
    assert calibrated.state["kv"]["text"] == (f'calibrated now (cpu_auto, policy requested, per node {{"{HEAD}": '
                                              f'{budget}, "{WORKER}": {budget}}}), recorded for key {key}')

    done = run(cfg, states, calibrated.cache, calibrated, good_start(*READY))
    assert (done.step, done.cache) == ("done", None)    # recorded once, by the calibration
    assert (first.as_result()["steps"], done.as_result()["steps"]) == (["calibrate"], ["calibrate", "start", "done"])
    assert done.message == (f"KV cache: {budget} bytes (calibrated now (cpu_auto, policy requested, per node "
                            f'{{"{HEAD}": {budget}, "{WORKER}": {budget}}}), recorded for key {key}); {REPORT_READY} '
                            "at max-model-len 4096.")

    again = run(cfg, running(done.specs), calibrated.cache)
    assert (again.step, again.state["kv"]["source"], again.cache) == ("nothing", "cache", None)


@pytest.mark.parametrize("policy, margin, budget, per_node", [
    ("requested", 0, 10200547328, {HEAD: 10531412787, WORKER: 10200547328}),
    ("full", 0, 26600000000, {HEAD: 26843545600, WORKER: 26600000000}),
    ("requested", 1 << 20, 10200547328 - (1 << 20), {HEAD: 10531412787, WORKER: 10200547328}),
])
def test_calibration_takes_the_gpu_suggestions_of_every_rank(policy: str, margin: int, budget: int,
                                                             per_node: dict[str, int]) -> None:
    cfg, states = config(), nodes()
    first = run(cfg, states, policy=policy, margin_bytes=margin)
    observed = good_start("fmt_gpu_head_two_starts.log", "fmt_gpu_worker_headless_kv.log")
    result = run(cfg, states, None, first, observed, policy=policy, margin_bytes=margin)
    assert (result.step, flag(result, "--kv-cache-memory-bytes")) == ("start", str(budget))
    entry = lookup(result.cache or {}, first.state["kv"]["key"])
    assert entry is not None
    assert (entry["kv_cache_memory_bytes"], entry["source"], entry["per_node"]) == (budget, "suggestion", per_node)


def test_calibration_without_an_estimate_in_the_logs_fails() -> None:
    cfg, states = config(), nodes()
    first = run(cfg, states)
    result = run(cfg, states, None, first, good_start(*READY))   # KV set explicitly: no estimate logged
    assert (result.step, result.cache) == ("fail", None)
    assert result.message == (
        f"KV calibration failed: no KV estimate in the logs of {HEAD} (phase api_up, CPU KV explicit 1.0 GiB), "
        f"{WORKER} (phase kv_allocated, CPU KV explicit 1.0 GiB). vLLM prints it only when --kv-cache-memory-bytes "
        "is unset (GPU: the `--kv-cache-memory=` suggestion after memory profiling; CPU: `Auto set (...) GiB for KV "
        "cache`). The group keeps serving with the KV cache vLLM sized itself; the next launch calibrates again. To "
        "stop calibrating, set dgxspark_vllm_kv_cache_memory_bytes or launch_kv_calibration: false.")


# ------------------------------------------------------------------------------------------------- done

def test_a_start_that_serves_is_done_with_the_kv_report() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    first = run(cfg, states, cache)
    done = run(cfg, states, cache, first, good_start(*READY))
    key, _parts = lab_key(cfg, states)
    assert (done.step, done.stop_first, done.cache) == ("done", False, None)
    assert done.message == (f"KV cache: {ONE_GIB} bytes (recorded {EARLIER} in {RECORD} for key {key}); "
                            f"{REPORT_READY} at max-model-len 4096.")
    assert first.as_result()["serving"] == done.as_result()["serving"] == {}   # started now: the guard is armed


@pytest.mark.parametrize("metrics, tokens", [
    ({"changed": False, "kv_cache_tokens": 4194304, "kv_cache_blocks": 32768, "kv_block_size": 128}, "4194304"),
    ({"changed": False, "failed": True, "msg": "http://10.77.1.11:8000/metrics: connection refused"}, "?"),
])
def test_nothing_to_do_reports_the_kv_cache_from_the_metrics(metrics: dict[str, Any], tokens: str) -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    states = running(run(cfg, states, cache).specs)
    nothing = run(cfg, states, cache)
    done = run(cfg, states, cache, nothing, None, metrics)
    key, _parts = lab_key(cfg, states)
    assert (done.step, done.state["attempt"], done.cache) == ("done", 0, None)
    assert done.message == (f"KV cache: {ONE_GIB} bytes (recorded {EARLIER} in {RECORD} for key {key}); {tokens} "
                            "tokens (from the engine's /metrics) at max-model-len 4096.")


def test_a_group_found_serving_and_answering_is_done_after_one_read() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    states = running(run(cfg, states, cache).specs)
    done = run(cfg, answered(states, SERVED_METRICS), cache)
    key, _parts = lab_key(cfg, states)
    assert (done.step, done.state["attempt"], done.cache, done.any_exists) == ("done", 0, None, True)
    # the group found serving, for the guard (it keeps this group already when its baseline is these starts)
    started = "2026-12-01T00:20:00Z"
    assert done.as_result()["serving"] == {HEAD: started, WORKER: started}
    # the same report as the longer way (nothing, the API check, /metrics, plan again)
    longer = run(cfg, states, cache, run(cfg, states, cache), None, SERVED_METRICS)
    assert longer.as_result()["serving"] == {HEAD: started, WORKER: started}
    # the path each took: one plan, or the API check and /metrics in between
    assert (done.as_result()["steps"], longer.as_result()["steps"]) == (["done"], ["nothing", "done"])
    # nothing to start: the launch's start loop has no turn
    assert done.as_result()["attempts"] == longer.as_result()["attempts"] == []
    assert done.message == longer.message == (
        f"KV cache: {ONE_GIB} bytes (recorded {EARLIER} in {RECORD} for key {key}); 4194304 "
        "tokens (from the engine's /metrics) at max-model-len 4096.")


@pytest.mark.parametrize("step, first, head_differs, check_mode, carried", [
    ("done", True, False, False, False),     # found serving and answering, the head's record complete: the report only
    ("done", True, True, False, True),       # the head's copy of the KV record lacks an entry: run_plan writes it
    ("done", True, False, True, True),       # check mode: each node's docker run line
    ("done", False, False, False, True),     # a start's last plan, inside run_plan (which reported it): no second report
    ("nothing", True, False, False, True),   # found serving, not answering everywhere yet: the API check with retries
    ("fail", True, False, False, True),      # the refusal, from run_plan
    ("start", True, False, False, True),
    ("calibrate", True, False, False, True),
    ("refit", True, False, False, True),
])
def test_run_plan_is_left_out_only_for_a_group_found_serving_with_nothing_to_record(
        step: str, first: bool, head_differs: bool, check_mode: bool, carried: bool) -> None:
    assert carries_out(step, first, head_differs, check_mode) is carried


@pytest.mark.parametrize("worker_status, metrics", [
    (-1, {"kv_cache_tokens": 4194304}),   # a worker did not reach the head's API: the launch checks with retries
    (401, {"kv_cache_tokens": 4194304}),
    (200, None),                          # the head's /metrics was not read
])
def test_a_group_not_answering_everywhere_is_left_to_the_api_check(worker_status: int,
                                                                   metrics: dict[str, Any] | None) -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    states = running(run(cfg, states, cache).specs)
    assert run(cfg, answered(states, metrics, worker_status), cache).step == "nothing"


def test_an_answering_api_does_not_stop_a_restart() -> None:
    # the API answers, but the nodes run another render: the group restarts, whatever the read found
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    first = run(cfg, states, cache)
    stale = running({name: dict(spec, config_hash="0" * 64) for name, spec in first.specs.items()})
    assert run(cfg, answered(stale, {"kv_cache_tokens": 1}), cache).step == "start"


# --------------------------------------------------------------------------------------------- failures

def _flush_failed(msg: str) -> dict[str, Any]:
    """A registered ansible.builtin.systemd_service failure (ignore_errors: the caller judges it)."""
    return {"changed": False, "failed": True, "msg": msg,
            "invocation": {"module_args": {"name": FLUSH_UNIT, "state": "started", "enabled": None, "force": None,
                                           "masked": None, "daemon_reload": False, "daemon_reexec": False,
                                           "scope": "system", "no_block": False}}}


def _cut_before(text: str) -> str:
    """text without its last line."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:-1])


WORKER_READY = READY[1]
FOLLOWER_WORKER = "lab_cpu_worker_follower_assertion.log.gz"
FOLLOWER_HEAD = "lab_cpu_head_after_follower_assertion.log.gz"
STALLED_WORKER = _cut_before(log_until(WORKER_READY, "rendezvous"))
FOLLOWER = "worker started without --headless (follower assertion)"
OOM = ("out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
       "capacity of 121.69 GiB of which 1.12 GiB is free.")
RENDEZVOUS_TIMEOUT = ("rendezvous timed out after 61 s: 1/2 clients joined (is every node started and able to reach "
                      "--master-addr:--master-port?)")
API = f"http://{IPS[HEAD]}:8000/v1/models"
API_ERROR = f"{API} did not answer HTTP 200 from this node within 120 s (last: [Errno 113] No route to host)"
NOT_INSTALLED = f"Could not find the requested service {FLUSH_UNIT}: host"
FLUSH_JOB_FAILED = (f"Unable to start service {FLUSH_UNIT}: Job for {FLUSH_UNIT} failed because the control process "
                    f"exited with error code.\nSee \"systemctl status {FLUSH_UNIT}\" and \"journalctl -xeu "
                    f"{FLUSH_UNIT}\" for details.\n")
FLUSH_JOB_FAILED_LINE = " ".join(FLUSH_JOB_FAILED.split())

FAILURES: dict[str, tuple[dict[str, Any], str, list[str], str, str]] = {
    # name: (observed, stage, rank lines, head's last lines, worker's last lines)
    "flush_not_installed": (
        {HEAD: rank(), WORKER: rank(flush=_flush_failed(NOT_INSTALLED))},
        "the start of the page-cache flush service",
        [f"{WORKER}: the page-cache flush service did not start: {NOT_INSTALLED}; it is not installed: run the main "
         "entry point of dgxspark.vllm.cache_flush (the site playbook) before the launch"],
        NO_LOG, NO_LOG),
    "flush_failed": (
        {HEAD: rank(flush=_flush_failed(FLUSH_JOB_FAILED)), WORKER: rank()},
        "the start of the page-cache flush service",
        [f"{HEAD}: the page-cache flush service did not start: {FLUSH_JOB_FAILED_LINE}; its journal on {HEAD} "
         f"(journalctl -u {FLUSH_UNIT}) says why"],
        NO_LOG, NO_LOG),
    "worker_rendezvous_timeout": (
        {HEAD: rank(), WORKER: rank(rendezvous=wait(WORKER_READY, "rendezvous", STALLED_WORKER))},
        "workers reaching the rendezvous",
        [f"{WORKER}: phase reached 'container_started': phase 'rendezvous' not reached within its budget of 300 s "
         "(last phase reached: container_started)"],
        NO_LOG, tail(WORKER_READY, STALLED_WORKER)),
    "worker_rendezvous_engine_error": (
        {HEAD: rank(), WORKER: rank(rendezvous=wait("fmt_gpu_oom.log", "rendezvous"))},
        "workers reaching the rendezvous",
        [f"{WORKER}: phase reached 'rendezvous': engine error: {OOM}"],
        NO_LOG, tail("fmt_gpu_oom.log")),
    "load_head_rendezvous_timeout": (
        {HEAD: rank(load=wait("lab_cpu_head_rendezvous_timeout.log.gz", "kv_allocated", peers=(IPS[WORKER],))),
         WORKER: rank(rendezvous=wait(WORKER_READY, "rendezvous", log_until(WORKER_READY, "rendezvous")),
                      load=wait(WORKER_READY, "kv_allocated", log_until(WORKER_READY, "rendezvous"),
                                peers=(IPS[HEAD],), peers_after="weights_loaded"))},
        "the head starting to serve",
        [f"{HEAD}: phase reached 'rendezvous': engine error: {RENDEZVOUS_TIMEOUT}",
         f"{WORKER}: phase reached 'rendezvous': phase 'weights_loaded' not reached within its budget of 1800 s "
         "(last phase reached: rendezvous)"],
        tail("lab_cpu_head_rendezvous_timeout.log.gz"), tail(WORKER_READY, log_until(WORKER_READY, "rendezvous"))),
    "load_worker_follower_then_head_serve": (
        {HEAD: rank(load=wait(FOLLOWER_HEAD, "kv_allocated", log_until(FOLLOWER_HEAD, "kv_allocated"),
                              (IPS[WORKER],)),
                    serve=wait(FOLLOWER_HEAD, "api_up", peers=(IPS[WORKER],))),
         WORKER: rank(rendezvous=wait(FOLLOWER_WORKER, "rendezvous", log_until(FOLLOWER_WORKER, "rendezvous")),
                      load=wait(FOLLOWER_WORKER, "kv_allocated", peers=(IPS[HEAD],), peers_after="weights_loaded"))},
        "the head starting to serve",
        [f"{HEAD}: phase reached 'kv_allocated': peer {IPS[WORKER]} dropped its connection (no TCP connection for "
         "99 s) while this rank waited in phase kv_allocated: the peer's engine is dead or hung",
         f"{WORKER}: phase reached 'weights_loaded': engine error: {FOLLOWER}"],
        tail(FOLLOWER_HEAD), tail(FOLLOWER_WORKER)),
    "worker_alive": (
        dict(good_start(*READY), **{WORKER: dict(good_start(*READY)[WORKER],
                                                 alive=wait(WORKER_READY, "rendezvous", api_error=API_ERROR))}),
        "the head starting to serve",
        [f"{WORKER}: phase reached 'kv_allocated': {API_ERROR}"],
        tail(READY[0]), tail(WORKER_READY)),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
@pytest.mark.parametrize("source", ["cache", "inventory"])
def test_a_failed_start_stops_every_rank_and_fails_with_the_diagnosis(name: str, source: str) -> None:
    observed, stage, lines, head_tail, worker_tail = FAILURES[name]
    cfg, states = (config(kv_cache_memory_bytes=ONE_GIB), nodes()) if source == "inventory" else (config(), nodes())
    cache = recorded(config(), states, {"kv_cache_memory_bytes": ONE_GIB})
    first = run(cfg, states, cache)
    result = run(cfg, states, cache, first, copy.deepcopy(observed))
    assert (result.step, result.stop_first, result.cache) == ("fail", True, None)
    assert result.message == "\n".join([f"Launch failed during {stage}."] + lines
                                       + [logs_section(head_tail, worker_tail)])


def test_every_wait_has_a_stage() -> None:
    assert set(STAGES) == {"flush", "rendezvous", "load", "serve", "alive"}


# ------------------------------------------------------------------------------ estimated max-model-len

@pytest.mark.parametrize("extra_args, default_block_size, block, fit", [
    ([], 16, 16, 1048448),                          # lab_cpu renders no --block-size: the default counts
    ([], 2304, 2304, 1048320),
    (["--block-size", "1000"], 2304, 1000, 1048000),  # the rendered --block-size wins over the default
])
def test_an_estimate_with_a_budget_from_the_inventory_fails_with_the_fit_and_records_nothing(
        extra_args: list[str], default_block_size: int, block: int, fit: int) -> None:
    cfg, states = config(max_model_len=LONG, kv_cache_memory_bytes=INVENTORY_KV, extra_args=extra_args), nodes()
    first = run(cfg, states, default_block_size=default_block_size)
    result = run(cfg, states, None, first, estimate_failure(), default_block_size=default_block_size)
    assert (result.step, result.stop_first, result.cache) == ("fail", True, None)
    assert result.message == "\n".join([
        "Launch failed during the head starting to serve.", head_engine_line(ESTIMATE),
        estimate_lines(LONG, ESTIMATE, fit, block),
        logs_section(tail(EST_HEAD), tail(EST_WORKER))])


def test_the_smallest_estimate_of_every_rank_counts() -> None:
    cfg, states = config(max_model_len=LONG, kv_cache_memory_bytes=INVENTORY_KV), nodes()
    first = run(cfg, states)
    observed = estimate_failure()
    observed[WORKER]["load"] = wait("fmt_cpu_estimated_max_len.log", "kv_allocated")
    result = run(cfg, states, None, first, observed)
    assert estimate_lines(LONG, 1920, 1920, 16) in result.message


@pytest.mark.parametrize("source", ["cache", "calibrate"])
def test_an_estimate_is_recorded_for_the_key_of_a_recorded_or_calibrating_start(source: str) -> None:
    cfg, states = config(max_model_len=LONG), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB}) if source == "cache" else None
    first = run(cfg, states, cache)
    assert first.state["kv"]["source"] == source
    result = run(cfg, states, cache, first, estimate_failure())
    key, parts = lab_key(cfg, states)
    assert result.step == "fail"
    values = {"kv_cache_memory_bytes": ONE_GIB} if source == "cache" else {}
    assert result.cache == {"format": 1, "entries": {
        key: dict(values, estimated_max_model_len=ESTIMATE, parts=parts, recorded_at=NOW)}}
    assert estimate_lines(LONG, ESTIMATE, ESTIMATE, 16) in result.message
    again = run(cfg, states, result.cache, first, estimate_failure())
    assert again.cache is None     # the same estimate again: the record is left as it is


def test_an_estimate_after_a_calibration_is_recorded_next_to_the_budget() -> None:
    cfg, states = config(max_model_len=LONG), nodes()
    calibrated = run(cfg, states, None, run(cfg, states), good_start(*AUTO))
    result = run(cfg, states, calibrated.cache, calibrated, estimate_failure())
    entry = lookup(result.cache or {}, calibrated.state["kv"]["key"])
    assert entry is not None
    assert (entry["kv_cache_memory_bytes"], entry["estimated_max_model_len"]) == (int(1.21 * GIB), ESTIMATE)


def test_accepting_the_estimate_recalibrates_at_the_fit_then_serves_with_a_note() -> None:
    cfg, states = config(max_model_len=LONG), nodes()
    first = run(cfg, states, accept_estimated_max_model_len=True)
    assert (first.step, first.state["notes"]) == ("calibrate", [])
    refit = run(cfg, states, None, first, estimate_failure(), accept_estimated_max_model_len=True)
    note = (f"max-model-len {LONG} did not fit: the engine estimated {ESTIMATE}; relaunched with {ESTIMATE} "
            "(rounded down to the block size 16)")
    assert (refit.step, refit.state["attempt"], refit.stop_first, refit.message) == ("calibrate", 2, True, "")
    assert (refit.state["overrides"], refit.state["notes"], refit.state["refitted"]) == (
        {"max_model_len": ESTIMATE}, [note], True)
    assert flag(refit, "--max-model-len") == flag(refit, "--max-model-len", WORKER) == str(ESTIMATE)
    assert "--kv-cache-memory-bytes" not in command(refit)
    old_key, _parts = lab_key(cfg, states)
    new_key, _parts = lab_key(cfg, states, max_model_len=ESTIMATE)
    assert refit.state["kv"]["key"] == new_key != old_key
    assert lookup(refit.cache or {}, old_key)["estimated_max_model_len"] == ESTIMATE   # type: ignore[index]

    start = run(cfg, states, refit.cache, refit, good_start(*AUTO), accept_estimated_max_model_len=True)
    assert (start.step, start.state["attempt"]) == ("start", 3)
    assert (flag(start, "--max-model-len"), flag(start, "--kv-cache-memory-bytes")) == (
        str(ESTIMATE), str(int(1.21 * GIB)))
    assert lookup(start.cache or {}, new_key)["kv_cache_memory_bytes"] == int(1.21 * GIB)   # type: ignore[index]
    done = run(cfg, states, start.cache, start, good_start(*READY), accept_estimated_max_model_len=True)
    assert done.step == "done"
    assert done.message.endswith(f"{REPORT_READY} at max-model-len {ESTIMATE}; {note}.")


@pytest.mark.parametrize("fit_recorded", [True, False])
def test_accepting_the_estimate_of_a_recorded_start_drops_its_budget(fit_recorded: bool) -> None:
    cfg, states = config(max_model_len=LONG), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    if fit_recorded:
        cache = recorded(cfg, states, {"kv_cache_memory_bytes": 3 * ONE_GIB}, cache, max_model_len=ESTIMATE)
    first = run(cfg, states, cache, accept_estimated_max_model_len=True)
    result = run(cfg, states, cache, first, estimate_failure(), accept_estimated_max_model_len=True)
    assert (result.state["attempt"], result.stop_first, flag(result, "--max-model-len")) == (2, True, str(ESTIMATE))
    if fit_recorded:
        assert (result.step, result.state["kv"]["source"]) == ("refit", "cache")
        assert flag(result, "--kv-cache-memory-bytes") == str(3 * ONE_GIB)
        assert result.state["overrides"] == {"max_model_len": ESTIMATE, "kv_cache_memory_bytes": 3 * ONE_GIB}
    else:
        assert (result.step, result.state["kv"]["source"]) == ("calibrate", "calibrate")
        assert "--kv-cache-memory-bytes" not in command(result)
        assert result.state["overrides"] == {"max_model_len": ESTIMATE}


@pytest.mark.parametrize("inventory", [True, False])
def test_accepting_the_estimate_keeps_a_budget_from_the_inventory_or_none(inventory: bool) -> None:
    cfg = config(max_model_len=LONG, kv_cache_memory_bytes=INVENTORY_KV if inventory else None)
    states = nodes()
    options = {"accept_estimated_max_model_len": True, "enabled": inventory}
    first = run(cfg, states, **options)
    result = run(cfg, states, None, first, estimate_failure(), **options)
    assert (result.step, result.state["attempt"], result.cache) == ("refit", 2, None)
    assert result.state["kv"]["source"] == ("inventory" if inventory else "off")
    assert flag(result, "--max-model-len") == str(ESTIMATE)
    assert flag(result, "--kv-cache-memory-bytes") == (str(INVENTORY_KV) if inventory else None)
    done = run(cfg, states, None, result, good_start(*READY), **options)
    assert done.step == "done" and done.message.endswith(
        f"at max-model-len {ESTIMATE}; max-model-len {LONG} did not fit: the engine estimated {ESTIMATE}; relaunched "
        f"with {ESTIMATE} (rounded down to the block size 16).")


def test_a_second_estimate_after_a_refit_fails() -> None:
    cfg, states = config(max_model_len=LONG, kv_cache_memory_bytes=INVENTORY_KV), nodes()
    first = run(cfg, states, accept_estimated_max_model_len=True)
    refit = run(cfg, states, None, first, estimate_failure(), accept_estimated_max_model_len=True)
    assert refit.step == "refit"
    again = estimate_failure(head_log="fmt_cpu_estimated_max_len.log")
    result = run(cfg, states, None, refit, again, accept_estimated_max_model_len=True)
    assert (result.step, result.stop_first, result.state["attempt"]) == ("fail", True, 2)
    assert result.message.startswith("\n".join([
        "Launch failed during the head starting to serve.", head_engine_line(1920),
        f"The engine cannot fit max-model-len {ESTIMATE} into its KV cache: the estimated maximum model length is "
        "1920.",
        # launch_accept_estimated_max_model_len is already true: the fix does not offer it again
        "Fix: set dgxspark_vllm_max_model_len to at most 1920 (1920 is that rounded down to the block size 16), or "
        "give the KV cache more memory.",
        "Every rank was stopped."]))


def test_an_estimate_below_one_block_is_no_fit() -> None:
    cfg, states = config(max_model_len=LONG, kv_cache_memory_bytes=INVENTORY_KV), nodes()
    options = {"accept_estimated_max_model_len": True, "default_block_size": 2304}
    first = run(cfg, states, **options)
    result = run(cfg, states, None, first, estimate_failure(head_log="fmt_cpu_estimated_max_len.log"), **options)
    assert (result.step, result.stop_first) == ("fail", True)
    assert ("Fix: set dgxspark_vllm_max_model_len to at most 1920, or give the KV cache more memory.\n"
            in result.message)


@pytest.mark.parametrize("fit_recorded", [True, False])
def test_a_recorded_estimate_is_used_on_a_first_plan_when_accepted(fit_recorded: bool) -> None:
    cfg, states = config(max_model_len=LONG), nodes()
    cache = recorded(cfg, states, {"estimated_max_model_len": ESTIMATE})
    if fit_recorded:
        cache = recorded(cfg, states, {"kv_cache_memory_bytes": 3 * ONE_GIB}, cache, max_model_len=1048320)
    result = run(cfg, states, cache, accept_estimated_max_model_len=True, default_block_size=2304)
    assert result.state["notes"] == [f"max-model-len {LONG} does not fit: the engine estimated {ESTIMATE} (recorded "
                                     f"{EARLIER}); 1048320 is used"]
    assert (result.state["attempt"], flag(result, "--max-model-len")) == (1, "1048320")
    assert result.state["refitted"] is False    # a fit taken from the record still allows one refit
    if fit_recorded:
        assert (result.step, flag(result, "--kv-cache-memory-bytes")) == ("start", str(3 * ONE_GIB))
    else:
        assert (result.step, flag(result, "--kv-cache-memory-bytes")) == ("calibrate", None)
    ignored = run(cfg, states, cache)
    assert (ignored.step, ignored.state["notes"], flag(ignored, "--max-model-len")) == ("calibrate", [], str(LONG))


def test_a_recorded_estimate_wins_over_the_budget_recorded_for_the_same_key_when_accepted() -> None:
    """A key whose budget was calibrated and then did not fit holds both: with the opt-in, a relaunch starts with
    the fit at once (else every launch would start the unfit length, fail and refit: never idempotent)."""
    cfg, states = config(max_model_len=LONG), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB, "estimated_max_model_len": ESTIMATE})
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": 3 * ONE_GIB}, cache, max_model_len=ESTIMATE)
    result = run(cfg, states, cache, accept_estimated_max_model_len=True)
    assert (result.step, flag(result, "--max-model-len")) == ("start", str(ESTIMATE))
    assert flag(result, "--kv-cache-memory-bytes") == str(3 * ONE_GIB)
    again = run(cfg, running(result.specs), cache, accept_estimated_max_model_len=True)
    assert again.step == "nothing"
    plain = run(cfg, states, cache)   # without the opt-in the recorded budget is started as it is
    assert (plain.step, flag(plain, "--max-model-len"), flag(plain, "--kv-cache-memory-bytes")) == (
        "start", str(LONG), str(ONE_GIB))


def test_a_launch_that_needs_a_fourth_start_gives_up_and_keeps_what_it_measured() -> None:
    """Calibrate, start with the budget (its max-model-len does not fit), calibrate at the fit: one more start
    would be the fourth."""
    cfg, states = config(max_model_len=LONG), nodes()
    options = {"accept_estimated_max_model_len": True}
    calibrated = run(cfg, states, None, run(cfg, states, **options), good_start(*AUTO), **options)
    assert (calibrated.step, calibrated.state["attempt"]) == ("start", 2)
    refit = run(cfg, states, calibrated.cache, calibrated, estimate_failure(), **options)
    assert (refit.step, refit.state["attempt"]) == ("calibrate", 3)
    gave_up = run(cfg, states, refit.cache, refit, good_start(*AUTO), **options)
    assert (gave_up.step, gave_up.stop_first, gave_up.state["attempt"]) == ("fail", True, MAX_ATTEMPTS + 1)
    assert gave_up.message == (f"Launch gave up after {MAX_ATTEMPTS} starts of the group ({HEAD}, {WORKER}); the last "
                               "one needed yet another (start). Every rank was stopped.")
    fit_key, _parts = lab_key(cfg, states, max_model_len=ESTIMATE)
    assert lookup(gave_up.cache or {}, fit_key)["kv_cache_memory_bytes"] == int(1.21 * GIB)  # type: ignore[index]
    # the next launch starts once, with the fit and its budget
    rerun = run(cfg, states, gave_up.cache, **options)
    assert (rerun.step, flag(rerun, "--max-model-len"), flag(rerun, "--kv-cache-memory-bytes")) == (
        "start", str(ESTIMATE), str(int(1.21 * GIB)))


# ------------------------------------------------------------------------------------------- plan errors

def test_a_missing_node_state_is_a_plan_error() -> None:
    cfg, states = config(), nodes()
    render = renderer(cfg, states)
    # a --limit that left a node of the cluster out of the play: refused before anything is planned
    message = (f"the launch needs every node of the cluster in this play (missing: {WORKER}): a --limit that "
               "selects a cluster selects all of it")
    for call in (lambda: plan(cfg, {HEAD: states[HEAD]}, render, empty_cache(), Calibration()),
                 lambda: described_nodes(cfg, {HEAD: states[HEAD]})):
        with pytest.raises(PlanError) as info:
            call()
        assert str(info.value) == message
    with pytest.raises(PlanError, match=f"missing: {HEAD}, {WORKER}"):
        described_nodes(cfg, {})
    unnamed = dict(states, **{WORKER: {k: v for k, v in states[WORKER].items() if k not in ("node", "identity")}})
    with pytest.raises(PlanError, match="no node state for dgxlab-worker"):
        plan(cfg, unnamed, render, empty_cache(), Calibration())
    with pytest.raises(PlanError, match="no node state for dgxlab-worker"):
        described_nodes(cfg, unnamed)


@pytest.mark.parametrize("last", ["fail", "done"])
def test_nothing_follows_a_final_step(last: str) -> None:
    cfg, states = config(), nodes()
    first = run(cfg, states)
    first.state["step"] = last
    with pytest.raises(PlanError) as info:
        run(cfg, states, None, first, good_start(*READY))
    assert str(info.value) == f"nothing follows the step '{last}': plan again from the nodes' states (previous: none)"


def test_the_result_carries_the_step_and_what_the_next_call_needs() -> None:
    cfg, states = config(), nodes()
    result = run(cfg, states).as_result()
    assert set(result) == {"step", "specs", "state", "message", "stop_first", "any_exists", "attempt", "kv",
                           "max_model_len", "notes", "serving", "image", "steps", "attempts"}
    assert (result["step"], result["attempt"], result["max_model_len"], result["notes"]) == ("calibrate", 1, "4096",
                                                                                             [])
    assert result["attempts"] == [1, 2]   # a calibration, then the start with its budget
    assert result["kv"] == result["state"]["kv"]
    assert set(result["specs"]) == {HEAD, WORKER}
    assert result["specs"][WORKER]["container"]["command"][-1] == "--headless"
    json.dumps(result)   # a task's result: JSON only


@pytest.mark.parametrize("locked", [[WORKER], [HEAD, WORKER]])
def test_a_start_while_staging_runs_is_refused_before_anything_is_stopped(locked: list[str]) -> None:
    cfg = config()
    cache = recorded(cfg, nodes(), {"kv_cache_memory_bytes": ONE_GIB})
    old = run(cfg, nodes(), cache).specs   # a group serving an older render: the start would stop it first
    states = {name: node_state(name, "out-of-date", staging_lock=name in locked) for name in (HEAD, WORKER)}
    result = run(cfg, states, cache)
    assert (result.step, result.stop_first, result.any_exists) == ("fail", False, True)
    assert result.message == (f"Staging runs on {', '.join(locked)} (/run/dgxspark/staging.lock exists): a heavy "
                              "download during a model load starves GB10's unified memory. Let staging finish (or "
                              "remove a stale lock left by a killed run) and launch again.")
    assert result.specs.keys() == old.keys()   # the render is still there for status to compare


@pytest.mark.parametrize("bare", [[WORKER], [HEAD, WORKER]])
def test_a_start_without_the_firewall_table_is_refused_before_anything_is_stopped(bare: list[str]) -> None:
    cfg = config()
    cache = recorded(cfg, nodes(), {"kv_cache_memory_bytes": ONE_GIB})
    states = {name: node_state(name, "out-of-date", firewall=name not in bare) for name in (HEAD, WORKER)}
    result = run(cfg, states, cache)
    assert (result.step, result.stop_first, result.any_exists) == ("fail", False, True)
    whys = "; ".join(f"{name}: the table inet dgxspark is not loaded" for name in bare)
    assert result.message == (f"The firewall is on (dgxspark_vllm_firewall) but its table is not in place ({whys}): "
                              "the engine's ports would answer the whole LAN. Apply it with playbooks/firewall.yml (or "
                              "site.yml --tags firewall) and launch again, or set dgxspark_vllm_firewall: false to "
                              "serve without it.")
    # with the firewall off, the same nodes start
    assert run(dict(cfg, firewall=False), states, cache).step == "start"


def test_a_group_found_serving_without_the_table_is_left_serving() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    specs = run(cfg, states, cache).specs
    serving = {name: node_state(name, specs[name]["config_hash"], firewall=False) for name in (HEAD, WORKER)}
    assert run(cfg, serving, cache).step == "nothing"   # nothing starts: nothing to refuse (the firewall role applies it)


def test_a_group_found_serving_while_staging_runs_is_left_serving() -> None:
    cfg, states = config(), nodes()
    cache = recorded(cfg, states, {"kv_cache_memory_bytes": ONE_GIB})
    specs = run(cfg, states, cache).specs
    serving = {name: node_state(name, specs[name]["config_hash"], staging_lock=True) for name in (HEAD, WORKER)}
    assert run(cfg, serving, cache).step == "nothing"   # nothing starts: nothing to refuse


def test_a_node_without_the_serve_image_cannot_start_and_says_to_stage_it() -> None:
    cfg = config()
    bare = node_state(WORKER, running=False, exists=False)
    bare["identity"]["image_id"] = ""
    states = nodes(worker=bare)
    result = run(cfg, states, {"format": 1, "entries": {}})
    assert (result.step, result.stop_first, result.cache) == ("fail", False, None)
    assert result.message == (f"The launch cannot start: node '{WORKER}': image_id is empty: the serve image is not "
                              "on that node (stage it first: --tags image).")
    assert set(result.specs) == {HEAD, WORKER}   # the render is still there for status to compare
