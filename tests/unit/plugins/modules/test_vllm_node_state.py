# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the vllm_node_state module: files read for real, docker answered by a fake run_command."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.module_utils import basic

from ansible_collections.dgxspark.vllm.plugins.modules import vllm_node_state
from helpers.module_runner import ModuleFail, run_module


def _run(args: dict[str, Any], answers: dict[str, tuple[int, str, str]], bins: dict[str, str | None],
         check_mode: bool = False) -> dict[str, Any]:
    def run_command(_self: Any, argv: Sequence[str], **_kwargs: Any) -> tuple[int, str, str]:
        for key, answer in answers.items():
            if key in " ".join(argv):
                return answer
        raise AssertionError("unexpected %r" % (argv,))

    with mock.patch.object(basic.AnsibleModule, "run_command", run_command), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", side_effect=lambda name, *a, **k: bins.get(name)):
        return run_module(vllm_node_state.main, args, check_mode=check_mode)


RUNNING = [{"Id": "c1", "State": {"Running": True, "ExitCode": 0},
            "Config": {"Labels": {"dgxspark.vllm.config_hash": "h1"}}}]
ANSWERS = {"container inspect": (0, json.dumps(RUNNING), ""), "image inspect": (0, "sha256:2222\n", "")}


@pytest.mark.parametrize("check_mode", [False, True])
def test_reads_stamp_and_lock_from_the_node(tmp_path: Path, check_mode: bool) -> None:
    stamp = tmp_path / ".dgxspark-stamp.json"
    stamp.write_text(json.dumps({"repo": "r", "commit": "b" * 40}))
    lock = tmp_path / "staging.lock"
    lock.write_text("")
    result = _run({"container": "vllm_glm53", "image": "img", "stamp_path": str(stamp), "lock_path": str(lock)},
                  ANSWERS, {"docker": "/usr/bin/docker", "nvidia-smi": None}, check_mode=check_mode)
    assert result["changed"] is False
    assert result["container"]["config_hash"] == "h1" and result["image_id"] == "sha256:2222"
    assert result["stamp"] == {"repo": "r", "commit": "b" * 40}
    assert result["staging_lock"] is True
    assert result["gpu"] is None


def test_absent_stamp_and_lock(tmp_path: Path) -> None:
    result = _run({"container": "vllm_glm53", "stamp_path": str(tmp_path / "none.json"),
                   "lock_path": str(tmp_path / "none.lock"), "gpu": False},
                  ANSWERS, {"docker": "/usr/bin/docker"})
    assert result["stamp"] is None and result["staging_lock"] is False and result["image_id"] is None


def test_reads_the_commits_staged_in_the_hub_cache(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    model = hub / "models--org--model"
    (model / "refs").mkdir(parents=True)
    (model / "refs" / "main").write_text("c" * 40 + "\n")
    (model / "snapshots" / ("c" * 40)).mkdir(parents=True)
    (model / "snapshots" / ("c" * 40) / ".dgxspark-stamp.json").write_text("{}")
    (hub / "models--org--pinned" / "snapshots" / ("d" * 40)).mkdir(parents=True)   # no stamp: not verified
    repos = [{"repo": "org/model", "revision": "main"}, {"repo": "org/pinned", "revision": "d" * 40},
             {"repo": "org/absent", "revision": "main"}, {"repo": "", "revision": "main"}]
    result = _run({"hf_staged": {"hub_dir": str(hub), "repos": repos}, "gpu": False}, {}, {"docker": None})
    assert [(item["repo"], item["commit"], item["staged"]) for item in result["hf_staged"]] == [
        ("org/model", "c" * 40, True), ("org/pinned", "d" * 40, False), ("org/absent", None, False)]
    assert result["hf_staged"][0]["stamp_path"] == str(model / "snapshots" / ("c" * 40) / ".dgxspark-stamp.json")
    assert _run({"gpu": False}, {}, {"docker": None})["hf_staged"] == []


def test_without_the_docker_cli_it_says_so() -> None:
    with pytest.raises(ModuleFail, match="docker CLI is not installed"):
        _run({"container": "vllm_glm53"}, ANSWERS, {})


FIXTURES = Path(__file__).parent.parent.parent.parent / "fixtures" / "sysfs"
IP_ANSWER = (0, json.dumps([{"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.77.0.11"}]},
                            {"ifname": "enp1s0f1np1", "addr_info": [{"family": "inet", "local": "10.77.1.11"}]}]), "")


