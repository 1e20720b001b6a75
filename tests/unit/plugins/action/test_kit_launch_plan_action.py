# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kit_launch_plan action: the role's two calls (before the kit is placed, after its state is read) on the
controller, with the arguments as kit_launch passes them; what it cannot plan from fails the task with why."""
from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.dgxspark.vllm.plugins.action.kit_launch_plan import ActionModule
from ansible_collections.dgxspark.vllm.plugins.module_utils._kit_plan import START_COMMAND
from ansible_collections.dgxspark.vllm.plugins.modules import kit_launch_plan
from helpers.action_runner import run_action
from helpers.module_runner import ModuleFail, run_module

HEAD, WORKER = "spark-a", "spark-b"
CONFIG: dict[str, Any] = {
    "staging_lock_path": "/run/dgxspark/staging.lock",
    "kit_user": "spark", "hf_home": "/home/spark/.cache/huggingface", "container_name": "vllm_glm53", "port": 8888,
    "model_repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "model_revision": "main", "drafter_repo": "",
    "drafter_revision": "", "gpu_memory_utilization": None, "max_model_len": 850000,
    "nodes": {HEAD: {"cx7_ip": "10.77.1.11", "ib_hca": "mlx5_0,mlx5_1"}, WORKER: {"cx7_ip": "10.77.1.12"}},
    "timing": {"budgets": {"container_started": 300, "rendezvous": 300, "weights_loaded": 1800, "kv_allocated": 1800,
                           "api_up": 1800}, "poll_interval": 2, "api_timeout": 120, "diagnosis_lines": 30},
}
ENTRY = ["x", "1000", "1000", "", "/home/spark", "/bin/bash"]


def _args(**extra: Any) -> dict[str, Any]:
    """The task's arguments as main.yml passes them (JSON only, as templated variables are)."""
    return json.loads(json.dumps({"config": CONFIG, "head": HEAD, "worker": WORKER, **extra}))


def _before(**extra: Any) -> dict[str, Any]:
    args = {"kit_env": {"ENFORCE_EAGER": "1"},
            "passwd": {HEAD: {"spark": ENTRY}, WORKER: {"spark": ENTRY}},
            "group": {HEAD: {"docker": ["x", "999", "spark"]}, WORKER: {"docker": ["x", "999", "ops"]}},
            "described": {HEAD: {"name": HEAD, "ib_hca": "rocep1s0f1"}, WORKER: {"name": WORKER, "ib_hca": "a,b"}},
            "rdma": {HEAD: {"skipped": True, "changed": False}, WORKER: {"ok": True, "hca": "b", "changed": False}}}
    args.update(extra)
    return _args(**args)


def _after(**extra: Any) -> dict[str, Any]:
    state = {"container": {"exists": True, "running": True, "id": "c1"}, "image_id": "sha256:1", "staging_lock": False}
    args = {"states": {HEAD: state, WORKER: dict(state, container={"exists": True, "running": True, "id": "c2"})},
            "record": {"changed": False, "failed": True, "msg": "file not found"},
            "git": {"changed": False, "before": "abc", "after": "abc"},
            "rendered": {"changed": True, "checksum": "e0", "unset_in_caller": ["IMAGE"], "content": "PORT=8888\n"},
            "kit_commit": "abc", "kit_dir": "/opt/dgxspark/exl3-kit",
            "log": "/opt/dgxspark/exl3-kit/logs/dgxspark-start.log",
            "collection_staged": True, "finish_timeout": 900}
    args.update(extra)
    return _args(**args)


