# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EXL3 kit launch's decisions (role dgxspark.vllm.kit_launch), from what the nodes showed.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports (the action plugin
``dgxspark.vllm.kit_launch_plan`` calls them on the controller; the role carries out what they return).

The role asks at each step:

first (`cluster_problem`), from the configuration and the play's hosts: whether the cluster is one the kit serves
(the exl3_kit launcher, a head and one worker, both in the play);

before the kit is placed (`prepare`), from each node's ``getent`` facts, its description (the launch role's
``launch_node.node``) and its RDMA read: the kit user's home and what is wrong with its account on each node,
the HCA the kit takes on each node, the staged repositories to read and the extra keys of the ``.env``;

after the kit's state is read (`decide`), from each node's ``vllm_node_state`` result, the head's record of the
last start, its git and ``kit_env`` results: whether the group must be (re)started and why, the digest the record
keeps, the check-mode preview, the warm-up prompt, and the argv, environment and timing of ``./start.sh``;

during and after a start (`judge`), from the waits of both ranks so far and the end of ``./start.sh``: the next step
and the rank it runs on - the next wait (``rendezvous`` on the worker, ``serve`` on the head, ``alive`` on the
worker), ``finish`` (``./start.sh``'s end, on the head), then ``record`` the start (with the record's text, `record`)
or ``fail`` - and the stage that failed; with the last lines of both ranks and of ``./start.sh`` (`diagnose`),
the diagnosis a failed start ends with - the launch's own per-rank failures (``_launch_plan.failures``) and its
max-model-len advice (``_launch_plan.fit_advice``);

at the end (`report`), from the decision and the warm-up: the report of the serve and of EXL3's trade-off.

