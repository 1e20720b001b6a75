# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pins: the serve image by its repo digest and the model by its commit, so every node runs one build.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

- `unpinned`: the configuration's image (a tag, not ``@sha256:``) and revisions (not a 40-hex commit), each as a
  sentence naming the variable and the fix; the config step warns with them, or refuses with
  ``dgxspark_vllm_require_pins: true``.
- `staging_pin`: the reference every node pulls - a configured digest, ``image_digest``, or the digest the head's
  pull of the tag resolved (``repo@sha256:...``), once for the cluster.
- `image_record` / `parse_image_record`: what the image role writes on each node (root-only), so that the launch,
  run alone, finds the digest staging resolved without reading another role's variables.
- `launch_image`: the reference the launch's containers run, from every node's record and local image.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RECORD_FORMAT = 1
RECORD_PATH = "/var/lib/dgxspark/image.json"
# The image_pin task's arguments (the action plugin validates with it; the module's documentation stub declares it).
ARGUMENT_SPEC: dict[str, Any] = dict(
    image=dict(type="str", required=True),
    image_digest=dict(type="str", default=""),
    head_repo_digests=dict(type="list", elements="str", default=[]),
    head=dict(type="str", default="the head"),
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_DEFAULT_REGISTRY = "docker.io"


class PinError(ValueError):
    """The nodes cannot run one pinned build as they are; the message names the nodes and the fix."""


@dataclass(frozen=True)
class ImageRef:
    """An image reference split: ``name`` (registry/repository, as written), ``tag`` and ``digest`` (or "")."""

    name: str
    tag: str = ""
    digest: str = ""


def split_image(image: str) -> ImageRef:
    """``registry:5000/org/repo:tag@sha256:...`` -> its name, tag and digest (a port is not a tag)."""
    rest, _at, digest = image.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        return ImageRef(rest[:colon], rest[colon + 1:], digest)
    return ImageRef(rest, "", digest)


def is_digest(value: Any) -> bool:
    return isinstance(value, str) and bool(_DIGEST.match(value))


def is_commit(value: Any) -> bool:
    return isinstance(value, str) and bool(_COMMIT.match(value))


def _normal_name(name: str) -> str:
    """A repository name as Docker compares it: docker.io (and index.docker.io) and library/ made explicit."""
    first, _slash, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = _DEFAULT_REGISTRY, name
    if first == "index.docker.io":
        first = _DEFAULT_REGISTRY
    if first == _DEFAULT_REGISTRY and "/" not in rest:
        rest = "library/" + rest
    return f"{first}/{rest}"


def digest_reference(image: str, digest: str) -> str:
    """The reference that runs ``digest`` of ``image``'s repository: ``repo@sha256:...`` (no tag)."""
    return f"{split_image(image).name}@{digest}"


def repo_digests_for(image: str, repo_digests: Sequence[str]) -> list[str]:
    """The digests among a local image's RepoDigests (``name@sha256:...``) that belong to ``image``'s repository."""
    wanted = _normal_name(split_image(image).name)
    out = []
    for entry in repo_digests or []:
        if not isinstance(entry, str) or "@" not in entry:
            continue
        name, _at, digest = entry.partition("@")
        if is_digest(digest) and _normal_name(name) == wanted and digest not in out:
            out.append(digest)
    return out


# ------------------------------------------------------------------------------------------- configuration


def unpinned(values: Mapping[str, Any], name: Any, image_digest: str = "") -> list[tuple[str, str]]:
    """The configuration's unpinned image and revisions: (setting, a sentence naming its variable and the fix).

    ``values``: the resolved image, model_repo, model_revision, drafter_repo, drafter_revision; ``name``: setting ->
    the variable to set (with where the value came from); ``image_digest``: the image role's pin, when set.
    """
    out: list[tuple[str, str]] = []
    image = values.get("image")
    if isinstance(image, str) and image and not split_image(image).digest and not is_digest(image_digest):
        out.append(("image", f"{name('image')} {image!r} is a tag, not a digest: a tag can move to another build "
                             "between runs. Staging resolves it to one digest and every node runs that, but the next "
                             f"staging may resolve another; pin it with {name('image')}: "
                             f"{split_image(image).name}@sha256:<digest> (the image step prints the digest it "
                             "resolved)"))
    for repo_key, key in (("model_repo", "model_revision"), ("drafter_repo", "drafter_revision")):
        repo = values.get(repo_key)
        revision = values.get(key)
        if not repo or is_commit(revision):
            continue
        out.append((key, f"{name(key)} {revision!r} of {repo} is not a commit: the branch can move to other "
                         f"weights between runs. Pin it with {name(key)}: <40-hex commit> (the checkpoint step "
                         "prints the commit it resolved; or the hub's model page, Files and versions)"))
    return out


# ------------------------------------------------------------------------------------------------ staging


@dataclass(frozen=True)
class StagingPin:
    """What the image role pulls on every node: ``reference`` (``repo@sha256:...``, or the tag when nothing resolves
    it), ``digest`` ("" when none), ``source`` (configured, image_digest, head, none), ``message`` for the report."""

    reference: str
    digest: str
    source: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"reference": self.reference, "digest": self.digest, "source": self.source, "message": self.message}


