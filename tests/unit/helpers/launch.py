"""The two-node CPU lab as the launch planner sees it: the resolved configuration, each node's recorded
`vllm_node_state` result, the render the `launch_plan` action does, and each rank's `vllm_startup_wait` results
judged by the real watch (_startup) from the captured logs in tests/fixtures/vllm_logs.

Names, addresses and the model are the lab's (see the logs' README); the node states are read through
`_node_state.read_state` from the answers `docker` would give, then described as the module does.
"""
from __future__ import annotations

import json
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import described_nodes
from ansible_collections.dgxspark.vllm.plugins.module_utils._node_state import (
    CONFIG_HASH_LABEL,
    chosen_iface,
    describe,
    identity,
    read_state,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._profiles import as_data, plain
from ansible_collections.dgxspark.vllm.plugins.module_utils._serve_spec import (
    profile_defaults,
    profile_from_data,
    render_cluster,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import make_watch, observe, step
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import PHASES, parse_log
from helpers.fixtures import read_log
from helpers.profiles import PROFILES

HEAD, WORKER = "dgxlab-head", "dgxlab-worker"
ORDER = (HEAD, WORKER)
IPS = {HEAD: "10.77.1.11", WORKER: "10.77.1.12"}
IMAGE_ID = "sha256:5eb1c0ffee0123456789abcdef0123456789abcdef0123456789abcdef012345"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MEMINFO = "MemTotal:       24414060 kB\nMemFree:         1048576 kB\n"
LOG_LINES = 30
SKIPPED: dict[str, Any] = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False",
                           "false_condition": "__launch_go"}
FLUSH_UNIT = "dgxspark-cache-flush.service"
FLUSH_STARTED: dict[str, Any] = {"changed": True, "name": FLUSH_UNIT, "state": "started", "status": {}}


def config(**settings: Any) -> dict[str, Any]:
    """dgxspark_vllm_config for the lab (profile lab_cpu), settings changed as given (None: unset)."""
    resolved = {key: value for key, value in plain(profile_defaults(PROFILES["lab_cpu"])).items() if value is not None}
    resolved["cx7_subnet"] = "10.77.1.0/24"
    resolved.update(settings)
    resolved = {key: value for key, value in resolved.items() if value is not None}
    return {"profile": as_data(PROFILES["lab_cpu"]), "profile_name": "lab_cpu", "head": HEAD, "workers": [WORKER],
            "settings": resolved, "model_path": resolved["model_path"], "model_revision": "main",
            "kv_cache_memory_bytes": resolved.get("kv_cache_memory_bytes"), "head_cx7_ip": IPS[HEAD],
            "staging_lock_path": "/run/dgxspark/staging.lock", "firewall": True}


def node_state(name: str, config_hash: str | None = None, running: bool = True, exists: bool | None = None,
               image_id: str | None = IMAGE_ID, stamp: dict[str, Any] | None = None,
               staging_lock: bool = False, firewall: bool = True) -> dict[str, Any]:
    """One node's vllm_node_state result, read with its name (container absent unless config_hash/exists; the
    firewall's table loaded unless firewall is false)."""
    exists = config_hash is not None if exists is None else exists
    exit_code = 0 if running else 137
    inspect = json.dumps([{"Id": "c0ffee" + name,
                           "State": {"Running": running and exists, "ExitCode": exit_code,
                                     "StartedAt": "2026-12-01T00:20:00Z"},
                           "Config": {"Labels": {CONFIG_HASH_LABEL: config_hash}}}])
    answers = {
        "container inspect": (0, inspect, "") if exists else (1, "[]", "Error: No such container: vllm_glm53"),
        "image inspect": (0, image_id + "\n", "") if image_id else (1, "", "Error: No such image: vllm-cpu"),
        "list table inet dgxspark": ((0, "table inet dgxspark {\n  chain input {\n  }\n}\n", "") if firewall
                                     else (1, "", "Error: No such file or directory")),
    }

    def run(argv: Any) -> tuple[int, str, str]:
        line = " ".join(argv)
        return next(answer for key, answer in answers.items() if key in line)

    head = name == HEAD
    stamp_path = "/var/tmp/models/tiny-glm53/.dgxspark-stamp.json"
    if stamp is None:
        stamp = {"repo": "dgxspark-lab/tiny-glm53", "commit": COMMIT}
    state = read_state(run, "docker", "vllm_glm53", "ghcr.io/dgxspark-lab/vllm-openai-cpu:v0.32.0", None,
                       json.dumps(stamp) if head and stamp else None, stamp_path if head else None, staging_lock,
                       MEMINFO, "inet dgxspark", "/usr/sbin/nft")
    # as dgxspark_vllm_config.nodes lists it (nothing set in the inventory) and as the lab's preflight found it
    inventory = {"cx7_ip": IPS[name], "head": head, "rank": ORDER.index(name), "cx7_iface": "", "ib_hca": "",
                 "gid_index": None}
    detected = {"cx7_iface": "eth1", "ib_hca": None, "gid_index": None}
    rdma = {"ok": True, "hca": "rocep1s0f1", "ib_hca": "rocep1s0f1", "gid_index": 3, "problems": []}
    iface = chosen_iface(inventory, detected)
    state.update(changed=False, cx7_iface=iface, rdma=rdma,
                 node=describe(name, IPS[name], head, iface, inventory, detected, rdma), identity=identity(name, state))
    return state


def nodes(**states: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every node's state (fresh, nothing running), the given ones replaced (keys: head, worker)."""
    return {HEAD: states.get("head") or node_state(HEAD), WORKER: states.get("worker") or node_state(WORKER)}


def running(specs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every node running the containers of specs (a plan's specs)."""
    return {name: node_state(name, specs[name]["config_hash"]) for name in ORDER}


def renderer(cfg: dict[str, Any], states: dict[str, dict[str, Any]], api_key: str | None = None) -> Any:
    """The render the launch_plan action hands the planner."""
    profile = profile_from_data(cfg["profile"])
    described = described_nodes(cfg, states)

    def render(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {name: spec.as_result() for name, spec in render_cluster(profile, described, settings, api_key).items()}
    return render


def log_until(name: str, phase: str) -> str:
    """The captured log as it stood when it first showed phase (what a wait read when it reached it)."""
    lines = read_log(name).splitlines(keepends=True)
    for end in range(1, len(lines) + 1):
        text = "".join(lines[:end])
        if PHASES.index(parse_log(text).phase) >= PHASES.index(phase):
            return text
    raise AssertionError(f"{name} never reaches {phase}")


def wait(name: str, target: str, text: str | None = None, peers: tuple[str, ...] = (),
         peers_after: str = "rendezvous", running: bool = True, exit_code: int | None = None,
         api_error: str | None = None) -> dict[str, Any]:
    """A registered vllm_startup_wait result for a log (the whole captured log unless text), judged by the real
    watch: one poll with every peer connected; while that leaves the rank waiting, later polls with none (a peer's
    drop after 99 s when there are peers, else a phase budget run out)."""
    text = read_log(name) if text is None else text
    report = parse_log(text)
    watch = make_watch(target, None, 0.0, list(peers), 30.0, peers_after)
    verdict = step(watch, observe(1.0, True, running, exit_code, report, frozenset(peers)))
    for later in (100.0, 5000.0):
        if verdict.status == "waiting":
            verdict = step(watch, observe(later, True, running, exit_code, report))
    ok, reason = verdict.status == "done", verdict.reason
    if ok and api_error:
        ok, reason = False, api_error
    lines = [line for line in text.splitlines() if line.strip()]
    return {"changed": False, "ok": ok, "status": "done" if ok else "failed", "phase": verdict.phase,
            "reason": reason, "engine_error": report.engine_error, "log_report": report.as_dict(),
            "last_lines": lines[-LOG_LINES:]}


def rank(flush: dict[str, Any] | None = None, rendezvous: dict[str, Any] | None = None,
         load: dict[str, Any] | None = None, serve: dict[str, Any] | None = None,
         alive: dict[str, Any] | None = None) -> dict[str, Any]:
    """One rank's __launch_observed (attempt.yml): a wait not given was skipped."""
    return {"flush": FLUSH_STARTED if flush is None else flush, "rendezvous": rendezvous or SKIPPED,
            "load": load or SKIPPED, "serve": serve or SKIPPED, "alive": alive or SKIPPED}


def good_start(head_log: str, worker_log: str) -> dict[str, Any]:
    """What a start that served shows: the worker's rendezvous, every rank's load, the head serving, the worker
    alive; head_log/worker_log are the captured logs of the two ranks."""
    return {
        HEAD: rank(load=wait(head_log, "kv_allocated", log_until(head_log, "kv_allocated"), (IPS[WORKER],)),
                   serve=wait(head_log, "api_up", peers=(IPS[WORKER],))),
        WORKER: rank(rendezvous=wait(worker_log, "rendezvous", log_until(worker_log, "rendezvous")),
                     load=wait(worker_log, "kv_allocated", peers=(IPS[HEAD],), peers_after="weights_loaded"),
                     alive=wait(worker_log, "rendezvous")),
    }


SERVED_METRICS = {"kv_cache_tokens": 4194304, "kv_cache_blocks": 32768, "kv_block_size": 128}
"""The head's /metrics of a serving lab group, as vllm_node_state reads it with api_metrics."""


def answered(states: dict[str, dict[str, Any]], metrics: dict[str, Any] | None,
             worker_status: int = 200) -> dict[str, dict[str, Any]]:
    """The nodes' read with its one try at the head's API (vllm_node_state api_url): the head read /metrics."""
    out = {}
    for name, state in states.items():
        status = 200 if name == HEAD else worker_status
        api = {"url": "http://10.77.1.11:8000/v1/models", "status": status, "ok": status == 200,
               "msg": f"HTTP {status}", "metrics": metrics if name == HEAD else None, "metrics_msg": None}
        out[name] = dict(state, api=api)
    return out