The timing (phase budgets, poll interval, API timeout) is the cluster's, ``config["timing"]`` (``_timing``): the
launch, the kit and the guard read the same values.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils._firewall import launch_refusal
from ansible_collections.dgxspark.vllm.plugins.module_utils._launch_plan import (
    WAIT_NAMES,
    estimated_max_model_len,
    failures,
    fit_advice,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._staging_lock import locked_nodes, refusal

RANKS = 2
"""The kit drives exactly two ranks: the head and one worker over ssh."""
HF_CACHE = "/.cache/huggingface"
"""Where, under the kit user's home, start.sh reads the worker's weights (start.sh:328)."""
SKIP_STAGED: dict[str, str] = {"SKIP_PULL": "1", "SKIP_SHIP": "1", "SKIP_DOWNLOAD": "1", "SKIP_SYNC": "1"}
"""start.sh's switches when the collection staged the image and the weights on both nodes."""
START_COMMAND = ('mkdir -p logs && if [ -n "$1" ]; then set -a && . "$1" && set +a && rm -f -- "$1"; fi'
                 ' && exec ./start.sh start >"$0" 2>&1')
"""How start.sh runs on the head: its output goes to the log named by $0; the secrets (the API key, the HF token)
come from the 0600 file named by $1, sourced with set -a and removed before start.sh starts (none when $1 is
empty), so that they are neither on a command line nor in the task's environment, which Ansible prints at -vvv."""
NOTHING_TO_START = "nothing to start: both ranks run the rendered .env"
ALREADY_RUNNING = "already running, unchanged"
STAGES: dict[str, str] = {
    "rendezvous": "the worker reaching the rendezvous",
    "serve": "the head starting to serve",
    "alive": "the head starting to serve",
}
"""The stage of the kit's start a failed wait names: the worker's rendezvous, the head's serve, the worker alive
once the head serves (the waits, by the launch's names, in WAIT_NAMES order)."""
WAIT_RANK: dict[str, str] = {"rendezvous": "worker", "serve": "head", "alive": "worker"}
"""Which rank each of the kit's waits runs on, in the order they run."""
FINISH = "finish"
"""The step after the waits: ./start.sh's end (its health wait and boot warm-up), on the head."""
WARMUP_PROMPT = ("Summarise the following text. ", "The cluster serves the model across two nodes. ")
"""The warm-up request's prompt: an instruction, then a sentence repeated to the length asked for."""
TRADE_OFF = ("Trade-off: about twice NVFP4's decode and a much longer context, but the first token of a large prompt "
             "takes minutes (EXL3 prefill and per-shape CUDA graph capture; the recipe measured 325-432 s), so use it "
             "where long answers matter more than time to first token.")
NO_WARMUP = "Set kit_launch_warmup_prompt_chars to pay the first large-prompt latency once, at start."

# The kit_launch_plan task's arguments (the action plugin validates with it; the module's documentation stub
# declares it).
ARGUMENT_SPEC: dict[str, Any] = dict(
    config=dict(type="dict", required=True),
    head=dict(type="str"),     # default: the configuration's head
    worker=dict(type="str"),   # default: the configuration's first worker
    play_hosts=dict(type="list", elements="str"),
    kit_env=dict(type="dict", default={}),
    passwd=dict(type="dict", no_log=False),   # getent passwd entries (the password field is "x"), not secrets
    group=dict(type="dict"),
    described=dict(type="dict"),
    rdma=dict(type="dict", default={}),
    hf_staged=dict(type="dict"),
    states=dict(type="dict"),
    record=dict(type="dict", default={}),
    git=dict(type="dict", default={}),
    rendered=dict(type="dict", default={}),
    kit_commit=dict(type="str"),
    kit_dir=dict(type="str"),
    log=dict(type="str"),
    collection_staged=dict(type="bool", default=True),
    finish_timeout=dict(type="int"),
    warmup_prompt_chars=dict(type="int", default=0),
    secrets_file=dict(type="str", default="", no_log=False),   # a path, not the secret
    waits=dict(type="dict"),
    finished=dict(type="dict", default={}),
    started=dict(type="dict"),
    wanted=dict(type="str"),
    tails=dict(type="dict"),
    start_tail=dict(type="dict", default={}),
    decision=dict(type="dict"),
    warmup=dict(type="dict", default={}),
    repo_url=dict(type="str", default=""),
)
PREPARE_INPUTS: tuple[str, ...] = ("passwd", "group", "described")
DECIDE_INPUTS: tuple[str, ...] = ("states", "kit_commit", "kit_dir", "log", "finish_timeout")
JUDGE_INPUTS: tuple[str, ...] = ("waits",)
RECORD_INPUTS: tuple[str, ...] = ("waits", "wanted")
REPORT_INPUTS: tuple[str, ...] = ("decision",)


class KitPlanError(ValueError):
    """Inputs the kit's launch cannot be planned from."""


# --------------------------------------------------------------------------------------------- the cluster


def cluster_problem(config: Mapping[str, Any], play_hosts: Sequence[str]) -> str:
    """What makes the cluster one the kit cannot serve ('' when nothing does): the kit serves profiles with the
    exl3_kit launcher on exactly two nodes, a head and one worker, both in the play."""
    nodes = list(config.get("nodes") or {})
    if (config.get("launcher") == "exl3_kit" and len(config.get("workers") or []) == RANKS - 1
            and not [node for node in nodes if node not in play_hosts]):
        return ""
    return (f"kit_launch serves profiles with the exl3_kit launcher (dgxspark_vllm_profile is "
            f"{config.get('profile_name')}) on exactly two nodes, a head and one worker (the kit drives one worker over "
            f"ssh), both in this play; this cluster has {', '.join(nodes)} and this play {', '.join(play_hosts)}.")


# --------------------------------------------------------------------------------------------- before the kit


def home(passwd: Mapping[str, Any] | None, user: str) -> str:
    """The user's home from a node's ``getent passwd`` facts ('' when the user does not exist)."""
    entry = (passwd or {}).get(user)
    if isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) > 4 and isinstance(entry[4], str):
        return entry[4]
    return ""


def docker_members(group: Mapping[str, Any] | None) -> list[str]:
    """The members of the docker group from a node's ``getent group`` facts."""
    entry = (group or {}).get("docker")
    if isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) > 2 and isinstance(entry[2], str):
        return entry[2].split(",")
    return [""]