def test_finds_the_cx7_port_by_its_ip_and_reads_its_rdma_facts_from_the_tree() -> None:
    result = _run({"cx7_ip": "10.77.1.11", "rdma": True, "sysfs_root": str(FIXTURES / "lab_head"),
                   "container": "vllm_glm53", "gpu": False},
                  dict(ANSWERS, **{"addr show": IP_ANSWER}), {"docker": "/usr/bin/docker", "ip": "/usr/sbin/ip"})
    assert result["cx7_iface"] == "enp1s0f1np1"
    assert result["rdma"]["ok"] is True
    assert (result["rdma"]["gid_index"], result["rdma"]["ib_hca"]) == (3, "rocep1s0f1,roceP2p1s0f1")
    assert result["container"]["config_hash"] == "h1"


def test_a_named_cx7_interface_is_taken_as_given_without_asking_ip() -> None:
    result = _run({"cx7_ip": "10.77.1.11", "cx7_iface": "enp9s0", "gpu": False}, {}, {})
    assert result["cx7_iface"] == "enp9s0" and result["rdma"] is None and result["container"] is None


def test_no_interface_with_the_cx7_ip_fails_with_the_interfaces_and_the_fix() -> None:
    with pytest.raises(ModuleFail, match=r"10\.77\.1\.99 .*eth0 10\.77\.0\.11.*dgxspark_vllm_cx7_iface") as exc:
        _run({"cx7_ip": "10.77.1.99", "gpu": False}, {"addr show": IP_ANSWER}, {"ip": "/usr/sbin/ip"})
    assert exc.value.result["ipv4_interfaces"]["enp1s0f1np1"] == ["10.77.1.11"]


def test_without_iproute2_it_says_to_install_it_or_name_the_interface() -> None:
    with pytest.raises(ModuleFail, match="iproute2.*dgxspark_vllm_cx7_iface"):
        _run({"cx7_ip": "10.77.1.11", "gpu": False}, {}, {})


def test_an_unreadable_sysfs_tree_is_reported_in_rdma_not_as_a_failure(tmp_path: Path) -> None:
    result = _run({"cx7_ip": "10.77.1.11", "cx7_iface": "enp1s0f1np1", "rdma": True,
                   "sysfs_root": str(tmp_path / "absent"), "gpu": False}, {}, {})
    assert result["rdma"]["ok"] is False and "absent" in result["rdma"]["msg"]


def test_rdma_needs_the_cx7_ip() -> None:
    with pytest.raises(ModuleFail, match="cx7_ip"):
        _run({"rdma": True, "gpu": False}, {}, {})


@pytest.mark.parametrize("check_mode", [False, True])
def test_trusted_folders_name_each_unsafe_folder(tmp_path: Path, check_mode: bool) -> None:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o777)
    folders = {"dgxspark_vllm_model_path": str(model), "dgxspark_vllm_cache_path": str(tmp_path / "cache" / "c")}
    result = _run({"gpu": False, "trusted_folders": folders}, ANSWERS, {}, check_mode=check_mode)
    assert result["folders"] == [
        f"refusing the cache folder (HF_HOME of the root serve container) {tmp_path}/cache/c (dgxspark_vllm_cache_path): "
        f"{tmp_path}/cache has mode 0777 (writable by the group or others): they can replace what root downloads and "
        f"serves below it. Fix: sudo chmod go-w {tmp_path}/cache (after checking that nothing below it was changed by "
        "others), or set dgxspark_vllm_cache_path to a folder whose every level is root's and not writable by others; "
        "then run again"]
    (tmp_path / "cache").chmod(0o755)
    assert _run({"gpu": False, "trusted_folders": folders}, ANSWERS, {})["folders"] == []
    assert _run({"gpu": False}, ANSWERS, {})["folders"] is None


def test_the_image_record_and_repo_digests_are_read_when_asked(tmp_path: Path) -> None:
    digest = "sha256:" + "1" * 64
    record = {"format": 1, "image": "vllm-node:v1", "reference": "vllm-node@" + digest, "digest": digest,
              "source": "head", "image_id": "sha256:2222"}
    (tmp_path / "image.json").write_text(json.dumps(record))
    answers = {"container inspect": (0, json.dumps(RUNNING), ""),
               "{{json .RepoDigests}}": (0, json.dumps(["vllm-node@" + digest]) + "\n", ""),
               "image inspect": (0, "sha256:2222\n", "")}
    args = {"gpu": False, "container": "c", "image": "vllm-node:v1", "image_record_path": str(tmp_path / "image.json")}
    result = _run(args, answers, {"docker": "/usr/bin/docker"})
    assert result["image_record"] == record and result["image_repo_digests"] == ["vllm-node@" + digest]
    # no record on the node: the repo digests alone; not asked: neither
    result = _run(dict(args, image_record_path=str(tmp_path / "absent.json")), answers, {"docker": "/usr/bin/docker"})
    assert result["image_record"] is None and result["image_repo_digests"] == ["vllm-node@" + digest]
    result = _run({"gpu": False, "container": "c", "image": "vllm-node:v1"}, answers, {"docker": "/usr/bin/docker"})
    assert result["image_record"] is None and result["image_repo_digests"] is None
