# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pins: the image by its digest, the model by its commit (plugins/module_utils/_pins.py)."""
from __future__ import annotations

import json

import pytest

from ansible_collections.dgxspark.vllm.plugins.module_utils._pins import (
    PinError,
    digest_reference,
    image_record,
    is_commit,
    launch_image,
    parse_image_record,
    repo_digests_for,
    split_image,
    staging_pin,
    unpinned,
)

IMAGE = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
REPO = "ghcr.io/tonyd2wild/vllm-glm53-flash"
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _name(key: str) -> str:
    return f"dgxspark_vllm_{key}"


@pytest.mark.parametrize(("image", "expected"), [
    (IMAGE, (REPO, "sm121-v8", "")),
    (f"{REPO}@{D1}", (REPO, "", D1)),
    (f"{IMAGE}@{D1}", (REPO, "sm121-v8", D1)),
    ("registry:5000/org/repo", ("registry:5000/org/repo", "", "")),
    ("registry:5000/org/repo:v1", ("registry:5000/org/repo", "v1", "")),
    ("vllm-node:latest", ("vllm-node", "latest", "")),
])
def test_split_image(image, expected) -> None:
    ref = split_image(image)
    assert (ref.name, ref.tag, ref.digest) == expected


@pytest.mark.parametrize(("image", "digests", "expected"), [
    (IMAGE, [f"{REPO}@{D1}"], [D1]),
    (IMAGE, [f"ghcr.io/other/repo@{D2}", f"{REPO}@{D1}"], [D1]),        # another repository's digest is not ours
    ("ubuntu:24.04", [f"ubuntu@{D1}"], [D1]),                            # Docker Hub's short names compare equal
    ("docker.io/library/ubuntu:24.04", [f"ubuntu@{D1}"], [D1]),
    (IMAGE, [], []),
    (IMAGE, [f"{REPO}@sha256:short", "garbage"], []),
])
def test_repo_digests_for(image, digests, expected) -> None:
    assert repo_digests_for(image, digests) == expected


def test_a_tag_and_a_branch_are_named_with_their_fix() -> None:
    found = unpinned({"image": IMAGE, "model_repo": "RedHatAI/GLM-5.3-Flash-NVFP4", "model_revision": "main",
                      "drafter_repo": ""}, _name)
    assert [key for key, _text in found] == ["image", "model_revision"]
    assert "dgxspark_vllm_image" in found[0][1] and f"{REPO}@sha256:<digest>" in found[0][1]
    assert "dgxspark_vllm_model_revision 'main'" in found[1][1] and "40-hex commit" in found[1][1]


def test_a_digest_and_a_commit_are_pinned() -> None:
    assert unpinned({"image": f"{REPO}@{D1}", "model_repo": "org/m", "model_revision": COMMIT,
                     "drafter_repo": "org/d", "drafter_revision": COMMIT}, _name) == []


def test_image_digest_pins_the_tag_and_the_drafter_revision_is_checked() -> None:
    found = unpinned({"image": IMAGE, "model_repo": "org/m", "model_revision": COMMIT, "drafter_repo": "org/d",
                      "drafter_revision": "v1"}, _name, image_digest=D1)
    assert len(found) == 1 and "dgxspark_vllm_drafter_revision 'v1' of org/d" in found[0][1]


@pytest.mark.parametrize(("value", "expected"), [(COMMIT, True), ("main", False), (COMMIT.upper(), False),
                                                 (COMMIT[:39], False), (None, False)])
def test_is_commit(value, expected) -> None:
    assert is_commit(value) is expected


