# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EXL3 kit launch's decisions: the kit user's account on each node, the HCA the kit takes, the .env's extra
keys, the restart decision and its reason, the check-mode preview, start.sh's argv, environment and timing."""
from __future__ import annotations

import base64
import json
import os
import subprocess
from typing import Any

import jinja2
import pytest
from ansible.plugins.filter.core import get_hash, to_json

from ansible_collections.dgxspark.vllm.plugins.module_utils._kit_plan import (
    KitPlanError,
    account_problem,
    accounts,
    cluster_problem,
    decide,
    docker_members,
    home,
    diagnose,
    images,
    judge,
    kit_env,
    kit_hca,
    kit_node,
    last_start,
    observed,
    outcome,
    plan,
    prepare,
    preview,
    report,
    repos,
    restart,
    running,
    staged,
    start_argv,
    start_env,
    start_record,
    timing,
    wanted,
    warmup_prompt,
    why,
)
from ansible_collections.dgxspark.vllm.plugins.module_utils._secret_file import render_env, write_secret

HEAD, WORKER = "spark-a", "spark-b"
USER = "spark"
PASSWD = [["x", "1000", "1000", "Spark", "/home/spark", "/bin/bash"]]
CONFIG: dict[str, Any] = {
    "staging_lock_path": "/run/dgxspark/staging.lock", "firewall": True,
    "kit_user": USER, "hf_home": "/home/spark/.cache/huggingface", "container_name": "vllm_glm53", "port": 8888,
    "model_repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "model_revision": "main",
    "drafter_repo": "incoai/GLM-5.3-Flash-DFlash2", "drafter_revision": "main",
    "gpu_memory_utilization": 0.85, "max_model_len": 850000,
    "nodes": {HEAD: {"cx7_ip": "10.77.1.11"}, WORKER: {"cx7_ip": "10.77.1.12", "ib_hca": ""}},
    "launcher": "exl3_kit", "served_model_name": "glm-5.3-flash",
}
BUDGETS = {"container_started": 300, "rendezvous": 300, "weights_loaded": 1800, "kv_allocated": 1800, "api_up": 1800}
# the cluster's timing as the configuration step resolves it for the kit (_timing)
CONFIG["timing"] = {"budgets": BUDGETS, "poll_interval": 2, "api_timeout": 120, "diagnosis_lines": 30,
                    "peer_grace_seconds": 30, "stall_seconds": 900, "progress_interval": 15, "stop_grace_seconds": 10}
SETTINGS: dict[str, Any] = {
    "kit_commit": "008ae945181341da7fce399bea503d86474e3ea4", "kit_dir": "/opt/dgxspark/exl3-kit",
    "log": "/opt/dgxspark/exl3-kit/logs/dgxspark-start.log", "collection_staged": True, "finish_timeout": 900}
NOT_IN_DOCKER = ("the kit user spark is not in the docker group: start.sh runs docker without sudo on both nodes "
                 "(sudo usermod -aG docker spark, then log in again)")


def _state(cid: str | None, running_: bool = True, image_id: str | None = "sha256:img",
           staging_lock: bool = False, firewall: bool = True) -> dict[str, Any]:
    return {"container": {"exists": cid is not None, "running": running_, "id": cid}, "image_id": image_id,
            "staging_lock": staging_lock,
            "firewall": ({"present": True, "why": ""} if firewall
                         else {"present": False, "why": "the table inet dgxspark is not loaded"})}


def _record(document: Any) -> dict[str, Any]:
    return {"content": base64.b64encode(json.dumps(document).encode()).decode(),
            "source": "/opt/kit/.dgxspark-launch.json"}


# --------------------------------------------------------------------------------------------- accounts


@pytest.mark.parametrize("passwd, expected", [
    ({USER: PASSWD[0]}, "/home/spark"),
    ({USER: None}, ""),                       # getent with fail_key: false, the user does not exist
    ({}, ""),
    (None, ""),
    ({USER: ["x", "1000"]}, ""),              # a short entry
    ({USER: PASSWD}, ""),                     # duplicate entries (a list of lists): no home, as the role read it
])
def test_home(passwd: Any, expected: str) -> None:
    assert home(passwd, USER) == expected


@pytest.mark.parametrize("group, expected", [
    ({"docker": ["x", "999", "spark,ops"]}, ["spark", "ops"]),
    ({"docker": ["x", "999", ""]}, [""]),
    ({"docker": None}, [""]),
    (None, [""]),
])
def test_docker_members(group: Any, expected: list[str]) -> None:
    assert docker_members(group) == expected


