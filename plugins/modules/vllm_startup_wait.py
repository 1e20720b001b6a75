#!/usr/bin/python
# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_startup_wait
short_description: Wait for one vLLM rank to reach a startup phase, with a budget per phase
version_added: 0.1.0
description:
  - Polls the serve container on this node (C(docker inspect), C(docker logs)) until its engine reaches
    O(target_phase), and reports where it stands otherwise.
  - Phases, in order, are C(container_started), C(rendezvous), C(weights_loaded), C(kv_allocated),
    C(api_up), proved by vLLM's own log lines. Each phase has a budget counted from the previous phase.
  - With O(peers), once this rank reached O(peers_after), every peer must keep an established TCP
    connection to this node; a peer that never connects or drops out for O(peer_grace_seconds) ends the wait.
    This is how a head that waits on a dead worker (a hung handshake that still shows as C(Up)) is caught.
  - The module does not fail when the rank fails or a budget expires; it returns RV(ok=false) with the
    reason and the last log lines, so that the caller can stop the whole group before failing.
options:
  container:
    description: Name of the serve container on this node.
    type: str
    required: true
  target_phase:
    description: The phase to wait for.
    type: str
    choices: [container_started, rendezvous, weights_loaded, kv_allocated, api_up]
    required: true
  budgets:
    description:
      - Seconds allowed to reach each phase, counted from when the previous phase was reached (the first from
        the start of the wait). Keys are phase names; missing keys take the defaults
        (container_started 120, rendezvous 300, weights_loaded 1800, kv_allocated 1800, api_up 900).
    type: dict
    default: {}
  peers:
    description: IPv4 addresses (the other ranks' CX7 IPs) that must stay connected to this node.
    type: list
    elements: str
    default: []
  peers_after:
    description: The phase after which O(peers) must be connected.
    type: str
    choices: [container_started, rendezvous, weights_loaded, kv_allocated, api_up]
    default: rendezvous
  peer_grace_seconds:
    description: How long a peer may go without a connection before the wait ends.
    type: float
    default: 30
  poll_interval:
    description:
      - Seconds between polls. While the container runs, its new log lines are followed (C(docker logs --follow)),
        and a line that proves a phase, marks an engine's start or reports an error polls again at once.
    type: float
    default: 2
  log_lines:
    description: How many of the container's last log lines to return.
    type: int
    default: 30
  api_url:
    description:
      - Once O(target_phase) is reached, also wait until the API at this base URL (the head's CX7 IP and port;
        C(/v1/models) is asked, as M(dgxspark.vllm.vllm_api_check) asks it) answers HTTP 200 from this node, while this
        rank's container keeps running. For a worker after the head
        serves, one call proves both that the worker is still up and that the API answers from another node.
      - The wait ends with RV(ok=false) when the container stops or the URL does not answer within
        O(api_timeout).
    type: str
  api_key:
    description: "The key vLLM was started with (C(--api-key)), sent as a bearer token with the O(api_url) requests."
    type: str
  api_timeout:
    description: Seconds O(api_url) may take to answer HTTP 200 after the target phase was reached.
    type: float
    default: 120
  stall_seconds:
    description:
      - End the wait with RV(ok=false) when this rank's log has not moved (no new phase, no checkpoint shard, no new
        line other than a wait notice) for this many seconds, counted from when every peer in O(peers) is connected
        (at once without O(peers)). The reason names the phase, the shards loaded and the last line, and says when
        the container is paused.
      - Phase budgets stay the outer bound. vLLM prints checkpoint shard progress on rank 0 only, so a worker's
        weight load is one silent step; the timeout must be longer than the longest silent step of a start.
      - Unset, there is no stall detection.
    type: float
  progress_path:
    description:
      - Write where the rank stands (RV(progress)'s shape plus C(status), C(target), C(elapsed) and C(summary), one line
        for a person) to this JSON file (mode 0600) at every poll, for a caller that runs this module as an async job
        and shows its progress.
    type: path
extends_documentation_fragment:
  - dgxspark.vllm.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing was started, so nothing is awaited; the module returns status C(check_mode).
  diff_mode:
    support: none
    details: Read-only.
  idempotent:
    support: full
    details: Read-only; never reports a change.
author:
  - dgxspark.vllm contributors (@dgxspark)
"""

EXAMPLES = r"""
- name: Wait until the worker reached the rendezvous (started first, with --headless)
  dgxspark.vllm.vllm_startup_wait:
    container: vllm_glm53
    target_phase: rendezvous
    budgets: {container_started: 60, rendezvous: 300}
  register: worker_wait

- name: Wait until the head serves, watching that every worker stays connected
  dgxspark.vllm.vllm_startup_wait:
    container: vllm_glm53
    target_phase: api_up
    peers: ["198.51.100.2"]
  register: head_wait
"""

RETURN = r"""
ok:
  description: Whether the target phase was reached.
  returned: always
  type: bool
  sample: true
status:
  description: C(done), C(failed) or C(check_mode).
  returned: always
  type: str
  sample: done