def staging_pin(image: str, image_digest: str = "", head_repo_digests: Sequence[str] | None = None,
                head: str = "the head") -> StagingPin:
    """The one reference every node pulls, decided once for the cluster.

    A digest in ``image`` wins, then ``image_digest``; else the digest of the head's pull of the tag (its image's
    RepoDigests, for the image's repository). A locally built image (no repo digest) keeps its tag. PinError when
    the head holds several digests of the repository for one image and none is configured.
    """
    ref = split_image(image)
    if ref.digest:
        if not is_digest(ref.digest):
            raise PinError(f"{image!r} names a digest that is not sha256:<64 hex>")
        return StagingPin(digest_reference(image, ref.digest), ref.digest, "configured",
                          f"{image} is pinned by its digest: every node pulls {digest_reference(image, ref.digest)}")
    if image_digest:
        if not is_digest(image_digest):
            raise PinError(f"image_digest {image_digest!r} is not sha256:<64 hex>")
        return StagingPin(digest_reference(image, image_digest), image_digest, "image_digest",
                          f"image_digest pins {image}: every node pulls {digest_reference(image, image_digest)}")
    found = repo_digests_for(image, head_repo_digests or [])
    if len(found) == 1:
        reference = digest_reference(image, found[0])
        return StagingPin(reference, found[0], "head",
                          f"{image} resolved on {head} to {found[0]}: every node pulls {reference}; pin it with "
                          f"dgxspark_vllm_image: {reference}")
    if len(found) > 1:
        raise PinError(f"{head}'s image {image} carries several digests of {ref.name} ({', '.join(found)}): pin "
                       f"one with dgxspark_vllm_image: {ref.name}@<digest>")
    return StagingPin(image, "", "none",
                      f"{image} on {head} has no repo digest (built or loaded locally, not pulled from a registry): "
                      "the nodes run the tag, and the image step compares their image IDs")


def image_record(image: str, pin: Mapping[str, Any], image_id: str = "") -> dict[str, Any]:
    """The record the image role writes on each node after staging (JSON, root-only; no time in it, so a re-run
    that resolves the same digest rewrites nothing)."""
    return {"format": RECORD_FORMAT, "image": image, "reference": pin.get("reference") or image,
            "digest": pin.get("digest") or "", "source": pin.get("source") or "none", "image_id": image_id or ""}


