# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_manifest: hub metadata -> manifest, tree verification, stamps, denylist, sampling conflicts."""
from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARD = b"\x01\x02" * 5000
CONFIG = b'{"architectures": ["X"]}\n'


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def info(**over):
    data = {
        "id": "org/model", "sha": COMMIT,
        "siblings": [
            {"rfilename": "config.json", "size": len(CONFIG), "blobId": blob_id(CONFIG)},
            {"rfilename": "sub/model-00001.safetensors", "size": len(SHARD), "blobId": "x" * 40,
             "lfs": {"sha256": hashlib.sha256(SHARD).hexdigest(), "size": len(SHARD), "pointerSize": 134}},
        ],
    }
    data.update(over)
    return data


@pytest.fixture(name="tree")
def fixture_tree(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_bytes(CONFIG)
    (tmp_path / "sub" / "model-00001.safetensors").write_bytes(SHARD)
    return tmp_path


MANIFEST = mf.manifest_from_model_info(info())


def test_manifest_from_model_info():
    assert MANIFEST.commit == COMMIT
    assert MANIFEST.repo == "org/model"
    assert [f.path for f in MANIFEST.files] == ["config.json", "sub/model-00001.safetensors"]
    lfs = MANIFEST.by_path()["sub/model-00001.safetensors"]
    assert lfs.sha256 == hashlib.sha256(SHARD).hexdigest() and lfs.blob_id is None
    assert MANIFEST.by_path()["config.json"].blob_id == blob_id(CONFIG)
    assert MANIFEST.total_bytes == len(CONFIG) + len(SHARD)
    assert mf.manifest_from_dict(MANIFEST.to_dict()) == MANIFEST


@pytest.mark.parametrize("over, message", [
    ({"sha": "main"}, "no commit sha"),
    ({"siblings": []}, "lists no files"),
    ({"siblings": [{"rfilename": "a.bin"}]}, "has no size"),
    ({"siblings": [{"rfilename": "a.bin", "size": 3, "lfs": {"size": 3}}]}, "no sha256"),
    ({"siblings": [{"rfilename": "../etc/passwd", "size": 3}]}, "leaves the checkpoint directory"),
    ({"siblings": [{"rfilename": "/abs", "size": 3}]}, "leaves the checkpoint directory"),
    ({"siblings": [{"rfilename": ".cache/x", "size": 3}]}, "collides"),
    ({"siblings": [{"rfilename": "a", "size": 1}, {"rfilename": "a", "size": 1}]}, "twice"),
])
def test_manifest_rejects(over, message):
    with pytest.raises(mf.ManifestError, match=message):
        mf.manifest_from_model_info(info(**over))


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, field, path", [
    (None, "good", None),
    (lambda t: (t / "sub" / "model-00001.safetensors").unlink(), "missing", "sub/model-00001.safetensors"),
    (lambda t: (t / "sub" / "model-00001.safetensors").write_bytes(SHARD[:-1]), "wrong_size", "sub/model-00001.safetensors"),
    (lambda t: corrupt(t / "sub" / "model-00001.safetensors"), "wrong_hash", "sub/model-00001.safetensors"),
    (lambda t: corrupt(t / "config.json"), "wrong_hash", "config.json"),
    (lambda t: (t / "stray.bin").write_bytes(b"x"), "extra", "stray.bin"),
])
def test_verify_tree(tree, damage, field, path):
    if damage:
        damage(tree)
    result = mf.verify_tree(str(tree), MANIFEST)
    if field == "good":
        assert result.ok and result.good == ["config.json", "sub/model-00001.safetensors"]
        assert result.extra == [] and result.hashed_bytes == MANIFEST.total_bytes
        return
    assert getattr(result, field) == [path]
    assert result.ok is (field == "extra")   # an extra file does not make the tree bad
    others = {"missing", "wrong_size", "wrong_hash", "extra"} - {field}
    assert all(getattr(result, other) == [] for other in others)


def test_verify_ignores_bookkeeping(tree):
    (tree / ".cache" / "dgxspark").mkdir(parents=True)
    (tree / ".cache" / "dgxspark" / "x.dgxspark-part").write_bytes(b"p")
    mf.write_stamp(str(tree), MANIFEST)
    assert mf.verify_tree(str(tree), MANIFEST).extra == []