phase:
  description: The highest phase reached.
  returned: always
  type: str
  sample: rendezvous
reason:
  description: Why the wait ended without reaching the target, else null.
  returned: always
  type: str
  sample: "phase 'weights_loaded' not reached within its budget of 1800 s (last phase reached: rendezvous)"
engine_error:
  description: The engine's fatal error, as a short reason, when its log shows one.
  returned: always
  type: str
  sample: worker started without --headless (follower assertion)
phase_reached_after:
  description: Seconds from the start of the wait to each phase reached.
  returned: always
  type: dict
  sample: {container_started: 0.4, rendezvous: 6.1}
elapsed:
  description: Seconds the wait took.
  returned: always
  type: float
  sample: 12.3
container:
  description: The container's state at the end of the wait.
  returned: always
  type: dict
  sample: {exists: true, running: true, exit_code: 0}
log_report:
  description:
    - What the log of the latest start says, read from the same log text as the phases; the shape
      M(dgxspark.vllm.vllm_kv_estimate_info) returns (KV cache tokens and pool, maximum concurrency, KV
      suggestions, an estimated maximum model length, the engine error). Null when the container does not exist.
    - Saves the caller a second read of the log once the rank serves.
  returned: always
  type: dict
  sample: {kv_cache_tokens: 5116928, kv_cache_pool: KV cache, max_concurrency: 1249.25, phase: api_up}
progress:
  description:
    - Where the rank stood at the end of the wait. C(phase), C(shards_done)/C(shards_total) (the checkpoint
      progress bar, rank 0 only; null elsewhere), C(shards_per_minute), C(seconds_without_progress) (null until
      the group is together), C(stall_seconds), C(paused) (the container is frozen) and C(last_line).
  returned: always
  type: dict
  sample: {phase: rendezvous, shards_done: 40, shards_total: 80, shards_per_minute: 12.5, seconds_without_progress: 1.5,
           stall_seconds: 600, paused: false, last_line: "Loading safetensors checkpoint shards:  50% Completed | 40/80"}
api:
  description:
    - The O(api_url) check, when asked for; null otherwise. C(status) is the last HTTP status (null when no
      answer came), C(error) the last failure, C(elapsed) the seconds the check took.
  returned: always
  type: dict
  sample: {url: "http://198.51.100.1:8000/v1/models", status: 200, error: null, elapsed: 0.1}
last_lines:
  description: The container's last log lines (stdout and stderr, merged by time).
  returned: always
  type: list
  elements: str
  sample: ["INFO ... world_size=2 rank=1 ..."]
"""

import functools
import json
import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dgxspark.vllm.plugins.module_utils._docker_logs import (
    DockerLogsError, LogFollower, docker_follow_argv, read_container_logs,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._api_probe import REFUSED, probe
from ansible_collections.dgxspark.vllm.plugins.module_utils._http import get
from ansible_collections.dgxspark.vllm.plugins.module_utils._startup import (
    StartupError, describe_progress, established_peers, make_watch, observe, step,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._vllm_log import PHASES, notable_line, parse_log


def _state(module: AnsibleModule, name: str) -> dict | None:
    """The container's State (None when it does not exist)."""
    rc, out, err = module.run_command(["docker", "inspect", "--format", "{{json .State}}", name])
    if rc != 0:
        if "No such" in err or "no such" in err:
            return None
        module.fail_json(msg=f"docker inspect {name} failed on this node: {err.strip()}; is dockerd running?")
    return json.loads(out)


def _inspect(module: AnsibleModule, name: str) -> tuple[bool, bool, int | None]:
    state = _state(module, name)
    if state is None:
        return False, False, None
    return True, bool(state.get("Running")), state.get("ExitCode")


