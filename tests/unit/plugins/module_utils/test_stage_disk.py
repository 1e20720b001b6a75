# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""_stage_disk: the disk an upgrade's staging needs next to the known-good, refused before anything is pulled."""
from __future__ import annotations

import json

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils import _stage_disk as sd

GB = 10 ** 9
A = "a" * 40


def entry(arch, layers, key="SchemaV2Manifest"):
    return {"Ref": "ghcr.io/org/img:v2", "Descriptor": {"platform": {"architecture": arch, "os": "linux"}},
            key: {"config": {"size": 10}, "layers": [{"size": size} for size in layers]}}


@pytest.mark.parametrize("text, arch, expected", [
    (json.dumps([entry("amd64", [100, 200]), entry("arm64", [1000, 2000])]), "aarch64", 3010),
    (json.dumps([entry("amd64", [100, 200]), entry("arm64", [1000, 2000])]), "x86_64", 310),
    (json.dumps(entry("arm64", [5], key="OCIManifest")), "aarch64", 15),
    # a single manifest without a platform is the node's
    (json.dumps({"Descriptor": {}, "SchemaV2Manifest": {"layers": [{"size": 7}]}}), "aarch64", 7),
    (json.dumps([entry("amd64", [1])]), "aarch64", None),
    ("not json", "aarch64", None),
])
def test_image_bytes(text, arch, expected):
    assert sd.image_bytes(text, arch) == expected


def test_checkpoint_bytes_counts_every_file():
    info = {"sha": A, "siblings": [{"rfilename": "m.safetensors", "size": 5, "lfs": {"size": 5 * GB}},
                                   {"rfilename": "config.json", "size": 100}]}
    assert sd.checkpoint_bytes(info) == (A, 5 * GB + 100)
    with pytest.raises(sd.DiskError, match="names no commit"):
        sd.checkpoint_bytes({"siblings": []})


def node(image_present=False, image=9 * GB, ckpt=100 * GB, ckpt_staged=False, model_avail=200 * GB,
         docker_avail=200 * GB, same_fs=False):
    return {"image": {"ref": "ghcr.io/org/img:v2", "present": image_present, "bytes": image},
            "checkpoint": {"repo": "org/m", "commit": A, "bytes": ckpt, "staged": ckpt_staged},
            "model_fs": {"source": "/dev/nvme0n1p2", "avail": model_avail, "target": "/"},
            "docker_fs": {"source": "/dev/nvme0n1p2" if same_fs else "/dev/nvme1n1",
                          "avail": docker_avail, "target": "/" if same_fs else "/var/lib/docker"}}


def test_room_for_both_passes_and_says_what_is_staged():
    out = sd.plan({"spark-a": node(), "spark-b": node(image_present=True, ckpt_staged=True)}, margin=GB)
    assert out["lines"][0].startswith("spark-a: image ghcr.io/org/img:v2 9.0 GB")
    assert out["lines"][1] == "spark-b: nothing to stage (both already held)"


def test_one_filesystem_for_both_adds_them():
    sd.plan({"spark-a": node(same_fs=True, model_avail=109 * GB, docker_avail=109 * GB)})
    with pytest.raises(sd.DiskError) as err:
        sd.plan({"spark-a": node(same_fs=True, model_avail=108 * GB, docker_avail=108 * GB)})
    assert "spark-a needs 109000000000 bytes (109.0 GB) on / for the checkpoint and the image" in str(err.value)
    assert "108000000000 bytes (108.0 GB) free" in str(err.value)
    assert "nothing was stopped, pulled or downloaded" in str(err.value)


def test_the_margin_counts_with_a_download_only():
    with pytest.raises(sd.DiskError, match="plus a margin of 10"):
        sd.plan({"spark-a": node(model_avail=100 * GB + 5)}, margin=10)
    sd.plan({"spark-a": node(model_avail=5, ckpt_staged=True)}, margin=10)


def test_every_node_short_of_room_is_named():
    with pytest.raises(sd.DiskError) as err:
        sd.plan({"spark-a": node(docker_avail=GB), "spark-b": node(model_avail=GB), "spark-c": node()})
    text = str(err.value)
    assert "spark-a needs 9000000000 bytes (9.0 GB) on /var/lib/docker for the image" in text
    assert "spark-b needs 100000000000 bytes (100.0 GB) on / for the checkpoint" in text
    assert "spark-c" not in text


def test_an_image_size_the_registry_did_not_give_is_said():
    out = sd.plan({"spark-a": node(image=None)})
    assert "the registry's manifest of ghcr.io/org/img:v2 gave no size" in out["msg"]


@pytest.mark.parametrize("text, expected", [
    ("Filesystem        Avail Mounted on\n/dev/nvme0n1p2 123456 /\n", {"source": "/dev/nvme0n1p2", "avail": 123456,
                                                                       "target": "/"}),
    ("Filesystem Avail Mounted on\noverlay 5 /var/lib/my docker\n", {"source": "overlay", "avail": 5,
                                                                     "target": "/var/lib/my docker"}),
])
def test_parse_df(text, expected):
    assert sd.parse_df(text) == expected


@pytest.mark.parametrize("text", ["", "Filesystem Avail Mounted on\n", "F A M\n/dev/x many /\n"])
def test_parse_df_refuses(text):
    with pytest.raises(sd.DiskError):
        sd.parse_df(text)


def test_staged_means_selected_or_parked():
    assert sd.staged(A, {"commit": A}, {}) and sd.staged(A, {}, {A: {}}) and not sd.staged(A, {"commit": "b"}, [])
    assert not sd.staged("", {"commit": ""}, [])