def test_stamp_roundtrip_and_quick_check(tree):
    stamp = mf.write_stamp(str(tree), MANIFEST, now=0)
    assert stamp["repo"] == "org/model" and stamp["commit"] == COMMIT
    assert stamp["verified_at"] == "1970-01-01T00:00:00Z"
    assert sorted(stamp["files"]) == ["config.json", "sub/model-00001.safetensors"]
    assert mf.read_stamp(str(tree)) == json.loads((tree / mf.STAMP_NAME).read_text())
    assert mf.stamp_valid(str(tree), MANIFEST) == (True, "stamp matches every file")
    trusted = mf.stamp_trusted(mf.read_stamp(str(tree)), MANIFEST)
    result = mf.verify_tree(str(tree), MANIFEST, trusted)
    assert result.ok and result.hashed_bytes == 0     # quick: nothing hashed


def test_stamp_invalid_after_change(tree):
    mf.write_stamp(str(tree), MANIFEST)
    shard = tree / "sub" / "model-00001.safetensors"
    corrupt(shard)
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    valid, reason = mf.stamp_valid(str(tree), MANIFEST)
    assert not valid and "changed" in reason
    result = mf.verify_tree(str(tree), MANIFEST, mf.stamp_trusted(mf.read_stamp(str(tree)), MANIFEST))
    assert result.wrong_hash == ["sub/model-00001.safetensors"]
    assert result.hashed_bytes == len(SHARD)            # only the changed file was hashed


@pytest.mark.parametrize("stamp, reason", [
    (None, "no stamp"),
    ({"format": 1, "repo": "org/other", "commit": COMMIT, "files": {}}, "stamp is for org/other"),
    ({"format": 1, "repo": "org/model", "commit": "f" * 40, "files": {}}, "stamp is for org/model@fff"),
    ({"format": 1, "repo": "org/model", "commit": COMMIT, "files": {}}, "config.json changed since"),
])
def test_stamp_rejected(tree, stamp, reason):
    if stamp is not None:
        (tree / mf.STAMP_NAME).write_text(json.dumps(stamp))
    valid, why = mf.stamp_valid(str(tree), MANIFEST)
    assert not valid and why.startswith(reason)


def test_unreadable_stamp_is_no_stamp(tree):
    (tree / mf.STAMP_NAME).write_text("{not json")
    assert mf.read_stamp(str(tree)) is None
    assert mf.stamp_trusted(None, MANIFEST) == {}


def test_stamp_for_other_hash_vouches_nothing(tree):
    mf.write_stamp(str(tree), MANIFEST)
    stamp = mf.read_stamp(str(tree))
    stamp["files"]["config.json"]["blob_id"] = "0" * 40
    assert "config.json" not in mf.stamp_trusted(stamp, MANIFEST)


# ---------------------------------------------------------------------------------------- parallel hashing

# Shards of different sizes (largest not first by name) and small non-LFS files: a tree worth a pool.
MANY = {
    "config.json": CONFIG,
    "tokenizer.json": b'{"model": {}}\n' * 50,
    "model-00001-of-00004.safetensors": bytes(range(256)) * 300,
    "model-00002-of-00004.safetensors": b"\x07" * 200_000,
    "model-00003-of-00004.safetensors": bytes(range(255, -1, -1)) * 900,
    "model-00004-of-00004.safetensors": b"\x09\x08" * 40_000,
}
SHARDS = sorted(name for name in MANY if name.endswith(".safetensors"))


