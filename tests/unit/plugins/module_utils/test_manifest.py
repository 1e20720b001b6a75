# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_manifest: hub metadata -> manifest, tree verification, stamps, denylist, sampling conflicts."""
from __future__ import annotations

import hashlib
import json
import os

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