def _write_progress(path: str, document: dict) -> None:
    """Replace the progress file atomically (0600: it is read by the caller's poll, as root)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".progress-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _check_api(module: AnsibleModule, api_url: str, api_key: str | None, timeout: float, poll: float,
               container: str) -> tuple[dict, str | None]:
    """Ask the API (module_utils/_api_probe.probe: GET <api_url>/v1/models) until it answers while the container
    runs; (api result, reason it failed or None)."""
    ask = functools.partial(get, timeout=min(10.0, max(timeout, 1.0)), validate_certs=False)   # the CX7 link, no proxy
    url = api_url.strip().rstrip("/") + "/v1/models"
    t0 = time.monotonic()
    status, error = None, None
    while True:
        exists, running, exit_code = _inspect(module, container)
        if not running:
            error = "this rank's container %s while waiting for the API (exit code %s)" % (
                "stopped" if exists else "disappeared", exit_code)
            break
        answer = probe(ask, api_url, api_key, False)
        url = answer["url"]
        status = None if answer["status"] == -1 else answer["status"]
        if answer["ok"]:
            return {"url": url, "status": status, "error": None, "elapsed": round(time.monotonic() - t0, 1)}, None
        error = answer["msg"]
        if answer["status"] in REFUSED:   # a wrong key does not get better by waiting
            error = "%s refused the API key (HTTP %s): check dgxspark_vllm_api_key" % (url, answer["status"])
            break
        if time.monotonic() - t0 >= timeout:
            error = "%s did not answer HTTP 200 from this node within %g s (last try: %s)" % (url, timeout, error)
            break
        time.sleep(poll)
    return {"url": url, "status": status, "error": error, "elapsed": round(time.monotonic() - t0, 1)}, error


def _follow(name: str, since: float) -> LogFollower:
    """Follow the running container's lines from `since` on: a phase line, a start or an error ends the sleep
    between polls."""
    return LogFollower(docker_follow_argv(name, since), notable_line)


def _proc_net_tcp() -> str:
    with open("/proc/net/tcp", encoding="ascii") as fh:
        return fh.read()


def main() -> None:
    phases = list(PHASES)
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "target_phase": {"type": "str", "required": True, "choices": phases},
            "budgets": {"type": "dict", "default": {}},
            "peers": {"type": "list", "elements": "str", "default": []},
            "peers_after": {"type": "str", "default": "rendezvous", "choices": phases},
            "peer_grace_seconds": {"type": "float", "default": 30.0},
            "poll_interval": {"type": "float", "default": 2.0},
            "log_lines": {"type": "int", "default": 30},
            "api_url": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "api_timeout": {"type": "float", "default": 120.0},
            "stall_seconds": {"type": "float"},
            "progress_path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    empty = {"ok": True, "status": "check_mode", "phase": None, "reason": None, "engine_error": None,
             "phase_reached_after": {}, "elapsed": 0.0, "container": {}, "log_report": None, "api": None,
             "last_lines": [], "progress": {}}
    if module.check_mode:
        module.exit_json(changed=False, **empty)
    if p["poll_interval"] <= 0:
        module.fail_json(msg="poll_interval must be positive")
    if p["api_timeout"] <= 0:
        module.fail_json(msg="api_timeout must be positive, got %g" % p["api_timeout"])
    t0 = time.monotonic()
    try:
        watch = make_watch(p["target_phase"], p["budgets"], t0, p["peers"], p["peer_grace_seconds"], p["peers_after"],
                           p["stall_seconds"])
    except StartupError as exc:
        module.fail_json(msg=str(exc))

    def publish(verdict, status: str) -> None:
        if p["progress_path"]:
            _write_progress(p["progress_path"], dict(verdict.progress, status=status, target=p["target_phase"],
                                                     elapsed=round(time.monotonic() - t0, 1),
                                                     summary=describe_progress(verdict.progress)))

    text = ""
    follower = None   # the log as it is written: a line that may move the wait on polls again at once
    try:
        while True:
            state = _state(module, p["container"])
            exists, running = state is not None, bool(state and state.get("Running"))
            exit_code, paused = (state or {}).get("ExitCode"), bool(state and state.get("Paused"))
            report = None
            read_at = time.time()
            if exists:
                try:
                    text = read_container_logs(module.run_command, p["container"])
                except DockerLogsError as exc:
                    module.fail_json(msg=str(exc))
                report = parse_log(text)
            peers = established_peers(_proc_net_tcp(), watch.peers) if watch.peers else frozenset()
            verdict = step(watch, observe(time.monotonic(), exists, running, exit_code, report, peers, paused))
            # with an API check still to come, "done" is written only once that check is over
            publish(verdict, "waiting" if verdict.status == "done" and p["api_url"] else verdict.status)
            if verdict.status != "waiting":
                break
            if running and (follower is None or not follower.alive):
                if follower is not None:
                    follower.close()
                follower = _follow(p["container"], read_at)   # the lines written since this poll's read
            if follower is None:
                time.sleep(p["poll_interval"])
            else:
                follower.wait(p["poll_interval"])
    finally:
        if follower is not None:
            follower.close()

    ok, status, reason, api = verdict.status == "done", verdict.status, verdict.reason, None
    if ok and p["api_url"]:
        api, api_failure = _check_api(module, p["api_url"], p["api_key"], p["api_timeout"], p["poll_interval"],
                                      p["container"])
        if api_failure is not None:
            ok, status, reason = False, "failed", api_failure
            exists, running, exit_code = _inspect(module, p["container"])
            if exists:
                text = read_container_logs(module.run_command, p["container"])
                report = parse_log(text)
        publish(verdict, status)
    lines = [line for line in text.splitlines() if line.strip()]
    module.exit_json(
        changed=False,
        ok=ok,
        status=status,
        phase=verdict.phase,
        reason=reason,
        engine_error=report.engine_error if report else None,
        phase_reached_after={k: round(v - t0, 1) for k, v in verdict.phase_reached_at.items()},
        elapsed=round(time.monotonic() - t0, 1),
        container={"exists": exists, "running": running, "exit_code": exit_code},
        log_report=report.as_dict() if report else None,
        api=api,
        progress=verdict.progress,
        last_lines=lines[-p["log_lines"]:] if p["log_lines"] > 0 else [],
    )


if __name__ == "__main__":
    main()