@pytest.mark.parametrize("check_mode", [False, True])
def test_before_the_kit_is_placed(check_mode: bool) -> None:
    result = run_action(ActionModule, _before(), check_mode=check_mode)
    assert not result.get("failed") and result["changed"] is False
    assert result["accounts"] == {
        HEAD: {"home": "/home/spark", "problem": ""},
        WORKER: {"home": "/home/spark", "problem": (
            "the kit user spark is not in the docker group: start.sh runs docker without sudo on both nodes "
            "(sudo usermod -aG docker spark, then log in again)")}}
    assert result["nodes"] == {HEAD: {"name": HEAD, "ib_hca": "mlx5_0"}, WORKER: {"name": WORKER, "ib_hca": "b"}}
    assert result["repos"] == [{"repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "revision": "main"}]
    assert result["env"] == {"ENFORCE_EAGER": "1", "MAX_MODEL_LEN": 850000, "SPEC_METHOD": "mtp"}
    assert "restart" not in result


def test_after_the_kit_state_is_read_then_with_its_record() -> None:
    first = run_action(ActionModule, _after())
    assert not first.get("failed") and first["changed"] is False
    assert (first["restart"], first["why"]) == (True, "no record of the last start")
    assert first["running"] == {HEAD: "c1", WORKER: "c2"}
    assert first["start"]["argv"] == ["env", "--unset=IMAGE", "bash", "-c", START_COMMAND,
                                      "/opt/dgxspark/exl3-kit/logs/dgxspark-start.log", ""]
    assert first["start"]["secrets_file"] == ""
    with_secrets = run_action(ActionModule, _after(secrets_file="/run/dgxspark-kit/start.env"))
    assert with_secrets["start"]["argv"][-1] == with_secrets["start"]["secrets_file"] == "/run/dgxspark-kit/start.env"
    assert first["start"]["env"]["SKIP_SYNC"] == "1" and "VLLM_API_KEY" not in first["start"]["env"]
    assert first["api_retries"] == 60 and "accounts" not in first
    content = json.dumps({"wanted": first["wanted"], "containers": first["running"], "started": "2025-01-01T00:00:00"})
    record = {"content": base64.b64encode(content.encode()).decode(),
              "source": "/opt/dgxspark/exl3-kit/.dgxspark-launch.json"}
    again = run_action(ActionModule, _after(record=record), check_mode=True)
    assert (again["restart"], again["why"], again["wanted"]) == (False, "unchanged", first["wanted"])
    assert again["preview"] == "nothing to start: both ranks run the rendered .env"
    assert again["outcome"] == "already running, unchanged"


@pytest.mark.parametrize("args, message", [
    (_args(), "the kit's launch cannot be planned: give play_hosts (the cluster check), passwd, group and described"),
    (_before(group=None), "the kit's launch cannot be planned: group must be given with passwd"),
    (_after(config=dict(CONFIG, timing=dict(CONFIG["timing"], poll_interval=0))),
     "the kit's launch cannot be planned: dgxspark_vllm_poll_interval must be a positive number of seconds"),
    (_after(record={"content": base64.b64encode(b"{").decode(), "source": "/k/.dgxspark-launch.json"}),
     "the kit's launch cannot be planned: /k/.dgxspark-launch.json cannot be read"),
    (_args(config={"hf_home": "/x"}, passwd={}, group={}, described={}),
     "the kit's launch cannot be planned: the configuration has no 'kit_user'"),
])
def test_what_it_cannot_plan_from_fails_the_task(args: dict[str, Any], message: str) -> None:
    result = run_action(ActionModule, args)
    assert result["failed"] is True
    assert result["msg"].startswith(message)


def test_the_arguments_are_checked_as_the_module_documents_them() -> None:
    with pytest.raises(AnsibleActionFail, match="argument 'finish_timeout' is of type str"):
        run_action(ActionModule, _after(finish_timeout="often"))
    with pytest.raises(AnsibleActionFail, match="missing required arguments: config"):
        run_action(ActionModule, {"head": HEAD})
    assert run_action(ActionModule, _after(finish_timeout="30"))["start"]["finish_retries"] == 15   # templated: strings


def test_after_a_failed_start_then_its_diagnosis_then_the_report() -> None:
    """The role's calls after the waits (the next step), in fail.yml (the message) and at the end (the report)."""
    waits = {"rendezvous": {"changed": False, "ok": False, "phase": "container_started", "reason": "container stopped",
                            "engine_error": None, "last_lines": []},
             "serve": {"changed": False, "skipped": True}, "alive": {"changed": False, "skipped": True}}
    judged = run_action(ActionModule, _args(waits=waits, finished={"changed": False, "skipped": True}))
    assert (judged["step"], judged["stage"], judged["changed"]) == ("fail", "the worker reaching the rendezvous", False)
    assert "message" not in judged
    tails = {HEAD: {"stdout": "", "stderr": "Error: No such container: vllm_glm53"}, WORKER: {"stdout": "x"}}
    failed = run_action(ActionModule, _args(waits=waits, tails=tails, start_tail={"stdout": "[start] worker"},
                                            log="/k/start.log"))
    assert failed["message"].split("\n")[:4] == [
        "The kit's launch failed during the worker reaching the rendezvous.",
        f"{WORKER}: phase reached 'container_started': container stopped",
        f"Both ranks were stopped. Last 30 lines of ./start.sh on {HEAD} (/k/start.log):", "[start] worker"]
    assert "Error: No such container: vllm_glm53" in failed["message"]
    done = run_action(ActionModule, _args(decision={"kit_commit": "abc", "outcome": "already running, unchanged"},
                                          warmup={"changed": False, "skipped": True}, repo_url="u"))
    assert done["report"].startswith("EXL3 through the kit (u at abc): already running, unchanged;")


def test_the_module_itself_refuses_to_run_on_a_node() -> None:
    with pytest.raises(ModuleFail, match="runs on the controller through its action plugin"):
        run_module(kit_launch_plan.main, _before())


def test_the_cluster_check_then_the_watch_step_by_step_then_the_record() -> None:
    """The role's first call (the cluster), the watch's judgements (the next step and its rank, head and worker from
    the configuration) and the last one (the record's text, dated by the controller's clock)."""
    config = dict(CONFIG, launcher="exl3_kit", profile_name="glm53_flash_exl3", head=HEAD, workers=[WORKER])
    checked = run_action(ActionModule, {"config": config, "play_hosts": [HEAD, WORKER]})
    assert checked == {"cluster_problem": "", "changed": False}
    alone = run_action(ActionModule, {"config": config, "play_hosts": [HEAD]})
    assert alone["cluster_problem"].endswith(f"this cluster has {HEAD}, {WORKER} and this play {HEAD}.")
    ok = {"changed": False, "ok": True, "phase": "rendezvous", "reason": None, "last_lines": []}
    first = run_action(ActionModule, {"config": config, "waits": {"rendezvous": {}, "serve": {}, "alive": {}}})
    assert (first["step"], first["host"]) == ("rendezvous", WORKER)
    serve = run_action(ActionModule, {"config": config, "waits": {"rendezvous": ok, "serve": {}, "alive": {}}})
    assert (serve["step"], serve["host"], serve["peers"]) == ("serve", HEAD, ["10.77.1.12"])
    state = {"container": {"exists": True, "running": True, "id": "c1"}}
    done = run_action(ActionModule, {"config": config, "waits": {"rendezvous": ok, "serve": ok, "alive": ok},
                                     "finished": {"finished": 1, "rc": 0}, "wanted": "w",
                                     "started": {HEAD: state, WORKER: dict(state, container={"running": True, "id": "c2"})}})
    record = json.loads(done["record"])
    assert (done["step"], record["wanted"], record["containers"]) == ("record", "w", {HEAD: "c1", WORKER: "c2"})
    assert record["started"].endswith("+00:00")