def account_problem(user: str, hf_home: str, is_head: bool, user_home: str, members: Sequence[str]) -> str:
    """What is wrong with the kit user on one node ('' when nothing is)."""
    if not user_home:
        return f"the kit user {user} (dgxspark_vllm_kit_user) does not exist"
    if user != "root" and user not in members:
        return (f"the kit user {user} is not in the docker group: start.sh runs docker without sudo on both nodes "
                f"(sudo usermod -aG docker {user}, then log in again)")
    if not is_head and hf_home != user_home + HF_CACHE:
        # "workers" without an apostrophe: the message as the role has always shown it
        return (f"the kit reads the workers weights from {user_home}{HF_CACHE} (start.sh:328), but "
                f"dgxspark_vllm_hf_home is {hf_home}: set dgxspark_vllm_hf_home to {user_home}{HF_CACHE} and "
                "stage again")
    return ""


def accounts(config: Mapping[str, Any], head: str, passwd: Mapping[str, Any],
             group: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per node: the kit user's ``home`` and the ``problem`` with its account ('' when none)."""
    user = str(config["kit_user"])
    out: dict[str, dict[str, str]] = {}
    for host, facts in passwd.items():
        user_home = home(facts, user)
        problem = account_problem(user, str(config.get("hf_home")), host == head, user_home,
                                  docker_members(group.get(host)))
        out[host] = {"home": user_home, "problem": problem}
    return out


def repos(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The staged repositories the kit serves: the checkpoint, then the drafter when there is one."""
    out = [{"repo": config["model_repo"], "revision": config["model_revision"]}]
    if config.get("drafter_repo"):
        out.append({"repo": config["drafter_repo"], "revision": config["drafter_revision"]})
    return out


def kit_env(config: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The .env keys besides the rendered ones: the inventory's kit_launch_env, the cluster's GPU memory share and
    max-model-len when set, and MTP speculation when there is no drafter (unless kit_launch_env chose)."""
    env = dict(extra)
    if config.get("gpu_memory_utilization") is not None:
        env["GPU_MEM_UTIL"] = config["gpu_memory_utilization"]
    if config.get("max_model_len") is not None:
        env["MAX_MODEL_LEN"] = config["max_model_len"]
    if not config.get("drafter_repo") and "SPEC_METHOD" not in extra:
        env["SPEC_METHOD"] = "mtp"
    return env


def kit_hca(inventory_hca: str | None, rdma: Mapping[str, Any] | None, described_hca: str | None) -> str:
    """The one HCA the kit takes on a node: the inventory's first device, else the device whose port carries the
    CX7 IP (a successful rdma_link_info read), else the first detected device ('' when none)."""
    rdma = rdma or {}
    return ((inventory_hca or "").split(",")[0]
            or ((rdma.get("hca") or "") if rdma.get("ok") else "")
            or (described_hca or "").split(",")[0])


def kit_node(described: Mapping[str, Any], inventory: Mapping[str, Any] | None,
             rdma: Mapping[str, Any] | None) -> dict[str, Any]:
    """A node as kit_env takes it: its description with the one HCA the kit takes (when one is known)."""
    node = dict(described)
    hca = kit_hca((inventory or {}).get("ib_hca"), rdma, described.get("ib_hca"))
    if hca:
        node["ib_hca"] = hca
    return node


def staged(config: Mapping[str, Any], head: str, found: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Whether every node holds each repository the kit serves staged and verified, and the same commits: per node a
    ``problem`` ('' when all are staged), the ``commits`` (the head's: {repo: commit}) and ``commits_problem`` ('' when
    the nodes agree). ``found``: per node, what vllm_node_state's ``hf_staged`` read."""
    hub = f"{config.get('hf_home')}/hub"
    problems: dict[str, str] = {}
    commits: dict[str, dict[str, Any]] = {}
    for host in sorted(found):
        missing = [entry["repo"] for entry in found[host] if not entry.get("staged")]
        problems[host] = (
            f"{host}: not staged and verified under {hub}: {', '.join(missing)}. Stage first (ansible-playbook "
            "site.yml --tags staging); the kit reads both nodes' HF caches and, with kit_launch_collection_staged, "
            "downloads nothing itself.") if missing else ""
        commits[host] = {entry["repo"]: entry.get("commit") for entry in found[host]}
    differ = len({json.dumps(value, sort_keys=True) for value in commits.values()}) > 1
    return {
        "staged": {host: {"problem": problem} for host, problem in problems.items()},
        "commits": commits.get(head, {}),
        "commits_problem": (
            f"The nodes hold different commits of the staged repositories: {json.dumps(commits, sort_keys=True)}. "
            "Stage again (ansible-playbook site.yml --tags staging) so both serve the same weights.") if differ else "",
    }


def prepare(config: Mapping[str, Any], head: str, kit_extra: Mapping[str, Any], passwd: Mapping[str, Any],
            group: Mapping[str, Any], described: Mapping[str, Any],
            rdma: Mapping[str, Any], found: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """What the role needs before the kit is placed (see the module docstring)."""
    inventory = config.get("nodes") or {}
    return {
        "accounts": accounts(config, head, passwd, group),
        "nodes": {host: kit_node(node, inventory.get(host), rdma.get(host)) for host, node in described.items()},
        "repos": repos(config),
        "env": kit_env(config, kit_extra),
        **(staged(config, head, found) if found is not None else {}),
    }


# --------------------------------------------------------------------------------------------- after the kit


def running(states: Mapping[str, Any]) -> dict[str, Any]:
    """Per node whose serve container runs, that container's ID (vllm_node_state results)."""
    out: dict[str, Any] = {}
    for host, state in states.items():
        container = (state or {}).get("container") or {}
        cid = container.get("id") if container.get("running") else ""
        if cid != "":
            out[host] = cid
    return out


def images(states: Mapping[str, Any]) -> dict[str, str]:
    """Per node, the ID of the serve image ('' when it is not there)."""
    return {host: (state or {}).get("image_id") or "" for host, state in states.items()}


def wanted(env_checksum: str, kit_commit: Any, node_images: Mapping[str, str], user: str) -> str:
    """The digest of what the group should run (the record keeps it); the same JSON and hash as the role's
    ``to_json | hash('sha256')`` always gave, so a record written by an earlier version still matches."""
    document = {"env": env_checksum, "kit_commit": kit_commit, "images": dict(node_images), "user": user}
    return hashlib.sha256(json.dumps(document).encode("utf-8")).hexdigest()


def last_start(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record of the last start from the head's slurp of it ({} when there is none)."""
    content = record.get("content")
    if content is None:
        return {}
    where = record.get("source") or "the record of the last start"
    try:
        last = json.loads(base64.b64decode(content).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise KitPlanError(f"{where} cannot be read ({exc}): remove it, and the next run starts the group") from exc
    if not isinstance(last, dict):
        raise KitPlanError(f"{where} is not a JSON object: remove it, and the next run starts the group")
    return last


def restart(last: Mapping[str, Any], wanted_now: str, now_running: Mapping[str, Any]) -> bool:
    """Whether the group must be (re)started: what is wanted, or which containers run, differ from the record."""
    return last.get("wanted", "") != wanted_now or last.get("containers", {}) != dict(now_running)


def why(last: Mapping[str, Any], wanted_now: str, now_running: Mapping[str, Any]) -> str:
    """Why the group is (re)started - or 'unchanged'."""
    if not now_running:
        return "nothing runs"
    if len(now_running) < RANKS:
        return "a rank is not running"
    if not last:
        return "no record of the last start"
    if last.get("wanted", "") != wanted_now:
        return "the .env, the kit commit or an image changed"
    if last.get("containers", {}) != dict(now_running):
        return "a container was replaced outside the collection"
    return "unchanged"


def preview(start: bool, reason: str, kit_dir: str, head: str, worker: str, user: str, port: Any) -> str:
    """What a check-mode run says it would do."""
    if not start:
        return NOTHING_TO_START
    return (f"would run ./start.sh in {kit_dir} on {head} as {user} ({reason}): worker {worker} first, then the head, "
            f"on port {port}")


def outcome(start: bool, reason: str) -> str:
    """The report's word on the start."""
    return f"started ({reason})" if start else ALREADY_RUNNING


def seconds(value: Any, name: str) -> float:
    """A number of seconds from the configuration (a number, or a string of one)."""
    if isinstance(value, bool):
        raise KitPlanError(f"{name} must be a number of seconds, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise KitPlanError(f"{name} must be a number of seconds, not {value!r}") from None


def budget_total(budgets: Mapping[str, Any]) -> int:
    """The seconds all startup phases may take together (start.sh's READY_TIMEOUT)."""
    return math.ceil(sum(float(seconds(value, f"dgxspark_vllm_budgets.{phase}")) for phase, value in budgets.items()))


def start_env(container: str, budgets: Mapping[str, Any], collection_staged: bool) -> dict[str, str]:
    """start.sh's environment, secrets aside (start_argv sources them from the role's 0600 secrets file)."""
    env = {"CONTAINER_HEAD": container, "CONTAINER_WORKER": container, "READY_TIMEOUT": str(budget_total(budgets))}
    if collection_staged:
        env.update(SKIP_STAGED)
    return env


def start_argv(unset_in_caller: Sequence[str], log: str, secrets_file: str = "") -> list[str]:
    """start.sh's command line on the head: without the caller's exports that would override .env, output to log,
    the secrets sourced from secrets_file (when given)."""
    return (["env"] + [f"--unset={name}" for name in unset_in_caller]
            + ["bash", "-c", START_COMMAND, log, secrets_file])


def timing(budgets: Mapping[str, Any], poll_interval: Any, finish_timeout: int, api_timeout: Any) -> dict[str, int]:
    """The background job's bound, and the polls of start.sh's end and of the API: Ansible's retries wait whole
    seconds, so they poll every poll_interval rounded up to a whole second (at least one)."""
    poll = seconds(poll_interval, "dgxspark_vllm_poll_interval")
    if poll <= 0:
        raise KitPlanError(f"dgxspark_vllm_poll_interval must be a positive number of seconds, not {poll_interval}")
    delay = max(1, math.ceil(poll))
    return {"async_seconds": budget_total(budgets) + finish_timeout,
            "poll_seconds": delay,
            "finish_retries": math.ceil(finish_timeout / delay),
            "api_retries": math.ceil(seconds(api_timeout, "dgxspark_vllm_api_timeout") / delay)}


def warmup_prompt(chars: int) -> str:
    """The warm-up request's prompt, about chars characters long ('' for none)."""
    if chars <= 0:
        return ""
    head, sentence = WARMUP_PROMPT
    text = head + sentence * (chars // len(sentence) + 1)
    return text[:chars]


def cluster_timing(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The cluster's timing (the configuration step's ``timing``), KitPlanError without it."""
    found = config.get("timing")
    if not isinstance(found, Mapping) or not isinstance(found.get("budgets"), Mapping):
        raise KitPlanError("the configuration has no timing (its budgets): resolve it with dgxspark.vllm.cluster_config "
                           "of this collection's version")
    return found


def decide(config: Mapping[str, Any], head: str, worker: str, states: Mapping[str, Any], record: Mapping[str, Any],
           git: Mapping[str, Any], rendered: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the role needs once the kit's state is read (see the module docstring). settings: kit_commit, kit_dir,
    log, collection_staged, finish_timeout (the role's variables), warmup_prompt_chars and secrets_file (optional);
    the budgets, the poll interval and the API timeout are the cluster's (config["timing"])."""
    shared = cluster_timing(config)
    user = str(config["kit_user"])
    kit_commit = git["after"] if "after" in git else settings["kit_commit"]
    now_running = running(states)
    wanted_now = wanted(rendered.get("checksum", ""), kit_commit, images(states), user)
    last = last_start(record)
    start = restart(last, wanted_now, now_running)
    reason = why(last, wanted_now, now_running)
    times = timing(shared["budgets"], shared.get("poll_interval", 2), settings["finish_timeout"],
                   shared.get("api_timeout", 120))
    return {
        "launcher": config.get("launcher", "exl3_kit"),
        "wanted": wanted_now,
        "restart": start,
        "why": reason,
        "running": now_running,
        "kit_commit": kit_commit,
        "preview": preview(start, reason, settings["kit_dir"], head, worker, user, config["port"]),
        "outcome": outcome(start, reason),
        "start": {"argv": start_argv(rendered.get("unset_in_caller") or [], settings["log"],
                                     settings.get("secrets_file") or ""),
                  "secrets_file": settings.get("secrets_file") or "",
                  "env": start_env(str(config["container_name"]), shared["budgets"], settings["collection_staged"]),
                  "async_seconds": times["async_seconds"], "finish_retries": times["finish_retries"]},
        "poll_seconds": times["poll_seconds"],
        "api_retries": times["api_retries"],
        "warmup_prompt": warmup_prompt(int(settings.get("warmup_prompt_chars") or 0)),
        # the warm-up request follows a start only, and only with a prompt
        "warmup": start and int(settings.get("warmup_prompt_chars") or 0) > 0,
        # nothing starts while staging runs on a node (its lock as the state read found it)
        "refusal": (refusal(locked_nodes([head, worker], states), str(config["staging_lock_path"]))
                    or launch_refusal(bool(config.get("firewall")), [head, worker], states)) if start else None,
    }


# --------------------------------------------------------------------------------------------- after a start


def observed(waits: Mapping[str, Any], head: str, worker: str) -> dict[str, dict[str, Any]]:
    """The kit's waits (rendezvous, serve, alive: each its rank's registered result) as the launch's planner reads
    them: per node, its waits by name."""
    out: dict[str, dict[str, Any]] = {head: {}, worker: {}}
    for name in WAIT_NAMES:
        if name in WAIT_RANK and isinstance(waits.get(name), Mapping):
            out[head if WAIT_RANK[name] == "head" else worker][name] = dict(waits[name])
    return out


def _ran(result: Any) -> bool:
    """Whether a registered result is of a task that ran (not skipped, not absent)."""
    return isinstance(result, Mapping) and bool(result) and not result.get("skipped")


def judge(waits: Mapping[str, Any], finished: Mapping[str, Any], head: str, worker: str,
          config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The next step of a start, from the waits so far and ./start.sh's end: a wait that failed - ``fail``, with the
    stage (the earliest failed wait); else the first wait that has not run (``rendezvous``, ``serve``, ``alive``),
    then ``finish``, each with the ``host`` it runs on (and for ``serve``, the ``peers`` the head watches: the
    worker's CX7 IP, from config); once ./start.sh ended - ``record`` (it exited 0) or ``fail`` (its exit code, or
    that it did not finish)."""
    found = failures(observed(waits, head, worker), [head, worker])
    if found:
        first = min(found, key=lambda failure: WAIT_NAMES.index(failure.stage))
        return {"step": "fail", "host": "", "stage": STAGES[first.stage], "failures": [failure.text for failure in found]}
    for name, rank in WAIT_RANK.items():
        if not _ran(waits.get(name)):
            step = {"step": name, "host": head if rank == "head" else worker, "stage": "", "failures": []}
            if name == "serve":
                step["peers"] = [str(((config or {}).get("nodes") or {}).get(worker, {}).get("cx7_ip") or "")]
            return step
    if not _ran(finished):
        return {"step": FINISH, "host": head, "stage": "", "failures": []}
    if finished.get("finished") and finished.get("rc") == 0:
        return {"step": "record", "host": head, "stage": "", "failures": []}
    code = finished.get("rc") if finished.get("finished") else "none: still running"
    return {"step": "fail", "host": "", "stage": f"./start.sh finishing (exit code {code})", "failures": []}


def start_record(wanted_now: str, started: Mapping[str, Any], now: str) -> str:
    """The record of a start the head keeps (JSON): what was wanted, the containers that run it (per node, from the
    nodes' vllm_node_state read after the start) and when - what `decide` compares the next run with."""
    return json.dumps({"wanted": wanted_now, "containers": running(started), "started": now})


def _tail_text(result: Mapping[str, Any] | None) -> str:
    result = result or {}
    return "\n".join(part for part in (str(result.get("stdout") or ""), str(result.get("stderr") or "")) if part).strip()


def diagnose(config: Mapping[str, Any], head: str, worker: str, waits: Mapping[str, Any], finished: Mapping[str, Any],
             tails: Mapping[str, Any], start_tail: Mapping[str, Any], log: str) -> str:
    """A failed start's message: the stage, each rank's failed wait, the engine's max-model-len estimate when it
    gave one, the end of ./start.sh's output, and the last log lines of both containers."""
    verdict = judge(waits, finished, head, worker, config)
    seen = observed(waits, head, worker)
    lines = int(cluster_timing(config).get("diagnosis_lines", 30))
    container = config.get("container_name", "")
    limit = config.get("max_model_len")
    out = [f"The kit's launch failed during {verdict['stage'] or 'the start'}."]
    out += verdict["failures"]
    out += fit_advice(estimated_max_model_len(seen, [head, worker]), None, None,
                      str(limit) if limit is not None else "(the kit's own)")
    out.append(f"Both ranks were stopped. Last {lines} lines of ./start.sh on {head} ({log}):")
    out.append(_tail_text(start_tail) or "(none)")
    for node in (head, worker):
        out.append(f"----- {node} ({'head' if node == head else 'worker'}) container {container} -----")
        out.append(_tail_text(tails.get(node)) or "(no container)")
    return "\n".join(out)


def report(config: Mapping[str, Any], decision: Mapping[str, Any], rendered: Mapping[str, Any],
           warmup: Mapping[str, Any], repo_url: str) -> str:
    """The closing report: the kit and its commit, the outcome, what serves and how, EXL3's trade-off, and the
    warm-up's time (or how to have one)."""
    values = rendered.get("values") or {}
    drafter = rendered.get("drafter") or "none"
    warm = (f"Warm-up request: {warmup['elapsed']} s." if warmup.get("elapsed") is not None
            and not warmup.get("skipped") else NO_WARMUP)
    return (f"EXL3 through the kit ({repo_url} at {decision.get('kit_commit')}): {decision.get('outcome')}; "
            f"{config.get('served_model_name')} on port {config.get('port')}, max-model-len "
            f"{values.get('MAX_MODEL_LEN', '?')}, drafter {drafter}. {TRADE_OFF} {warm}")


def plan(params: Mapping[str, Any], now: str = "") -> dict[str, Any]:
    """The task's result from its validated arguments (now: the controller's UTC time, for a start's record): the
    cluster check when O(play_hosts) is given, `prepare` when O(passwd) is, `decide` when O(states) is, `judge` when
    O(waits) is (with the record's text when O(started) is too, the diagnosis when O(tails) is), the report when
    O(decision) is."""
    given = [name for name in ("play_hosts", "passwd", "states", "waits", "decision") if params.get(name) is not None]
    if not given:
        raise KitPlanError("give play_hosts (the cluster check), passwd, group and described (before the kit is "
                           "placed), states and the kit's settings (after its state is read), waits (during and after "
                           "a start) or decision (the report)")
    for name, needed in (("passwd", PREPARE_INPUTS), ("states", DECIDE_INPUTS), ("waits", JUDGE_INPUTS),
                         ("decision", REPORT_INPUTS), ("started", RECORD_INPUTS)):
        if params.get(name) is None:
            continue
        missing = [key for key in needed if params.get(key) is None]
        if missing:
            raise KitPlanError(f"{', '.join(missing)} must be given with {name}")
    config = params["config"]
    result: dict[str, Any] = {}
    if "play_hosts" in given:
        result["cluster_problem"] = cluster_problem(config, params["play_hosts"])
        if result["cluster_problem"]:
            return result   # no head and worker to plan for
    head = params.get("head") or str(config["head"])
    worker = params.get("worker") or str((config.get("workers") or [""])[0])
    if "passwd" in given:
        result.update(prepare(config, head, params.get("kit_env") or {}, params["passwd"], params["group"],
                              params["described"], params.get("rdma") or {}, params.get("hf_staged")))
    if "states" in given:
        result.update(decide(config, head, worker, params["states"], params.get("record") or {},
                             params.get("git") or {}, params.get("rendered") or {}, params))
    if "waits" in given:
        finished = params.get("finished") or {}
        result.update(judge(params["waits"], finished, head, worker, config))
        if params.get("started") is not None and result["step"] == "record":
            result["record"] = start_record(str(params["wanted"]), params["started"], now)
        if params.get("tails") is not None:
            result["message"] = diagnose(config, head, worker, params["waits"], finished, params["tails"],
                                         params.get("start_tail") or {}, str(params.get("log") or "./start.sh's log"))
    if "decision" in given:
        result["report"] = report(config, params["decision"], params.get("rendered") or {},
                                  params.get("warmup") or {}, str(params.get("repo_url") or ""))
    return result