@pytest.mark.parametrize(("image", "image_digest", "head", "reference", "source"), [
    (f"{REPO}@{D1}", "", [], f"{REPO}@{D1}", "configured"),
    (f"{IMAGE}@{D1}", "", [f"{REPO}@{D2}"], f"{REPO}@{D1}", "configured"),   # a configured digest wins
    (IMAGE, D2, [f"{REPO}@{D1}"], f"{REPO}@{D2}", "image_digest"),
    (IMAGE, "", [f"{REPO}@{D1}"], f"{REPO}@{D1}", "head"),                  # the head's pull resolved the tag
    (IMAGE, "", [], IMAGE, "none"),                                          # a local build keeps its tag
])
def test_staging_pin(image, image_digest, head, reference, source) -> None:
    pin = staging_pin(image, image_digest, head, "spark-a")
    assert (pin.reference, pin.source) == (reference, source)
    if source == "head":
        assert f"dgxspark_vllm_image: {REPO}@{D1}" in pin.message


@pytest.mark.parametrize(("image", "image_digest", "head"), [
    (IMAGE, "sha256:nothex", []),
    (IMAGE, "", [f"{REPO}@{D1}", f"{REPO}@{D2}"]),
])
def test_staging_pin_refuses(image, image_digest, head) -> None:
    with pytest.raises(PinError):
        staging_pin(image, image_digest, head)


def test_a_record_round_trips_and_a_foreign_one_is_ignored() -> None:
    pin = staging_pin(IMAGE, "", [f"{REPO}@{D1}"]).as_dict()
    record = image_record(IMAGE, pin, "sha256:abc")
    assert parse_image_record(json.dumps(record)) == record
    assert record["reference"] == f"{REPO}@{D1}" and record["digest"] == D1
    for text in (None, "", "not json", "[]", json.dumps({**record, "format": 99}),
                 json.dumps({**record, "digest": "sha256:x"})):
        assert parse_image_record(text) is None


def _state(image_id="sha256:aaa", digests=(), record=None):
    return {"image_id": image_id, "image_repo_digests": list(digests), "image_record": record}


def _record(digest):
    return image_record(IMAGE, {"reference": digest_reference(IMAGE, digest), "digest": digest, "source": "head"},
                        "sha256:aaa")


def test_the_launch_runs_the_recorded_digest_on_every_node() -> None:
    nodes = {"a": _state(digests=[f"{REPO}@{D1}", f"{REPO}@{D2}"], record=_record(D2)),
             "b": _state(digests=[f"{REPO}@{D2}", f"{REPO}@{D1}"], record=_record(D2))}
    chosen = launch_image(IMAGE, nodes)
    assert (chosen.reference, chosen.digest) == (f"{REPO}@{D2}", D2)


def test_the_launch_finds_the_digest_without_a_record() -> None:
    chosen = launch_image(IMAGE, {"a": _state(digests=[f"{REPO}@{D1}"]), "b": _state(digests=[f"{REPO}@{D1}"])})
    assert chosen.reference == f"{REPO}@{D1}"


def test_a_configured_digest_is_run_as_it_is() -> None:
    assert launch_image(f"{IMAGE}@{D1}", {"a": _state()}).reference == f"{REPO}@{D1}"


def test_nodes_with_different_builds_are_refused_with_each_node_named() -> None:
    with pytest.raises(PinError, match=r"a: sha256:aaa .*b: sha256:bbb .*--tags image"):
        launch_image(IMAGE, {"a": _state(digests=[f"{REPO}@{D1}"]),
                             "b": _state(image_id="sha256:bbb", digests=[f"{REPO}@{D2}"])})


@pytest.mark.parametrize("nodes", [
    # transfer mode: the receiver holds the head's image ID, loaded, without a repo digest
    {"a": _state(digests=[f"{REPO}@{D1}"], record=_record(D1)), "b": _state(record=_record(D1))},
    # a local build on every node
    {"a": _state(), "b": _state()},
    # a node without the image: the launch's own checks name it
    {"a": _state(digests=[f"{REPO}@{D1}"]), "b": _state(image_id=None)},
])
def test_the_tag_when_not_every_node_holds_a_digest(nodes) -> None:
    chosen = launch_image(IMAGE, nodes)
    assert chosen.reference == IMAGE and chosen.note