def many_info():
    siblings = []
    for name, data in MANY.items():
        if name.endswith(".safetensors"):
            siblings.append({"rfilename": name, "size": len(data),
                             "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}})
        else:
            siblings.append({"rfilename": name, "size": len(data), "blobId": blob_id(data)})
    return {"id": "org/many", "sha": COMMIT, "siblings": siblings}


MANY_MANIFEST = mf.manifest_from_model_info(many_info())


@pytest.fixture(name="many")
def fixture_many(tmp_path):
    for name, data in MANY.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def damage_many(tree):
    """One of each: a missing shard, a short shard, a corrupt shard, a corrupt small file, a stray file."""
    (tree / SHARDS[0]).unlink()
    (tree / SHARDS[1]).write_bytes(MANY[SHARDS[1]][:-1])
    corrupt(tree / SHARDS[2])
    corrupt(tree / "tokenizer.json")
    (tree / "stray.bin").write_bytes(b"x")


@pytest.mark.parametrize("damage, expected", [
    (None, {"ok": True, "good": sorted(MANY), "missing": [], "wrong_size": [], "wrong_hash": [], "extra": [],
            "hashed_bytes": MANY_MANIFEST.total_bytes}),
    (damage_many, {"ok": False, "good": ["config.json", SHARDS[3]], "missing": [SHARDS[0]],
                   "wrong_size": [SHARDS[1]], "wrong_hash": [SHARDS[2], "tokenizer.json"], "extra": ["stray.bin"],
                   "hashed_bytes": sum(len(MANY[n]) for n in ("config.json", "tokenizer.json", SHARDS[2], SHARDS[3]))}),
])
@pytest.mark.parametrize("workers", [1, 4, None])
def test_verify_tree_parallel_same_as_sequential(many, damage, expected, workers):
    if damage:
        damage(many)
    result = mf.verify_tree(str(many), MANY_MANIFEST, workers=workers)
    assert result.to_dict() == expected
    assert result.good == expected["good"] and result.wrong_hash == expected["wrong_hash"]   # manifest order


def test_verify_tree_parallel_keeps_manifest_order_with_trusted(many):
    mf.write_stamp(str(many), MANY_MANIFEST)
    corrupt(many / SHARDS[1])
    st = (many / SHARDS[1]).stat()
    os.utime(many / SHARDS[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    trusted = mf.stamp_trusted(mf.read_stamp(str(many)), MANY_MANIFEST)
    for workers in (1, 4):
        result = mf.verify_tree(str(many), MANY_MANIFEST, trusted, workers=workers)
        assert result.good == sorted(set(MANY) - {SHARDS[1]}) and result.wrong_hash == [SHARDS[1]]
        assert result.hashed_bytes == len(MANY[SHARDS[1]])


def concurrent_sha256(monkeypatch, parties, timeout=10.0):
    """Make every LFS hash wait until `parties` of them run at once (BrokenBarrierError if they never do)."""
    barrier = threading.Barrier(parties, timeout=timeout)
    threads = set()
    real = mf.sha256_file

    def waiting_sha256(path, cancel=None):
        threads.add(threading.current_thread().name)
        barrier.wait()
        return real(path, cancel)

    monkeypatch.setattr(mf, "sha256_file", waiting_sha256)
    return threads


def test_verify_tree_hashes_in_parallel(many, monkeypatch):
    threads = concurrent_sha256(monkeypatch, parties=4)
    assert mf.verify_tree(str(many), MANY_MANIFEST, workers=4).ok
    assert len(threads) == 4 and threading.current_thread().name not in threads


def test_verify_tree_default_workers_follow_the_cpus(many, monkeypatch):
    monkeypatch.setattr(mf, "available_cpus", lambda: 4)
    concurrent_sha256(monkeypatch, parties=4)
    assert mf.verify_tree(str(many), MANY_MANIFEST).ok


def test_barrier_breaks_when_hashing_is_sequential(many, monkeypatch):
    """The check above is real: one file at a time never gets two hashes to the barrier."""
    concurrent_sha256(monkeypatch, parties=2, timeout=0.2)
    with pytest.raises(threading.BrokenBarrierError):
        mf.verify_tree(str(many), MANY_MANIFEST, workers=1)


@pytest.mark.parametrize("workers", [1, 4])
def test_hash_error_is_raised_as_before(many, monkeypatch, workers):
    real = mf.sha256_file
    denied = str(many / SHARDS[2])

    def sha256_or_denied(path, cancel=None):
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path, cancel)

    monkeypatch.setattr(mf, "sha256_file", sha256_or_denied)
    with pytest.raises(PermissionError, match="Permission denied") as info:
        mf.verify_tree(str(many), MANY_MANIFEST, workers=workers)
    assert info.value.filename == denied


def test_hash_error_stops_the_other_files(many, monkeypatch):
    """A failing file cancels the running hashes (they stop at their next chunk) instead of finishing them."""
    denied = str(many / SHARDS[2])          # the largest: it starts first
    running = threading.Event()
    stopped, finished = [], []

    def blocking_sha256(path, cancel=None):
        if path == denied:
            running.wait(10)                # fail only once another hash is under way
            raise PermissionError(13, "Permission denied", path)
        running.set()
        if cancel.wait(10):
            stopped.append(path)
            raise mf.HashCancelledError(path)
        finished.append(path)
        return "never cancelled"

    monkeypatch.setattr(mf, "sha256_file", blocking_sha256)
    with pytest.raises(PermissionError):
        mf.verify_tree(str(many), MANY_MANIFEST, workers=2)
    # the second largest was running when the error came; the freed thread may have taken one more file
    # before the pool was told to stop: that one is stopped too, and nothing runs to its end
    assert str(many / SHARDS[1]) in stopped and finished == []


def test_first_error_by_position_wins(many, monkeypatch):
    """All four files fail together: the error raised is the first file's, whichever thread failed first."""
    together = threading.Barrier(4, timeout=10)

    def always_denied(path, cancel=None):
        together.wait()
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(mf, "sha256_file", always_denied)
    monkeypatch.setattr(mf, "git_blob_id", lambda path, size, cancel=None: always_denied(path))
    checks = [(str(many / name), MANY_MANIFEST.by_path()[name]) for name in SHARDS]
    with pytest.raises(PermissionError) as info:
        mf.files_match(checks, workers=4)
    assert info.value.filename == checks[0][0]


def test_cancelled_digest_stops(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 10)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(mf.HashCancelledError):
        mf.sha256_file(str(tmp_path / "f"), cancel)


@pytest.mark.parametrize("workers", [1, 3])
def test_files_match_verdicts_in_order(many, workers):
    entries = MANY_MANIFEST.by_path()
    corrupt(many / SHARDS[3])
    checks = [(str(many / SHARDS[3]), entries[SHARDS[3]]), (str(many / "gone"), entries[SHARDS[0]]),
              (str(many / SHARDS[0]), entries[SHARDS[1]]), (str(many / "config.json"), entries["config.json"])]
    assert mf.files_match(checks, workers=workers) == ["wrong_hash", "missing", "wrong_size", None]
    assert mf.files_match([], workers=workers) == []


@pytest.mark.parametrize("chunk", [1, 4096, mf.HASH_CHUNK])
def test_digests_over_many_chunks(tmp_path, monkeypatch, chunk):
    data = bytes(range(256)) * 41
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    monkeypatch.setattr(mf, "HASH_CHUNK", chunk)
    assert mf.sha256_file(str(tmp_path / "f")) == hashlib.sha256(data).hexdigest()
    assert mf.git_blob_id(str(tmp_path / "f"), len(data)) == blob_id(data)
    assert mf.sha256_file(str(tmp_path / "empty")) == hashlib.sha256(b"").hexdigest()
    assert mf.git_blob_id(str(tmp_path / "empty"), 0) == blob_id(b"")


@pytest.mark.parametrize("sizes, order", [
    ([], []),
    ([5], [0]),
    ([1, 3, 2], [1, 2, 0]),
    ([2, 7, 2, 7], [1, 3, 0, 2]),
])
def test_largest_first(sizes, order):
    assert mf.largest_first(sizes) == order


def test_available_cpus_prefers_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(mf.os, "sched_getaffinity", lambda pid: {0, 5, 7}, raising=False)
    monkeypatch.setattr(mf.os, "cpu_count", lambda: 64)
    assert mf.available_cpus() == 3
    monkeypatch.delattr(mf.os, "sched_getaffinity")
    assert mf.available_cpus() == 64
    monkeypatch.setattr(mf.os, "cpu_count", lambda: None)
    assert mf.available_cpus() == 1


@pytest.mark.parametrize("workers, jobs, expected", [
    (None, 10, 6),
    (None, 2, 2),
    (4, 10, 4),
    (4, 0, 1),
    (1, 10, 1),
])
def test_hash_workers(monkeypatch, workers, jobs, expected):
    monkeypatch.setattr(mf, "available_cpus", lambda: 6)
    assert mf.hash_workers(workers, jobs) == expected


def test_hash_workers_rejects_zero():
    with pytest.raises(ValueError, match="at least 1"):
        mf.hash_workers(0, 3)


@pytest.mark.parametrize("repo, denied", [
    ("LibertAIDAI/GLM-5.3-Flash-NVFP4", True),
    ("libertaidai/glm-5.3-flash-nvfp4", True),
    ("RedHatAI/GLM-5.3-Flash-NVFP4", False),
])
def test_denylist(repo, denied):
    if denied:
        with pytest.raises(mf.DenylistedRepoError, match="54150"):
            mf.check_denylist(repo)
        assert "54150" in mf.check_denylist(repo, allow=True)
    else:
        assert mf.check_denylist(repo) is None


@pytest.mark.parametrize("gen, intended, expected", [
    ({"temperature": 1.0}, {}, []),
    ({"temperature": 1.0}, {"temperature": 1.0}, []),
    ({"temperature": 1.0}, {"temperature": 0.6}, ["temperature=0.6 in inventory contradicts the checkpoint's temperature=1.0"]),
    ({"temperature": 1.0}, {"top_p": 0.95}, ["top_p=0.95 is set in inventory but the checkpoint's generation_config.json sets no top_p"]),
])
def test_sampling_conflicts(gen, intended, expected):
    assert mf.sampling_conflicts(gen, intended) == expected


def test_sampling_values_keeps_only_sampling_keys():
    assert mf.sampling_values({"temperature": 1.0, "eos_token_id": 3, "top_k": 20}) == {"temperature": 1.0, "top_k": 20}