@pytest.mark.parametrize("user, hf_home, is_head, user_home, members, expected", [
    (USER, "/x", False, "", ["spark"], "the kit user spark (dgxspark_vllm_kit_user) does not exist"),
    (USER, "/x", True, "", [""], "the kit user spark (dgxspark_vllm_kit_user) does not exist"),
    (USER, "/home/spark/.cache/huggingface", True, "/home/spark", ["ops"], NOT_IN_DOCKER),
    (USER, "/data/hf", False, "/home/spark", ["spark"],
     "the kit reads the workers weights from /home/spark/.cache/huggingface (start.sh:328), but dgxspark_vllm_hf_home "
     "is /data/hf: set dgxspark_vllm_hf_home to /home/spark/.cache/huggingface and stage again"),
    (USER, "/data/hf", True, "/home/spark", ["spark"], ""),              # the head keeps its cache anywhere
    (USER, "/home/spark/.cache/huggingface", False, "/home/spark", ["ops", "spark"], ""),
    ("root", "/root/.cache/huggingface", False, "/root", [""], ""),      # root runs docker without the group
])
def test_account_problem(user: str, hf_home: str, is_head: bool, user_home: str, members: list[str],
                         expected: str) -> None:
    assert account_problem(user, hf_home, is_head, user_home, members) == expected


def test_accounts_per_node() -> None:
    out = accounts(CONFIG, HEAD, {HEAD: {USER: PASSWD[0]}, WORKER: {USER: None}},
                   {HEAD: {"docker": ["x", "999", "ops"]}, WORKER: {"docker": ["x", "999", "spark"]}})
    assert out == {HEAD: {"home": "/home/spark", "problem": NOT_IN_DOCKER},
                   WORKER: {"home": "", "problem": "the kit user spark (dgxspark_vllm_kit_user) does not exist"}}


# --------------------------------------------------------------------------------------------- repos, .env, HCA


