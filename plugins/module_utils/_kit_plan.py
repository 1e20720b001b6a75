# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EXL3 kit launch's decisions (role dgxspark.vllm.kit_launch), from what the nodes showed.

Private module: may change at any time. Pure functions, no I/O and no Ansible imports (the action plugin
``dgxspark.vllm.kit_launch_plan`` calls them on the controller; the role carries out what they return).

The role asks twice:

before the kit is placed (`prepare`), from each node's ``getent`` facts, its description (the launch role's
``launch_node.node``) and its RDMA read: the kit user's home and what is wrong with its account on each node,
the HCA the kit takes on each node, the staged repositories to read and the extra keys of the ``.env``;

after the kit's state is read (`decide`), from each node's ``vllm_node_state`` result, the head's record of the
last start, its git and ``kit_env`` results: whether the group must be (re)started and why, the digest the record
keeps, the check-mode preview, and the argv, environment and timing of ``./start.sh``.
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

# The kit_launch_plan task's arguments (the action plugin validates with it; the module's documentation stub
# declares it).
ARGUMENT_SPEC: dict[str, Any] = dict(
    config=dict(type="dict", required=True),
    head=dict(type="str", required=True),
    worker=dict(type="str", required=True),
    kit_env=dict(type="dict", default={}),
    passwd=dict(type="dict", no_log=False),   # getent passwd entries (the password field is "x"), not secrets
    group=dict(type="dict"),
    described=dict(type="dict"),
    rdma=dict(type="dict", default={}),
    states=dict(type="dict"),
    record=dict(type="dict", default={}),
    git=dict(type="dict", default={}),
    rendered=dict(type="dict", default={}),
    kit_commit=dict(type="str"),
    kit_dir=dict(type="str"),
    log=dict(type="str"),
    collection_staged=dict(type="bool", default=True),
    budgets=dict(type="dict"),
    poll_interval=dict(type="int"),
    finish_timeout=dict(type="int"),
    api_timeout=dict(type="int"),
    secrets_file=dict(type="str", default="", no_log=False),   # a path, not the secret
)
PREPARE_INPUTS: tuple[str, ...] = ("passwd", "group", "described")
DECIDE_INPUTS: tuple[str, ...] = ("states", "kit_commit", "kit_dir", "log", "budgets", "poll_interval",
                                  "finish_timeout", "api_timeout")


class KitPlanError(ValueError):
    """Inputs the kit's launch cannot be planned from."""


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


def prepare(config: Mapping[str, Any], head: str, kit_extra: Mapping[str, Any], passwd: Mapping[str, Any],
            group: Mapping[str, Any], described: Mapping[str, Any],
            rdma: Mapping[str, Any]) -> dict[str, Any]:
    """What the role needs before the kit is placed (see the module docstring)."""
    inventory = config.get("nodes") or {}
    return {
        "accounts": accounts(config, head, passwd, group),
        "nodes": {host: kit_node(node, inventory.get(host), rdma.get(host)) for host, node in described.items()},
        "repos": repos(config),
        "env": kit_env(config, kit_extra),
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


def seconds(value: Any, name: str) -> int:
    """A number of seconds from the inventory (an int, or a string of one)."""
    if isinstance(value, bool):
        raise KitPlanError(f"{name} must be a number of seconds, not {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise KitPlanError(f"{name} must be a number of seconds, not {value!r}") from None


def budget_total(budgets: Mapping[str, Any]) -> int:
    """The seconds all startup phases may take together (start.sh's READY_TIMEOUT)."""
    return sum(seconds(value, f"kit_launch_budgets.{phase}") for phase, value in budgets.items())


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


def timing(budgets: Mapping[str, Any], poll_interval: int, finish_timeout: int, api_timeout: int) -> dict[str, int]:
    """The background job's bound, and the polls of start.sh's end and of the API."""
    if poll_interval < 1:
        raise KitPlanError(f"kit_launch_poll_interval must be at least 1 second, not {poll_interval}")
    return {"async_seconds": budget_total(budgets) + finish_timeout,
            "finish_retries": math.ceil(finish_timeout / poll_interval),
            "api_retries": api_timeout // poll_interval}


def decide(config: Mapping[str, Any], head: str, worker: str, states: Mapping[str, Any], record: Mapping[str, Any],
           git: Mapping[str, Any], rendered: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the role needs once the kit's state is read (see the module docstring). settings: kit_commit, kit_dir,
    log, collection_staged, budgets, poll_interval, finish_timeout, api_timeout (the role's variables) and
    secrets_file (optional)."""
    user = str(config["kit_user"])
    kit_commit = git["after"] if "after" in git else settings["kit_commit"]
    now_running = running(states)
    wanted_now = wanted(rendered.get("checksum", ""), kit_commit, images(states), user)
    last = last_start(record)
    start = restart(last, wanted_now, now_running)
    reason = why(last, wanted_now, now_running)
    times = timing(settings["budgets"], settings["poll_interval"], settings["finish_timeout"],
                   settings["api_timeout"])
    return {
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
                  "env": start_env(str(config["container_name"]), settings["budgets"], settings["collection_staged"]),
                  "async_seconds": times["async_seconds"], "finish_retries": times["finish_retries"]},
        "api_retries": times["api_retries"],
        # nothing starts while staging runs on a node (its lock as the state read found it)
        "refusal": (refusal(locked_nodes([head, worker], states), str(config["staging_lock_path"]))
                    or launch_refusal(bool(config.get("firewall")), [head, worker], states)) if start else None,
    }


def plan(params: Mapping[str, Any]) -> dict[str, Any]:
    """The task's result from its validated arguments: `prepare` when O(passwd) is given, `decide` when O(states)
    is, both when both are."""
    given = [name for name in ("passwd", "states") if params.get(name) is not None]
    if not given:
        raise KitPlanError("give passwd, group and described (before the kit is placed) or states and the kit's "
                           "settings (after its state is read)")
    result: dict[str, Any] = {}
    for name, needed in (("passwd", PREPARE_INPUTS), ("states", DECIDE_INPUTS)):
        if name not in given:
            continue
        missing = [key for key in needed if params.get(key) is None]
        if missing:
            raise KitPlanError(f"{', '.join(missing)} must be given with {name}")
    config, head = params["config"], params["head"]
    if "passwd" in given:
        result.update(prepare(config, head, params.get("kit_env") or {}, params["passwd"], params["group"],
                              params["described"], params.get("rdma") or {}))
    if "states" in given:
        result.update(decide(config, head, params["worker"], params["states"], params.get("record") or {},
                             params.get("git") or {}, params.get("rendered") or {}, params))
    return result
