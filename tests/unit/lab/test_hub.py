# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab hub (lab/hub/hub.py) against the real huggingface_hub client, on 127.0.0.1 only."""
from __future__ import annotations

import hashlib

import pytest

from helpers.lab_hub import hub, online_hub_env, running_hub

huggingface_hub = pytest.importorskip("huggingface_hub")
MIB = 1024 * 1024


@pytest.fixture(name="repos", scope="module")
def fixture_repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    hub.make_random(str(root / "lab" / "random"), shards=2, shard_mib=16, seed=7)
    (root / "lab" / "small").mkdir(parents=True)
    (root / "lab" / "small" / "config.json").write_text('{"a": 1}\n')
    (root / "lab" / "small" / "nested").mkdir()
    (root / "lab" / "small" / "nested" / "w.bin").write_bytes(b"w" * 1000)
    return root


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_make_random_is_deterministic(tmp_path):
    hub.make_random(str(tmp_path / "a"), 1, 1, 3)
    hub.make_random(str(tmp_path / "b"), 1, 1, 3)
    hub.make_random(str(tmp_path / "c"), 1, 1, 4)
    name = "model-00001-of-00001.safetensors"
    assert sha(tmp_path / "a" / name) == sha(tmp_path / "b" / name) != sha(tmp_path / "c" / name)


def test_model_info_with_files_metadata(repos, monkeypatch):
    with running_hub(repos) as h:
        online_hub_env(monkeypatch, h.url)
        info = huggingface_hub.HfApi(endpoint=h.url).model_info("lab/random", files_metadata=True)
        assert len(info.sha) == 40
        shards = {s.rfilename: s for s in info.siblings if s.rfilename.endswith(".safetensors")}
        assert len(shards) == 2
        shard = repos / "lab" / "random" / "model-00001-of-00002.safetensors"
        assert shards[shard.name].size == 16 * MIB
        assert shards[shard.name].lfs.sha256 == sha(shard)
        same = huggingface_hub.HfApi(endpoint=h.url).model_info("lab/random", revision=info.sha)
        assert same.sha == info.sha
        with pytest.raises(huggingface_hub.errors.RevisionNotFoundError):
            huggingface_hub.HfApi(endpoint=h.url).model_info("lab/random", revision="nope")
        with pytest.raises(huggingface_hub.errors.RepositoryNotFoundError):
            huggingface_hub.HfApi(endpoint=h.url).model_info("lab/absent")


def test_snapshot_download_local_dir(repos, tmp_path, monkeypatch):
    with running_hub(repos) as h:
        online_hub_env(monkeypatch, h.url)
        out = huggingface_hub.snapshot_download("lab/small", local_dir=tmp_path / "small", endpoint=h.url)
    assert (tmp_path / "small" / "config.json").read_text() == '{"a": 1}\n'
    assert (tmp_path / "small" / "nested" / "w.bin").read_bytes() == b"w" * 1000
    assert str(out) == str(tmp_path / "small")


def test_hf_hub_download_resumes_after_a_dropped_connection(repos, tmp_path, monkeypatch):
    name = "model-00002-of-00002.safetensors"
    with running_hub(repos) as h:
        online_hub_env(monkeypatch, h.url)
        # huggingface_hub writes in 10 MiB chunks: cut at 12 MiB so that 10 MiB reached the disk first
        h.fault(mode="drop_after", bytes=12 * MIB, match=name, times=1)
        path = huggingface_hub.hf_hub_download("lab/random", name, cache_dir=tmp_path / "cache", endpoint=h.url)
        gets = [r for r in h.stats()["requests"] if r["method"] == "GET" and r["path"].endswith(name)]
    assert sha(tmp_path / "cache" / path) == sha(repos / "lab" / "random" / name)
    assert gets[0]["cut"] and gets[0]["sent"] == 12 * MIB
    assert gets[1]["status"] == 206 and gets[1]["range"] == "bytes=%d-" % (10 * MIB)
    assert not gets[1]["cut"] and gets[1]["sent"] == 6 * MIB


def test_resolve_headers_and_ranges(repos):
    import urllib.request  # pylint: disable=import-outside-toplevel
    with running_hub(repos) as h:
        commit = h.call("GET", "/_lab/repos")["lab/random"]
        url = h.url + "/lab/random/resolve/main/model-00001-of-00002.safetensors"
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as resp:  # noqa: S310
            assert resp.headers["X-Repo-Commit"] == commit
            assert resp.headers["X-Linked-Size"] == str(16 * MIB)
            assert resp.headers["X-Linked-Etag"].strip('"') == sha(repos / "lab" / "random" / "model-00001-of-00002.safetensors")
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=10-19"})) as resp:  # noqa: S310
            assert resp.status == 206 and resp.headers["Content-Range"] == "bytes 10-19/%d" % (16 * MIB)
            assert resp.read() == (repos / "lab" / "random" / "model-00001-of-00002.safetensors").read_bytes()[10:20]


def test_token_required(repos, monkeypatch):
    with running_hub(repos, token="sekrit") as h:
        online_hub_env(monkeypatch, h.url)
        with pytest.raises(huggingface_hub.errors.RepositoryNotFoundError):
            huggingface_hub.HfApi(endpoint=h.url, token=False).model_info("lab/small")
        assert huggingface_hub.HfApi(endpoint=h.url, token="sekrit").model_info("lab/small").id == "lab/small"


def test_a_second_commit_of_a_repo(tmp_path, monkeypatch):
    """A folder <name>@<label> is another commit of <name>: served under its id, `main` stays the plain folder's."""
    (tmp_path / "lab" / "two").mkdir(parents=True)
    (tmp_path / "lab" / "two" / "config.json").write_text('{"a": 1}\n')
    (tmp_path / "lab" / "two@r2").mkdir()
    (tmp_path / "lab" / "two@r2" / "config.json").write_text('{"a": 2}\n')
    with running_hub(tmp_path) as h:
        online_hub_env(monkeypatch, h.url)
        labels = h.call("GET", "/_lab/commits")["lab/two"]
        assert set(labels) == {"main", "r2"} and labels["main"] != labels["r2"]
        assert "lab/two@r2" not in h.call("GET", "/_lab/repos")
        api = huggingface_hub.HfApi(endpoint=h.url)
        assert api.model_info("lab/two").sha == labels["main"]
        assert api.model_info("lab/two", revision=labels["r2"]).sha == labels["r2"]
        for label, text in (("main", '{"a": 1}\n'), ("r2", '{"a": 2}\n')):
            path = huggingface_hub.hf_hub_download("lab/two", "config.json", revision=labels[label],
                                                   local_dir=tmp_path / "out" / label, endpoint=h.url)
            assert open(path, encoding="utf-8").read() == text
