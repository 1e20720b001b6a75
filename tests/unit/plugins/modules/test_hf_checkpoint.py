# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""dgxspark.vllm.hf_checkpoint against the lab hub on 127.0.0.1: check mode, download + verify, re-run,
corrupted file re-fetched, dropped connection resumed by the next run, HF-cache layout, verify-only."""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from types import ModuleType

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _hub_stage as hs
from ansible_collections.dgxspark.vllm.plugins.modules import hf_checkpoint
from helpers.module_runner import ModuleFail, run_module

pytest.importorskip("huggingface_hub")
MIB = 1024 * 1024
REPO = "lab/random"
SHARD = "model-00001-of-00002.safetensors"
LAB_HUB = Path(__file__).resolve().parents[4] / "lab" / "hub" / "hub.py"


@pytest.fixture(name="lab_hub", scope="module")
def fixture_lab_hub() -> ModuleType:
    if not LAB_HUB.is_file():
        pytest.skip("needs the lab's hub (lab/hub/hub.py), which only a checkout holds: the built collection "
                    "does not ship the lab")
    from helpers import lab_hub
    return lab_hub


@pytest.fixture(name="repos", scope="module")
def fixture_repos(tmp_path_factory, lab_hub):
    root = tmp_path_factory.mktemp("repos")
    lab_hub.hub.make_random(str(root / "lab" / "random"), shards=2, shard_mib=16, seed=1)
    return root


@pytest.fixture(name="lab")
def fixture_lab(repos, monkeypatch, lab_hub):
    with lab_hub.running_hub(repos, token="tok") as h:
        lab_hub.online_hub_env(monkeypatch, h.url)
        yield h


def args(lab, dest, **over):
    base = {"repo": REPO, "local_dir": str(dest), "endpoint": lab.url, "token": "tok", "min_free_bytes": 0}
    base.update(over)
    return base


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def body_bytes(lab) -> int:
    return lab.stats()["body_bytes"]


def test_check_mode_downloads_nothing(lab, tmp_path):
    result = run_module(hf_checkpoint.main, args(lab, tmp_path / "m"), check_mode=True)
    assert result["changed"] is True and not result["complete"]
    assert len(result["would_download"]) == 5 and result["would_download_bytes"] > 32 * MIB
    assert not (tmp_path / "m").exists()
    assert body_bytes(lab) == 0


def test_download_verify_then_rerun_downloads_nothing(lab, repos, tmp_path):
    dest = tmp_path / "m"
    progress = tmp_path / "progress.json"
    first = run_module(hf_checkpoint.main, args(lab, dest, progress_path=str(progress)))
    assert first["changed"] and first["complete"] and first["verify"]["ok"]
    assert sorted(first["downloaded"]) == sorted(f["path"] for f in first["manifest"]["files"])
    assert first["sampling"] == {"temperature": 1.0}
    for name in os.listdir(repos / "lab" / "random"):
        assert sha(dest / name) == sha(repos / "lab" / "random" / name)
    assert json.loads((dest / ".dgxspark-stamp.json").read_text())["commit"] == first["commit"]
    done = json.loads(progress.read_text())
    assert done["state"] == "done" and done["bytes_done"] == done["bytes_total"] == first["downloaded_bytes"]
    # the line the staging prints while it follows the job (roles/cluster/tasks/follow_job.yml)
    files = len(first["manifest"]["files"])
    assert re.fullmatch(rf"done (\d+\.\d [kMG]B) / \1 \(100\.0 %\) at \d+(\.\d)? [kMG]?B/s, file {files}/{files}( \S+)?",
                        done["summary"]), done["summary"]
    served = body_bytes(lab)
    assert served == first["manifest"]["total_bytes"]          # every byte fetched once
    again = run_module(hf_checkpoint.main, args(lab, dest))
    assert again["changed"] is False and again["downloaded"] == [] and again["stamp_valid_before"]
    assert again["verify"]["hashed_bytes"] == 0
    assert body_bytes(lab) == served                          # nothing downloaded


def test_token_from_a_private_file(lab, tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text("tok\n")
    token_file.chmod(0o600)
    base = {k: v for k, v in args(lab, tmp_path / "m").items() if k != "token"}
    result = run_module(hf_checkpoint.main, dict(base, token_file=str(token_file)))   # the lab hub wants "tok"
    assert result["complete"] and result["downloaded"]


def test_token_file_readable_by_others_is_refused_before_the_hub_is_asked(lab, tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text("tok")
    token_file.chmod(0o644)
    base = {k: v for k, v in args(lab, tmp_path / "m").items() if k != "token"}
    with pytest.raises(ModuleFail, match=rf"token_file: {token_file} has mode 0644: group or others can use it"):
        run_module(hf_checkpoint.main, dict(base, token_file=str(token_file)))
    assert lab.stats()["requests"] == []
    with pytest.raises(ModuleFail, match="parameters are mutually exclusive: token|token_file"):
        run_module(hf_checkpoint.main, dict(base, token="tok", token_file=str(token_file)))


def test_wrong_token_from_the_file_fails_and_is_not_shown(lab, tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text("not-the-lab-token")
    token_file.chmod(0o600)
    base = {k: v for k, v in args(lab, tmp_path / "m").items() if k != "token"}
    with pytest.raises(ModuleFail) as err:
        run_module(hf_checkpoint.main, dict(base, token_file=str(token_file)))
    assert "cannot read lab/random@main" in err.value.result["msg"]
    assert "not-the-lab-token" not in json.dumps(err.value.result)


def test_corrupted_file_is_refetched(lab, tmp_path):
    dest = tmp_path / "m"
    run_module(hf_checkpoint.main, args(lab, dest))
    shard = dest / SHARD
    data = bytearray(shard.read_bytes())
    data[5 * MIB] ^= 0xFF
    shard.write_bytes(bytes(data))
    other_inode = (dest / "model-00002-of-00002.safetensors").stat().st_ino
    lab.reset()
    result = run_module(hf_checkpoint.main, args(lab, dest))
    assert result["changed"] and result["refetched"] == [SHARD] and result["downloaded"] == [SHARD]
    assert result["complete"] and not result["stamp_valid_before"]
    assert body_bytes(lab) == 16 * MIB
    assert (dest / "model-00002-of-00002.safetensors").stat().st_ino == other_inode   # verified file untouched


def test_dropped_connection_resumes_on_next_run(lab, tmp_path, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)   # huggingface_hub's in-run retries wait 1 s each
    dest = tmp_path / "m"
    lab.fault(mode="cut_at", bytes=12 * MIB, match=SHARD, times=-1)
    with pytest.raises(ModuleFail, match="partial file is kept"):
        run_module(hf_checkpoint.main, args(lab, dest))
    part = dest / ".cache" / "dgxspark" / (SHARD + hs.PART_SUFFIX)
    kept = part.stat().st_size
    assert 0 < kept <= 12 * MIB
    lab.clear_fault()
    lab.reset()
    result = run_module(hf_checkpoint.main, args(lab, dest))
    assert result["complete"] and SHARD in result["downloaded"]
    gets = [r for r in lab.stats()["requests"] if r["method"] == "GET" and r["path"].endswith(SHARD)]
    assert gets[0]["range"] == "bytes=%d-" % kept and gets[0]["status"] == 206
    assert not part.exists()


def test_hf_cache_layout(lab, tmp_path):
    cache = tmp_path / "hub"
    result = run_module(hf_checkpoint.main, {"repo": REPO, "layout": "hf_cache", "cache_dir": str(cache),
                                             "endpoint": lab.url, "token": "tok", "min_free_bytes": 0})
    repo_cache = cache / "models--lab--random"
    snap = repo_cache / "snapshots" / result["commit"]
    assert result["complete"] and result["root"] == str(snap)
    assert (snap / SHARD).is_symlink()
    assert os.readlink(snap / SHARD) == "../../blobs/" + next(
        f["sha256"] for f in result["manifest"]["files"] if f["path"] == SHARD)
    assert (repo_cache / "refs" / "main").read_text() == result["commit"]
    assert run_module(hf_checkpoint.main, {"repo": REPO, "layout": "hf_cache", "cache_dir": str(cache),
                                           "endpoint": lab.url, "token": "tok"})["changed"] is False


def test_verify_only_with_given_manifest_needs_no_hub(lab, tmp_path):
    head = run_module(hf_checkpoint.main, args(lab, tmp_path / "head"))
    worker = tmp_path / "worker"
    worker.mkdir()
    (worker / "config.json").write_bytes((tmp_path / "head" / "config.json").read_bytes())
    lab.reset()
    partial = run_module(hf_checkpoint.main, {"repo": REPO, "local_dir": str(worker), "manifest": head["manifest"],
                                              "download": False})
    assert not partial["complete"] and partial["changed"] is False
    assert len(partial["verify"]["missing"]) == 4 and partial["verify"]["good"] == ["config.json"]
    assert lab.stats()["requests"] == []                       # the hub was not asked
    for name in partial["verify"]["missing"]:
        (worker / name).write_bytes((tmp_path / "head" / name).read_bytes())
    done = run_module(hf_checkpoint.main, {"repo": REPO, "local_dir": str(worker), "manifest": head["manifest"],
                                           "download": False})
    assert done["complete"] and done["changed"] and (worker / ".dgxspark-stamp.json").exists()


def test_hf_cache_receiver_copies_blobs_by_copy_paths_then_links_and_stamps(lab, tmp_path):
    """Fan-out in HF-cache layout: the receiver names the blobs to copy; after the copy its verify links
    snapshots/<commit>, writes refs/main and stamps, with no hub access."""
    head = run_module(hf_checkpoint.main, {"repo": REPO, "layout": "hf_cache", "cache_dir": str(tmp_path / "head"),
                                           "endpoint": lab.url, "token": "tok", "min_free_bytes": 0})
    assert head["copy_root"] == str(tmp_path / "head" / "models--lab--random")
    lab.reset()
    receiver = {"repo": REPO, "layout": "hf_cache", "cache_dir": str(tmp_path / "worker"),
                "manifest": head["manifest"], "download": False}
    before = run_module(hf_checkpoint.main, receiver)
    assert not before["complete"] and before["copy_root"] == str(tmp_path / "worker" / "models--lab--random")
    blobs = {"blobs/" + (f["sha256"] or f["blob_id"]) for f in head["manifest"]["files"]}
    assert set(before["copy_paths"]) == blobs and len(blobs) == 5
    for rel in before["copy_paths"]:            # what rsync does in the role, from the head's copy_root
        dest = tmp_path / "worker" / "models--lab--random" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((tmp_path / "head" / "models--lab--random" / rel).read_bytes())
    after = run_module(hf_checkpoint.main, receiver)
    snap = tmp_path / "worker" / "models--lab--random" / "snapshots" / head["commit"]
    assert after["complete"] and after["changed"] and after["copy_paths"] == []
    assert (snap / SHARD).is_symlink() and (snap / ".dgxspark-stamp.json").exists()
    assert (tmp_path / "worker" / "models--lab--random" / "refs" / "main").read_text() == head["commit"]
    assert lab.stats()["requests"] == []                       # the hub was not asked
    again = run_module(hf_checkpoint.main, receiver)
    assert again["complete"] and again["changed"] is False


def test_hf_cache_receiver_names_a_corrupt_blob_for_copy(lab, tmp_path):
    head = run_module(hf_checkpoint.main, {"repo": REPO, "layout": "hf_cache", "cache_dir": str(tmp_path / "head"),
                                           "endpoint": lab.url, "token": "tok", "min_free_bytes": 0})
    src, dst = tmp_path / "head" / "models--lab--random", tmp_path / "worker" / "models--lab--random"
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.copytree(src, dst, symlinks=True)
    (dst / "snapshots" / head["commit"] / ".dgxspark-stamp.json").unlink()
    blob = next(f for f in head["manifest"]["files"] if f["path"] == SHARD)["sha256"]
    data = bytearray((dst / "blobs" / blob).read_bytes())
    data[100] ^= 0xFF
    (dst / "blobs" / blob).write_bytes(bytes(data))
    result = run_module(hf_checkpoint.main, {"repo": REPO, "layout": "hf_cache", "cache_dir": str(tmp_path / "worker"),
                                             "manifest": head["manifest"], "download": False, "verify": "full"})
    assert not result["complete"] and result["verify"]["wrong_hash"] == [SHARD]
    assert result["copy_paths"] == ["blobs/" + blob]


def test_denylisted_repo_refused(tmp_path):
    with pytest.raises(ModuleFail, match="54150"):
        run_module(hf_checkpoint.main, {"repo": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "local_dir": str(tmp_path)})


def test_wrong_token_fails_with_hub_message(lab, tmp_path):
    with pytest.raises(ModuleFail, match="cannot read lab/random@main") as err:
        run_module(hf_checkpoint.main, args(lab, tmp_path / "m", token="wrong"))
    assert "wrong" not in err.value.result["msg"]


def test_missing_library_message(monkeypatch):
    import builtins  # pylint: disable=import-outside-toplevel
    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.startswith("huggingface_hub"):
            raise ImportError("No module named 'huggingface_hub'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(hs.HubLibraryMissingError, match="checkpoint_wheelhouse"):
        hs.import_hub()


def test_progress_summary_reads_as_one_line():
    from ansible_collections.dgxspark.vllm.plugins.module_utils._hub_stage import progress_summary
    data = {"state": "downloading", "bytes_done": 45_500_000_000, "bytes_total": 91_000_000_000,
            "rate_bytes_per_s": 1_200_000_000, "files_done": 3, "files_total": 8, "file": "model-00004.safetensors"}
    assert progress_summary(data) == ("downloading 45.5 GB / 91.0 GB (50.0 %) at 1.2 GB/s, file 3/8 "
                                      "model-00004.safetensors")
    assert progress_summary({"state": "resolving"}) == "resolving 0 B / 0 B (0.0 %) at 0 B/s, file 0/0"


# Issue 39: the tree is root's. A planted folder or symlink is refused before the hub is asked, or removed itself;
# nothing is written or removed through a symlink.

def test_the_model_folder_is_created_0755(lab, tmp_path):
    dest = tmp_path / "models" / "m"
    result = run_module(hf_checkpoint.main, args(lab, dest))
    assert result["complete"]
    assert stat.S_IMODE((tmp_path / "models").stat().st_mode) == 0o755 and stat.S_IMODE(dest.stat().st_mode) == 0o755


def test_a_model_folder_open_to_others_is_refused_before_the_hub_is_asked(lab, tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    dest.chmod(0o777)
    with pytest.raises(ModuleFail, match=re.escape(
            f"refusing the model folder {dest} (dgxspark_vllm_model_path): {dest} has mode 0777 (writable by the "
            f"group or others)")):
        run_module(hf_checkpoint.main, args(lab, dest, folder_variable="dgxspark_vllm_model_path"))
    assert lab.stats()["requests"] == [] and list(dest.iterdir()) == []
    with pytest.raises(ModuleFail, match=f"{dest} has mode 0777"):     # check mode refuses too
        run_module(hf_checkpoint.main, args(lab, dest), check_mode=True)


def test_a_symlinked_model_folder_is_refused_and_nothing_is_written_through_it(lab, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "m").symlink_to(elsewhere)
    with pytest.raises(ModuleFail, match=re.escape(f"{tmp_path / 'm'} is a symlink (to {elsewhere})")):
        run_module(hf_checkpoint.main, args(lab, tmp_path / "m"))
    assert list(elsewhere.iterdir()) == [] and lab.stats()["requests"] == []


def test_an_unknown_trusted_owner_is_refused(lab, tmp_path):
    with pytest.raises(ModuleFail, match="trusted_owners: no account no-such-user-39 on this node"):
        run_module(hf_checkpoint.main, args(lab, tmp_path / "m", trusted_owners=["no-such-user-39"]))


def test_a_planted_symlink_in_place_of_a_file_is_removed_not_its_target(lab, tmp_path):
    """The old code removed os.path.realpath(file): a symlink config.json -> a root file deleted that file."""
    dest = tmp_path / "m"
    run_module(hf_checkpoint.main, args(lab, dest))
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    (dest / "config.json").unlink()
    (dest / "config.json").symlink_to(victim)
    result = run_module(hf_checkpoint.main, args(lab, dest, verify="full"))
    assert result["complete"] and result["refetched"] == ["config.json"]
    assert victim.read_text() == "root's file\n"
    assert not (dest / "config.json").is_symlink()


def test_a_planted_symlink_as_the_partial_file_is_refused_and_not_written_through(lab, tmp_path):
    """The old code opened the partial file with open(part, "ab"): a symlink there appended the download to its
    target (a short file was even resumed: the first bytes were skipped)."""
    dest = tmp_path / "m"
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    part = dest / ".cache" / "dgxspark" / (SHARD + hs.PART_SUFFIX)
    part.parent.mkdir(parents=True)
    part.symlink_to(victim)
    with pytest.raises(ModuleFail, match=re.escape(f"{part} is not a regular file (a symlink or something else)")):
        run_module(hf_checkpoint.main, args(lab, dest))
    assert victim.read_text() == "root's file\n"


def test_a_planted_symlinked_cache_folder_inside_the_tree_is_not_walked_through(lab, tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / ".cache").symlink_to(elsewhere)
    with pytest.raises(ModuleFail, match=re.escape(f"{dest / '.cache'} is a symlink or not a folder: refusing")):
        run_module(hf_checkpoint.main, args(lab, dest))
    assert list(elsewhere.iterdir()) == []


def test_hf_cache_a_planted_snapshot_link_to_a_root_file_leaves_the_file(lab, tmp_path):
    cache = tmp_path / "hub"
    base = {"repo": REPO, "layout": "hf_cache", "cache_dir": str(cache), "endpoint": lab.url, "token": "tok",
            "min_free_bytes": 0}
    first = run_module(hf_checkpoint.main, base)
    snap = cache / "models--lab--random" / "snapshots" / first["commit"]
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(victim)
    result = run_module(hf_checkpoint.main, dict(base, verify="full"))
    assert result["complete"] and victim.read_text() == "root's file\n"
    assert os.readlink(snap / "config.json").startswith("../../blobs/")


@pytest.fixture(name="two_commits")
def fixture_two_commits(tmp_path, monkeypatch, lab_hub):
    """A hub whose repo lab/two has two commits: main, and one with a changed file (two@r2)."""
    root = tmp_path / "repos"
    lab_hub.hub.make_random(str(root / "lab" / "two"), shards=1, shard_mib=1, seed=3)
    lab_hub.hub.make_random(str(root / "lab" / "two@r2"), shards=1, shard_mib=1, seed=3)
    (root / "lab" / "two@r2" / "generation_config.json").write_text('{"temperature": 0.5}\n')
    with lab_hub.running_hub(root) as h:
        lab_hub.online_hub_env(monkeypatch, h.url)
        yield h, h.call("GET", "/_lab/commits")["lab/two"]


def test_keep_commits_parks_the_old_commit_and_brings_it_back_without_a_download(two_commits, tmp_path):
    lab, commits = two_commits
    dest = tmp_path / "models" / "two"
    store = tmp_path / "models" / "two.commits"
    base = {"repo": "lab/two", "local_dir": str(dest), "endpoint": lab.url, "min_free_bytes": 0,
            "keep_commits": True}
    first = run_module(hf_checkpoint.main, dict(base, revision="main"))
    assert first["complete"] and first["commit"] == commits["main"] and first["store"]["park"] is None
    second = run_module(hf_checkpoint.main, dict(base, revision=commits["r2"]))
    assert second["complete"] and second["store"]["park"] == commits["main"]
    assert json.loads((dest / ".dgxspark-stamp.json").read_text())["commit"] == commits["r2"]
    assert json.loads((store / commits["main"] / ".dgxspark-stamp.json").read_text())["commit"] == commits["main"]
    lab.call("POST", "/_lab/reset")
    checked = run_module(hf_checkpoint.main, dict(base, revision=commits["main"]), check_mode=True)
    assert checked["complete"] and checked["would_download"] == [] and checked["store"]["unpark"] == commits["main"]
    assert json.loads((dest / ".dgxspark-stamp.json").read_text())["commit"] == commits["r2"]   # nothing moved
    back = run_module(hf_checkpoint.main, dict(base, revision=commits["main"]))
    assert back["changed"] and back["complete"] and back["downloaded"] == []
    assert back["store"] == dict(back["store"], park=commits["r2"], unpark=commits["main"])
    assert body_bytes(lab) == 0
    assert json.loads((dest / ".dgxspark-stamp.json").read_text())["commit"] == commits["main"]
    assert sorted(os.listdir(store)) == [commits["r2"]]
    again = run_module(hf_checkpoint.main, dict(base, revision="main"))
    assert not again["changed"] and again["store"]["selected"]


def test_without_keep_commits_a_new_commit_is_staged_over_the_tree(two_commits, tmp_path):
    lab, commits = two_commits
    dest = tmp_path / "two"
    base = {"repo": "lab/two", "local_dir": str(dest), "endpoint": lab.url, "min_free_bytes": 0}
    run_module(hf_checkpoint.main, dict(base, revision="main"))
    second = run_module(hf_checkpoint.main, dict(base, revision=commits["r2"]))
    assert second["complete"] and second["store"] == {} and not (tmp_path / "two.commits").exists()


def test_keep_commits_refuses_a_store_that_is_a_symlink(two_commits, tmp_path):
    lab, commits = two_commits
    dest = tmp_path / "two"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "two.commits").symlink_to(tmp_path / "elsewhere")
    base = {"repo": "lab/two", "local_dir": str(dest), "endpoint": lab.url, "min_free_bytes": 0,
            "keep_commits": True}
    with pytest.raises(ModuleFail, match="two.commits is not a folder"):
        run_module(hf_checkpoint.main, dict(base, revision=commits["r2"]))
    assert os.listdir(tmp_path / "elsewhere") == [] and body_bytes(lab) == 0