def parse_image_record(text: str | None) -> dict[str, Any] | None:
    """A record's JSON, None when absent, unreadable or of another format (the launch then reads the image)."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return None
    if not isinstance(data.get("image"), str) or not isinstance(data.get("digest"), str):
        return None
    if data["digest"] and not is_digest(data["digest"]):
        return None
    return data


def parse_repo_digests(rc: int, out: str) -> list[str]:
    """``docker image inspect --format '{{json .RepoDigests}}'`` -> the list ([] when the node lacks the image)."""
    if rc != 0:
        return []
    try:
        data = json.loads(out or "null")
    except ValueError:
        return []
    return [str(item) for item in data if isinstance(item, str)] if isinstance(data, list) else []


# ------------------------------------------------------------------------------------------------- launch


@dataclass(frozen=True)
class LaunchImage:
    """The reference every rank's container runs, its digest ("" when none) and how it was found."""

    reference: str
    digest: str
    note: str

    def as_dict(self) -> dict[str, str]:
        return {"reference": self.reference, "digest": self.digest, "note": self.note}


def _node_digests(image: str, state: Mapping[str, Any]) -> tuple[list[str], str]:
    """The digests of ``image``'s repository a node holds, and the one its record names for ``image`` ("")."""
    held = repo_digests_for(image, state.get("image_repo_digests") or [])
    record = state.get("image_record") or {}
    recorded = record.get("digest") or "" if record.get("image") == image else ""
    return held, recorded


def launch_image(image: str, nodes: Mapping[str, Mapping[str, Any]]) -> LaunchImage:
    """The reference the launch runs on every node, from each node's state (``vllm_node_state``: ``image_id``,
    ``image_repo_digests`` of ``image`` on the node, ``image_record`` the image role wrote).

    A digest in ``image``: that. Else the digest every node holds for the image's repository, the one staging
    recorded first (``repo@sha256:...``). Nodes that hold different builds: PinError naming them. No node with a
    repo digest, or a node that holds the image by ID only (transfer mode: ``docker load`` keeps no repo digest)
    while every node holds one image ID: the tag, with a note. A node without the image: the tag (the launch's
    own checks name the node).
    """
    ref = split_image(image)
    if ref.digest:
        return LaunchImage(digest_reference(image, ref.digest), ref.digest, f"{image} is pinned by its digest")
    held: dict[str, list[str]] = {}
    recorded: dict[str, str] = {}
    for host, state in nodes.items():
        held[host], recorded[host] = _node_digests(image, state)
    ids = {host: state.get("image_id") or "" for host, state in nodes.items()}
    if not nodes or any(not image_id for image_id in ids.values()):
        return LaunchImage(image, "", "a node does not hold the image: the tag, as configured")
    common = set.intersection(*(set(found) for found in held.values()))
    for candidate in [*dict.fromkeys(digest for digest in recorded.values() if digest), *sorted(common)]:
        if candidate in common:
            source = "recorded by the image staging" if candidate in recorded.values() else "held by every node"
            return LaunchImage(digest_reference(image, candidate), candidate,
                               f"{image} runs as {digest_reference(image, candidate)} on every node ({source})")
    if len(set(ids.values())) > 1:
        shown = "; ".join(f"{host}: {ids[host]} {','.join(held[host]) or 'no repo digest'}" for host in nodes)
        raise PinError(f"the nodes hold different builds of {image} ({shown}): run the image staging (--tags image), "
                       f"which pulls one digest on every node, or pin dgxspark_vllm_image: {ref.name}@sha256:<digest>")
    digests = sorted({digest for found in held.values() for digest in found} | {d for d in recorded.values() if d})
    if digests:
        return LaunchImage(image, digests[0] if len(digests) == 1 else "",
                           f"{image}: every node holds image {next(iter(ids.values()))}, but not every node holds a "
                           "repo digest (an image received by transfer keeps none): the tag, which names that image "
                           "on every node")
    return LaunchImage(image, "", f"{image} has no repo digest on any node (built or loaded locally): the tag, which "
                                  f"names image {next(iter(ids.values()))} on every node")