def test_repos_with_and_without_the_drafter() -> None:
    assert repos(CONFIG) == [{"repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "revision": "main"},
                             {"repo": "incoai/GLM-5.3-Flash-DFlash2", "revision": "main"}]
    assert repos(dict(CONFIG, drafter_repo="")) == [{"repo": "brandonmusic/GLM-5.3-Flash-tr3-4bpw", "revision": "main"}]


@pytest.mark.parametrize("changes, extra, expected", [
    ({}, {"KV_CACHE_DTYPE": "fp8"}, {"KV_CACHE_DTYPE": "fp8", "GPU_MEM_UTIL": 0.85, "MAX_MODEL_LEN": 850000}),
    ({}, {"GPU_MEM_UTIL": 0.5}, {"GPU_MEM_UTIL": 0.85, "MAX_MODEL_LEN": 850000}),    # the cluster's value wins
    ({"gpu_memory_utilization": None, "max_model_len": None}, {"GPU_MEM_UTIL": 0.5}, {"GPU_MEM_UTIL": 0.5}),
    ({"drafter_repo": "", "gpu_memory_utilization": None, "max_model_len": None}, {}, {"SPEC_METHOD": "mtp"}),
    ({"drafter_repo": "", "gpu_memory_utilization": None, "max_model_len": None}, {"SPEC_METHOD": "ngram"},
     {"SPEC_METHOD": "ngram"}),
])
def test_kit_env(changes: dict[str, Any], extra: dict[str, Any], expected: dict[str, Any]) -> None:
    assert kit_env(dict(CONFIG, **changes), extra) == expected


@pytest.mark.parametrize("inventory, rdma, described, expected", [
    ("mlx5_1,mlx5_3", {"ok": True, "hca": "rocep1s0f1"}, "a,b", "mlx5_1"),     # the inventory first
    ("", {"ok": True, "hca": "rocep1s0f1"}, "a,b", "rocep1s0f1"),              # then the device on the CX7 IP
    (None, {"ok": False, "hca": "rocep1s0f1"}, "a,b", "a"),                    # a failed read: the first detected
    ("", {"skipped": True}, "a,b", "a"),
    ("", {"ok": True, "hca": None}, "a", "a"),
    ("", None, None, ""),
])
def test_kit_hca(inventory: str | None, rdma: Any, described: str | None, expected: str) -> None:
    assert kit_hca(inventory, rdma, described) == expected


def test_kit_node_sets_the_hca_only_when_one_is_known() -> None:
    described = {"name": HEAD, "cx7_ip": "10.77.1.11", "ib_hca": "rocep1s0f1,roceP2p1s0f1"}
    assert kit_node(described, {}, {"ok": True, "hca": "roceP2p1s0f1"})["ib_hca"] == "roceP2p1s0f1"
    assert kit_node(described, None, None)["ib_hca"] == "rocep1s0f1"
    assert kit_node({"name": HEAD}, {}, {"ok": False}) == {"name": HEAD}
    assert described["ib_hca"] == "rocep1s0f1,roceP2p1s0f1"      # the description is not changed


def test_prepare() -> None:
    out = prepare(CONFIG, HEAD, {"ENFORCE_EAGER": "1"},
                  {HEAD: {USER: PASSWD[0]}, WORKER: {USER: PASSWD[0]}},
                  {HEAD: {"docker": ["x", "9", "spark"]}, WORKER: {"docker": ["x", "9", "spark"]}},
                  {HEAD: {"name": HEAD, "ib_hca": "h1,h2"}, WORKER: {"name": WORKER, "ib_hca": "w1"}},
                  {WORKER: {"ok": True, "hca": "w2"}})
    assert out["accounts"] == {HEAD: {"home": "/home/spark", "problem": ""},
                               WORKER: {"home": "/home/spark", "problem": ""}}
    assert out["nodes"] == {HEAD: {"name": HEAD, "ib_hca": "h1"}, WORKER: {"name": WORKER, "ib_hca": "w2"}}
    assert out["repos"] == repos(CONFIG)
    assert out["env"] == {"ENFORCE_EAGER": "1", "GPU_MEM_UTIL": 0.85, "MAX_MODEL_LEN": 850000}


MODEL, DRAFTER = CONFIG["model_repo"], CONFIG["drafter_repo"]
C1, C2 = "a" * 40, "b" * 40


def _read(model: str | None = C1, drafter: str | None = C1, model_staged: bool = True,
          drafter_staged: bool = True) -> list[dict[str, Any]]:
    return [{"repo": MODEL, "revision": "main", "commit": model, "staged": model_staged},
            {"repo": DRAFTER, "revision": "main", "commit": drafter, "staged": drafter_staged}]


def test_staged_everywhere_and_the_same_commits() -> None:
    out = staged(CONFIG, HEAD, {HEAD: _read(), WORKER: _read()})
    assert out == {"staged": {HEAD: {"problem": ""}, WORKER: {"problem": ""}},
                   "commits": {MODEL: C1, DRAFTER: C1}, "commits_problem": ""}


def test_a_node_missing_a_repository_is_named_with_the_fix() -> None:
    out = staged(CONFIG, HEAD, {HEAD: _read(), WORKER: _read(drafter=None, drafter_staged=False)})
    assert out["staged"][HEAD] == {"problem": ""}
    assert out["staged"][WORKER]["problem"] == (
        f"{WORKER}: not staged and verified under /home/spark/.cache/huggingface/hub: {DRAFTER}. Stage first "
        "(ansible-playbook site.yml --tags staging); the kit reads both nodes' HF caches and, with "
        "kit_launch_collection_staged, downloads nothing itself.")


def test_nodes_on_different_commits_are_refused_naming_each() -> None:
    out = staged(CONFIG, HEAD, {HEAD: _read(), WORKER: _read(model=C2)})
    assert out["commits"] == {MODEL: C1, DRAFTER: C1}   # the head's
    assert out["commits_problem"].startswith("The nodes hold different commits of the staged repositories: ")
    assert f'"{WORKER}": {{"{MODEL}": "{C2}", "{DRAFTER}": "{C1}"}}' in out["commits_problem"]
    assert out["commits_problem"].endswith("Stage again (ansible-playbook site.yml --tags staging) so both serve "
                                           "the same weights.")


def test_prepare_decides_the_staging_only_when_the_reads_are_given() -> None:
    args = (CONFIG, HEAD, {}, {HEAD: {USER: PASSWD[0]}}, {HEAD: {"docker": ["x", "9", "spark"]}}, {HEAD: {"name": HEAD}}, {})
    assert "staged" not in prepare(*args)
    assert prepare(*args, {HEAD: _read()})["commits"] == {MODEL: C1, DRAFTER: C1}


# --------------------------------------------------------------------------------------------- restart


def test_running_and_images() -> None:
    states = {HEAD: _state("c1"), WORKER: _state("c2", running_=False, image_id=None), "spark-c": {}}
    assert running(states) == {HEAD: "c1"}
    assert images(states) == {HEAD: "sha256:img", WORKER: "", "spark-c": ""}


def test_wanted_is_the_digest_the_role_always_computed() -> None:
    """sha256 of Ansible's to_json of the same document: a record written before still matches."""
    node_images = {HEAD: "sha256:a", WORKER: ""}
    document = {"env": "e0", "kit_commit": "c0", "images": node_images, "user": USER}
    assert wanted("e0", "c0", node_images, USER) == get_hash(to_json(document), "sha256")
    assert wanted("e1", "c0", node_images, USER) != wanted("e0", "c0", node_images, USER)
    assert wanted("e0", "c0", {HEAD: "sha256:b", WORKER: ""}, USER) != wanted("e0", "c0", node_images, USER)


def test_last_start() -> None:
    assert last_start({}) == {}
    assert last_start({"failed": True, "msg": "file not found"}) == {}
    document = {"wanted": "w", "containers": {HEAD: "c1"}}
    assert last_start(_record(document)) == document
    with pytest.raises(KitPlanError, match=r"^/opt/kit/\.dgxspark-launch\.json cannot be read .*remove it"):
        last_start({"content": base64.b64encode(b"{not json").decode(), "source": "/opt/kit/.dgxspark-launch.json"})
    with pytest.raises(KitPlanError, match="cannot be read"):
        last_start({"content": "***"})
    with pytest.raises(KitPlanError, match="cannot be read"):     # an empty record is a broken one, not none
        last_start({"content": ""})
    with pytest.raises(KitPlanError, match="is not a JSON object"):
        last_start(_record(["w"]))


BOTH = {HEAD: "c1", WORKER: "c2"}


@pytest.mark.parametrize("last, now_running, expected_restart, expected_why", [
    ({"wanted": "w", "containers": BOTH}, BOTH, False, "unchanged"),
    ({"wanted": "w", "containers": BOTH}, {}, True, "nothing runs"),
    ({"wanted": "w", "containers": BOTH}, {HEAD: "c1"}, True, "a rank is not running"),
    ({}, BOTH, True, "no record of the last start"),
    ({"wanted": "old", "containers": BOTH}, BOTH, True, "the .env, the kit commit or an image changed"),
    ({"wanted": "w", "containers": {HEAD: "c1", WORKER: "c9"}}, BOTH, True,
     "a container was replaced outside the collection"),
    ({"wanted": "w"}, BOTH, True, "a container was replaced outside the collection"),
    ({"wanted": "w", "containers": {}}, {}, False, "nothing runs"),      # as the role decided: the record matches
])
def test_restart_and_why(last: dict[str, Any], now_running: dict[str, str], expected_restart: bool,
                         expected_why: str) -> None:
    assert restart(last, "w", now_running) is expected_restart
    assert why(last, "w", now_running) == expected_why


def test_preview_and_outcome() -> None:
    assert preview(True, "nothing runs", "/opt/kit", HEAD, WORKER, USER, 8888) == (
        "would run ./start.sh in /opt/kit on spark-a as spark (nothing runs): worker spark-b first, then the head, "
        "on port 8888")
    assert preview(False, "unchanged", "/opt/kit", HEAD, WORKER, USER, 8888) == (
        "nothing to start: both ranks run the rendered .env")
    assert outcome(True, "a rank is not running") == "started (a rank is not running)"
    assert outcome(False, "unchanged") == "already running, unchanged"


# --------------------------------------------------------------------------------------------- start.sh


def test_start_env_and_argv() -> None:
    assert start_env("vllm_glm53", BUDGETS, True) == {
        "CONTAINER_HEAD": "vllm_glm53", "CONTAINER_WORKER": "vllm_glm53", "READY_TIMEOUT": "6000",
        "SKIP_PULL": "1", "SKIP_SHIP": "1", "SKIP_DOWNLOAD": "1", "SKIP_SYNC": "1"}
    assert start_env("c", {"a": "10", "b": 5}, False) == {"CONTAINER_HEAD": "c", "CONTAINER_WORKER": "c",
                                                          "READY_TIMEOUT": "15"}
    assert start_argv(["HF_HOME", "IMAGE"], "/kit/logs/x.log") == [
        "env", "--unset=HF_HOME", "--unset=IMAGE", "bash", "-c",
        'mkdir -p logs && if [ -n "$1" ]; then set -a && . "$1" && set +a && rm -f -- "$1"; fi'
        ' && exec ./start.sh start >"$0" 2>&1', "/kit/logs/x.log", ""]
    assert start_argv([], "l")[:2] == ["env", "bash"]
    assert start_argv([], "l", "/run/dgxspark-kit/start.env")[-2:] == ["l", "/run/dgxspark-kit/start.env"]


def _start_sh(kit, secrets_file: str, environ: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the planned argv against a stand-in start.sh that prints what it was given."""
    start = kit / "start.sh"
    start.write_text('#!/bin/sh\nprintf "%s|%s|%s\\n" "$1" "${VLLM_API_KEY-unset}" "${HF_TOKEN-unset}"\n')
    start.chmod(0o755)
    return subprocess.run(start_argv(["HF_HOME"], str(kit / "logs" / "start.log"), secrets_file), cwd=kit,
                          env=environ, capture_output=True, text=True, check=False)


def test_start_argv_sources_the_secrets_file_then_removes_it(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    secrets = tmp_path / "start.env"
    write_secret(str(secrets), render_env({"VLLM_API_KEY": "k'ey $x", "HF_TOKEN": "hf_1"}))
    done = _start_sh(kit, str(secrets), {"PATH": os.environ["PATH"], "HF_HOME": "/caller"})
    assert done.returncode == 0, done.stderr
    assert (kit / "logs" / "start.log").read_text() == "start|k'ey $x|hf_1\n"
    assert not secrets.exists()
    # no file given: start.sh gets no secrets; a file that is gone: the start fails before start.sh runs
    assert _start_sh(kit, "", {"PATH": os.environ["PATH"]}).returncode == 0
    assert (kit / "logs" / "start.log").read_text() == "start|unset|unset\n"
    (kit / "logs" / "start.log").unlink()
    assert _start_sh(kit, str(secrets), {"PATH": os.environ["PATH"]}).returncode != 0
    assert not (kit / "logs" / "start.log").exists()


@pytest.mark.parametrize("budgets, poll, finish, api, expected", [
    (BUDGETS, 2, 900, 120, {"async_seconds": 6900, "poll_seconds": 2, "finish_retries": 450, "api_retries": 60}),
    ({"a": 10}, 3, 10, 10, {"async_seconds": 20, "poll_seconds": 3, "finish_retries": 4, "api_retries": 4}),   # ceil
    # the launch's 0.5 s: Ansible's retries wait whole seconds, so the kit's polls of start.sh and the API take 1 s
    ({"a": 10.5}, 0.5, 10, 10, {"async_seconds": 21, "poll_seconds": 1, "finish_retries": 10, "api_retries": 10}),
])
def test_timing(budgets: dict[str, Any], poll: float, finish: int, api: int, expected: dict[str, int]) -> None:
    assert timing(budgets, poll, finish, api) == expected


def test_timing_refuses_what_it_cannot_count() -> None:
    with pytest.raises(KitPlanError, match="dgxspark_vllm_poll_interval must be a positive number of seconds, not 0"):
        timing(BUDGETS, 0, 900, 120)
    with pytest.raises(KitPlanError, match=r"dgxspark_vllm_budgets\.api_up must be a number of seconds, not 'soon'"):
        timing(dict(BUDGETS, api_up="soon"), 2, 900, 120)
    with pytest.raises(KitPlanError, match=r"dgxspark_vllm_budgets\.api_up must be a number of seconds, not True"):
        start_env("c", {"api_up": True}, True)


def _decide(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"states": {HEAD: _state("c1"), WORKER: _state("c2")}, "record": {},
                            "git": {"after": "abc"}, "rendered": {"checksum": "e0", "unset_in_caller": ["IMAGE"]}}
    args.update(changes)
    return decide(CONFIG, HEAD, WORKER, args["states"], args["record"], args["git"], args["rendered"], SETTINGS)


def test_decide_starts_without_a_record_and_then_keeps_what_runs() -> None:
    first = _decide()
    assert (first["restart"], first["why"], first["kit_commit"]) == (True, "no record of the last start", "abc")
    assert first["running"] == BOTH
    assert first["preview"].startswith("would run ./start.sh in /opt/dgxspark/exl3-kit on spark-a as spark (no record")
    assert first["outcome"] == "started (no record of the last start)"
    assert first["start"]["argv"][:2] == ["env", "--unset=IMAGE"]
    assert first["start"]["argv"][-1] == first["start"]["secrets_file"] == ""
    assert first["start"]["env"]["READY_TIMEOUT"] == "6000"
    assert (first["start"]["async_seconds"], first["start"]["finish_retries"], first["api_retries"]) == (6900, 450, 60)
    # the record the role writes after that start: the next run changes nothing
    again = _decide(record=_record({"wanted": first["wanted"], "containers": BOTH, "started": "2025-01-01T00:00:00"}))
    assert (again["restart"], again["why"], again["outcome"]) == (False, "unchanged", "already running, unchanged")
    assert again["preview"] == "nothing to start: both ranks run the rendered .env"
    # a new .env
    changed = _decide(record=_record({"wanted": first["wanted"], "containers": BOTH}),
                      rendered={"checksum": "e1"})
    assert (changed["restart"], changed["why"]) == (True, "the .env, the kit commit or an image changed")
    assert changed["start"]["argv"][:2] == ["env", "bash"]


def test_decide_refuses_a_start_while_staging_runs_and_keeps_a_group_that_needs_none() -> None:
    locked = {HEAD: _state("c1"), WORKER: _state("c2", staging_lock=True)}
    start = _decide(states=locked)
    assert start["restart"] is True
    assert start["refusal"] == (f"Staging runs on {WORKER} (/run/dgxspark/staging.lock exists): a heavy download "
                                "during a model load starves GB10's unified memory. Let staging finish (or remove a "
                                "stale lock left by a killed run) and launch again.")
    assert _decide()["refusal"] is None
    first = _decide()
    kept = _decide(states=locked, record=_record({"wanted": first["wanted"], "containers": BOTH}))
    assert (kept["restart"], kept["refusal"]) == (False, None)   # nothing starts: nothing to refuse


def test_decide_refuses_a_start_without_the_firewall_table_unless_the_firewall_is_off() -> None:
    bare = {HEAD: _state("c1", firewall=False), WORKER: _state("c2")}
    assert _decide(states=bare)["refusal"] == (
        f"The firewall is on (dgxspark_vllm_firewall) but its table is not in place ({HEAD}: the table inet dgxspark is "
        "not loaded): the engine's ports would answer the whole LAN. Apply it with playbooks/firewall.yml (or site.yml "
        "--tags firewall) and launch again, or set dgxspark_vllm_firewall: false to serve without it.")
    off = decide(dict(CONFIG, firewall=False), HEAD, WORKER, bare, {}, {"after": "abc"},
                 {"checksum": "e0", "unset_in_caller": ["IMAGE"]}, SETTINGS)
    assert off["refusal"] is None


def test_decide_takes_the_pinned_commit_when_git_says_nothing() -> None:
    assert _decide(git={})["kit_commit"] == SETTINGS["kit_commit"]
    assert _decide(git={"after": None})["kit_commit"] is None          # as the role's default() kept it
    assert _decide(git={})["wanted"] != _decide()["wanted"]
    assert _decide(rendered={})["wanted"] == wanted("", "abc", {HEAD: "sha256:img", WORKER: "sha256:img"}, USER)


def test_plan_dispatches_on_what_was_observed() -> None:
    base = {"config": CONFIG, "head": HEAD, "worker": WORKER, "kit_env": {}, "rdma": {}, "record": {}, "git": {},
            "rendered": {}, "collection_staged": True}
    before = plan(dict(base, passwd={HEAD: {USER: PASSWD[0]}}, group={HEAD: {"docker": ["x", "9", USER]}},
                       described={HEAD: {"name": HEAD}}))
    assert set(before) == {"accounts", "nodes", "repos", "env"}
    settings = {k: v for k, v in SETTINGS.items() if k != "collection_staged"}
    after = plan(dict(base, states={HEAD: _state("c1")}, **settings))
    assert set(after) == {"launcher", "wanted", "restart", "why", "running", "kit_commit", "preview", "outcome",
                          "start", "poll_seconds", "api_retries", "warmup_prompt", "warmup", "refusal"}
    judged = plan(dict(base, waits={"rendezvous": _wait(True), "serve": _wait(True), "alive": _wait(True)},
                       finished={"finished": 1, "rc": 0}))
    assert set(judged) == {"step", "host", "stage", "failures"}
    recorded = plan(dict(base, waits=GOOD, finished={"finished": 1, "rc": 0}, wanted="w",
                         started={HEAD: _state("c1"), WORKER: _state("c2")}), now="2026-01-01T00:00:00+00:00")
    assert json.loads(recorded["record"]) == {"wanted": "w", "containers": {HEAD: "c1", WORKER: "c2"},
                                              "started": "2026-01-01T00:00:00+00:00"}
    assert "record" not in plan(dict(base, waits={}, wanted="w", started={}))   # not a step that records
    with pytest.raises(KitPlanError, match="^wanted must be given with started$"):
        plan(dict(base, waits=GOOD, started={}))
    failed = plan(dict(base, waits={"rendezvous": _wait(False, "stopped")}, tails={}, log="/k/log"))
    assert failed["step"] == "fail" and failed["message"].startswith("The kit's launch failed during the worker")
    assert set(plan(dict(base, decision={"outcome": "started"}))) == {"report"}
    with pytest.raises(KitPlanError, match=r"^give play_hosts \(the cluster check\), passwd, group and described"):
        plan(base)
    with pytest.raises(KitPlanError, match="^group, described must be given with passwd$"):
        plan(dict(base, passwd={}))
    with pytest.raises(KitPlanError, match="^kit_dir, finish_timeout must be given with states$"):
        plan(dict(base, states={}, **{k: v for k, v in SETTINGS.items() if k not in ("kit_dir", "finish_timeout")}))
    with pytest.raises(KitPlanError, match="^the configuration has no timing"):
        plan(dict(base, config={k: v for k, v in CONFIG.items() if k != "timing"}, states={HEAD: _state("c1")},
                  **settings))


# ------------------------------------------------------------------------------------------- after a start


def _wait(ok: bool, reason: str = "", phase: str = "rendezvous", **extra: Any) -> dict[str, Any]:
    """A vllm_startup_wait result as the role registers it."""
    return {"changed": False, "ok": ok, "phase": phase, "reason": None if ok else reason,
            "engine_error": extra.pop("engine_error", None), "log_report": extra.pop("log_report", None),
            "last_lines": [], **extra}


SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}
GOOD = {"rendezvous": _wait(True), "serve": _wait(True, phase="api_up"), "alive": _wait(True)}


@pytest.mark.parametrize("waits, finished, expected", [
    (GOOD, {"finished": 1, "rc": 0}, ("record", "")),
    # the worker never reached its rendezvous: the head's waits were skipped
    ({"rendezvous": _wait(False, "container stopped (exit code 1) after reaching phase container_started",
                          phase="container_started"), "serve": SKIPPED, "alive": SKIPPED}, {},
     ("fail", "the worker reaching the rendezvous")),
    ({"rendezvous": _wait(True), "serve": _wait(False, "phase 'api_up' not reached within its budget of 1800 s",
                                                phase="kv_allocated"), "alive": SKIPPED}, {},
     ("fail", "the head starting to serve")),
    # the head serves but the worker died meanwhile
    ({"rendezvous": _wait(True), "serve": _wait(True, phase="api_up"), "alive": _wait(False, "container stopped")},
     SKIPPED, ("fail", "the head starting to serve")),
    (GOOD, {"finished": 1, "rc": 3}, ("fail", "./start.sh finishing (exit code 3)")),
    (GOOD, {"finished": 0, "failed": False}, ("fail", "./start.sh finishing (exit code none: still running)")),
])
def test_judge_names_the_first_stage_that_failed(waits: dict[str, Any], finished: dict[str, Any],
                                                 expected: tuple[str, str]) -> None:
    verdict = judge(waits, finished, HEAD, WORKER)
    assert (verdict["step"], verdict["stage"]) == expected


def test_judge_lists_each_rank_that_failed_as_the_launch_does() -> None:
    serve = _wait(False, "engine error: CUDA out of memory", phase="weights_loaded", engine_error="CUDA out of memory")
    verdict = judge({"rendezvous": _wait(True), "serve": serve, "alive": _wait(False, "container stopped")}, {},
                    HEAD, WORKER)
    assert verdict["failures"] == [f"{HEAD}: phase reached 'weights_loaded': engine error: CUDA out of memory",
                                   f"{WORKER}: phase reached 'rendezvous': container stopped"]


def test_observed_puts_each_wait_on_its_rank() -> None:
    assert observed(GOOD, HEAD, WORKER) == {HEAD: {"serve": GOOD["serve"]},
                                            WORKER: {"rendezvous": GOOD["rendezvous"], "alive": GOOD["alive"]}}


def test_diagnose_shows_the_stage_the_ranks_start_sh_and_both_containers() -> None:
    waits = {"rendezvous": _wait(True), "serve": _wait(False, "container stopped (exit code 1) after reaching phase "
                                                       "kv_allocated", phase="kv_allocated",
                                                       engine_error="ValueError: max_model_len too large",
                                                       log_report={"estimated_max_model_len": 600000}),
             "alive": SKIPPED}
    tails = {HEAD: {"stdout": "INFO loading\nERROR boom", "stderr": ""}, WORKER: {"stdout": "", "stderr": ""},
             }
    text = diagnose(CONFIG, HEAD, WORKER, waits, SKIPPED, tails, {"stdout": "[start] head up"}, "/k/start.log")
    assert text.split("\n") == [
        "The kit's launch failed during the head starting to serve.",
        f"{HEAD}: phase reached 'kv_allocated': container stopped (exit code 1) after reaching phase kv_allocated "
        "[engine: ValueError: max_model_len too large]",
        "The engine cannot fit max-model-len 850000 into its KV cache: the estimated maximum model length is 600000.",
        "Fix: set dgxspark_vllm_max_model_len to at most 600000, or give the KV cache more memory.",
        f"Both ranks were stopped. Last 30 lines of ./start.sh on {HEAD} (/k/start.log):",
        "[start] head up",
        f"----- {HEAD} (head) container vllm_glm53 -----",
        "INFO loading",
        "ERROR boom",
        f"----- {WORKER} (worker) container vllm_glm53 -----",
        "(no container)"]
    # start.sh's exit: no rank failed; nothing collected on the head
    bare = diagnose(dict(CONFIG, timing=dict(CONFIG["timing"], diagnosis_lines=5)), HEAD, WORKER, GOOD,
                    {"finished": 1, "rc": 2}, {}, {}, "/k/start.log")
    assert bare.split("\n")[:3] == [
        "The kit's launch failed during ./start.sh finishing (exit code 2).",
        f"Both ranks were stopped. Last 5 lines of ./start.sh on {HEAD} (/k/start.log):",
        "(none)"]


def test_report_says_what_serves_the_trade_off_and_the_warm_up() -> None:
    decision = {"kit_commit": "abc", "outcome": "started (nothing runs)"}
    rendered = {"values": {"MAX_MODEL_LEN": "850000"}, "drafter": "incoai/GLM-5.3-Flash-DFlash2"}
    text = report(CONFIG, decision, rendered, {"elapsed": 12, "status": 200}, "https://example.org/kit.git")
    assert text.startswith("EXL3 through the kit (https://example.org/kit.git at abc): started (nothing runs); "
                           "glm-5.3-flash on port 8888, max-model-len 850000, drafter incoai/GLM-5.3-Flash-DFlash2. "
                           "Trade-off: about twice NVFP4's decode")
    assert text.endswith("time to first token. Warm-up request: 12 s.")
    plain = report(CONFIG, decision, {}, SKIPPED, "u")
    assert "max-model-len ?, drafter none." in plain
    assert plain.endswith("Set kit_launch_warmup_prompt_chars to pay the first large-prompt latency once, at start.")


@pytest.mark.parametrize("chars", [1, 40, 2000, 100000])
def test_warmup_prompt_is_the_prompt_the_role_always_sent(chars: int) -> None:
    earlier = jinja2.Environment().from_string(
        "{{ ('Summarise the following text. ' ~ ('The cluster serves the model across two nodes. ' * 10000))"
        " | truncate(chars, true, '', 0) }}")
    assert warmup_prompt(chars) == earlier.render(chars=chars)


def test_warmup_prompt() -> None:
    assert warmup_prompt(0) == ""
    assert warmup_prompt(40) == "Summarise the following text. The cluste"
    assert len(warmup_prompt(2000)) == 2000 and warmup_prompt(2000).count("two nodes.") == 41
    assert _decide()["warmup_prompt"] == ""


# --------------------------------------------------------------------------------------------- the cluster and the watch


@pytest.mark.parametrize("changes, play, problem", [
    ({}, [HEAD, WORKER], False),
    ({}, [HEAD, WORKER, "spark-c"], False),                  # more hosts in the play: only the cluster's count
    ({}, [HEAD], True),                                      # the worker is not in the play
    ({"launcher": "vllm"}, [HEAD, WORKER], True),            # a profile the launch role serves
    ({"workers": [WORKER, "spark-c"]}, [HEAD, WORKER], True),   # the kit drives one worker
    ({"workers": []}, [HEAD, WORKER], True),
])
def test_cluster_problem(changes: dict[str, Any], play: list[str], problem: bool) -> None:
    config = {**CONFIG, "head": HEAD, "workers": [WORKER], "profile_name": "glm53_flash_exl3", **changes}
    assert bool(cluster_problem(config, play)) is problem


def test_cluster_problem_names_the_profile_the_cluster_and_the_play_as_the_role_always_did() -> None:
    config = dict(CONFIG, head=HEAD, workers=[], launcher="vllm", profile_name="glm53_flash_nvfp4")
    assert cluster_problem(config, [HEAD]) == (
        "kit_launch serves profiles with the exl3_kit launcher (dgxspark_vllm_profile is glm53_flash_nvfp4) on exactly "
        "two nodes, a head and one worker (the kit drives one worker over ssh), both in this play; this cluster has "
        f"{HEAD}, {WORKER} and this play {HEAD}.")
    # the check alone: no head or worker to plan for, whatever else was given
    assert plan({"config": config, "play_hosts": [HEAD], "waits": {}}) == {"cluster_problem": cluster_problem(config, [HEAD])}


@pytest.mark.parametrize("waits, finished, expected", [
    ({}, {}, ("rendezvous", WORKER)),                                  # nothing ran yet: the worker's rendezvous
    ({"rendezvous": SKIPPED, "serve": SKIPPED, "alive": SKIPPED}, {}, ("rendezvous", WORKER)),
    ({"rendezvous": _wait(True), "serve": {}, "alive": {}}, {}, ("serve", HEAD)),
    ({"rendezvous": _wait(True), "serve": _wait(True, phase="api_up"), "alive": SKIPPED}, SKIPPED, ("alive", WORKER)),
    (GOOD, SKIPPED, ("finish", HEAD)),
    (GOOD, {}, ("finish", HEAD)),
    (GOOD, {"finished": 1, "rc": 0}, ("record", HEAD)),
    ({"rendezvous": _wait(False, "stopped")}, {}, ("fail", "")),        # a failed wait ends the watch
])
def test_judge_names_the_next_step_and_its_rank(waits: dict[str, Any], finished: dict[str, Any],
                                                expected: tuple[str, str]) -> None:
    verdict = judge(waits, finished, HEAD, WORKER, CONFIG)
    assert (verdict["step"], verdict["host"]) == expected
    assert ("peers" in verdict) is (verdict["step"] == "serve")


def test_the_head_watches_the_workers_cx7_ip_while_it_starts_to_serve() -> None:
    assert judge({"rendezvous": _wait(True)}, {}, HEAD, WORKER, CONFIG)["peers"] == ["10.77.1.12"]


def test_start_record_keeps_what_was_wanted_and_the_running_containers() -> None:
    text = start_record("w", {HEAD: _state("c1"), WORKER: _state("c2", running_=False)}, "2026-01-01T00:00:00+00:00")
    assert json.loads(text) == {"wanted": "w", "containers": {HEAD: "c1"}, "started": "2026-01-01T00:00:00+00:00"}
    # what decide reads back: with both ranks in the record, the next run changes nothing
    first = _decide()
    again = _decide(record={"content": base64.b64encode(start_record(first["wanted"], {
        HEAD: _state("c1"), WORKER: _state("c2")}, "now").encode()).decode()})
    assert (again["restart"], again["why"]) == (False, "unchanged")


@pytest.mark.parametrize("chars, record, expected", [(0, None, False), (500, None, True), (500, "same", False)])
def test_the_warm_up_follows_a_start_with_a_prompt_only(chars: int, record: str | None, expected: bool) -> None:
    first = decide(CONFIG, HEAD, WORKER, {HEAD: _state("c1"), WORKER: _state("c2")}, {}, {"after": "abc"},
                   {"checksum": "e0"}, dict(SETTINGS, warmup_prompt_chars=chars))
    if record:
        kept = _record({"wanted": first["wanted"], "containers": BOTH})
        first = decide(CONFIG, HEAD, WORKER, {HEAD: _state("c1"), WORKER: _state("c2")}, kept, {"after": "abc"},
                       {"checksum": "e0"}, dict(SETTINGS, warmup_prompt_chars=chars))
    assert first["warmup"] is expected
