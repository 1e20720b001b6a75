# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk for an upgrade's staging next to the known-good release, checked before anything is stopped or pulled.

Private module: may change at any time. Pure: no I/O, no Ansible imports.

An upgrade stages the new image and checkpoint commit beside the known-good's (nothing the known-good needs is
deleted: ``_checkpoint_store``). Before the serving group stops and before any pull or download, each node's need is
known from what it holds and two small reads: the registry's manifest of the new image (``docker manifest inspect
-v``: every layer's compressed bytes - more than a pull of layers the node holds already, less than the layers take
once extracted) and the hub's file list of the new commit (every file's size). `plan` adds them per filesystem (the model path's and Docker's data root, one sum
when both are on one filesystem) and refuses, naming every node short of room with the bytes needed and free.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# docker info's Architecture (the kernel's name) -> the OCI platform's
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "amd64": "amd64", "arm64": "arm64"}


class DiskError(ValueError):
    """Not enough disk, or an input that cannot be read; the message names the node, the bytes and the fix."""


def _manifest_bytes(entry: Mapping[str, Any]) -> int | None:
    manifest = entry.get("SchemaV2Manifest") or entry.get("OCIManifest")
    if not isinstance(manifest, Mapping) or not isinstance(manifest.get("layers"), list):
        return None
    config = manifest.get("config") or {}
    return int(config.get("size") or 0) + sum(int(layer.get("size") or 0) for layer in manifest["layers"])


def image_bytes(inspect_text: str, architecture: str) -> int | None:
    """The compressed bytes of the image's layers for this node's platform, from ``docker manifest inspect -v``'s
    output (one entry, or a list for a multi-platform image); None when it names no manifest for that platform."""
    try:
        data = json.loads(inspect_text)
    except ValueError:
        return None
    entries = data if isinstance(data, list) else [data]
    wanted = ARCHITECTURES.get(str(architecture).strip(), str(architecture).strip())
    single = len(entries) == 1
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        platform = (entry.get("Descriptor") or {}).get("platform") or {}
        if (single and not platform) or (platform.get("architecture") == wanted
                                         and platform.get("os", "linux") == "linux"):
            found = _manifest_bytes(entry)
            if found is not None:
                return found
    return None


def checkpoint_bytes(model_info: Mapping[str, Any]) -> tuple[str, int]:
    """(commit, bytes of every file) from the hub's model info at a revision (``?blobs=true``)."""
    commit = str(model_info.get("sha") or "")
    siblings = model_info.get("siblings")
    if not commit or not isinstance(siblings, list):
        raise DiskError("the hub's answer names no commit or no files: the disk needed cannot be known")
    total = 0
    for sibling in siblings:
        lfs = sibling.get("lfs") or {}
        total += int(lfs.get("size") or sibling.get("size") or 0)
    return commit, total


def _gb(value: int) -> str:
    return f"{value / 1e9:.1f} GB"


def plan(nodes: Mapping[str, Mapping[str, Any]], margin: int = 0) -> dict[str, Any]:
    """Each node's need against its free disk; DiskError naming every node short of room.

    ``nodes``: host -> ``image`` (``ref``, ``present``; ``bytes`` from ``image_bytes`` when absent, None when the
    registry could not say), ``checkpoint`` (``repo``, ``commit``, ``bytes``, ``staged``: the commit is the tree at the
    model path or parked beside it), ``model_fs`` and ``docker_fs`` (``source``, ``avail``, ``target`` from ``df``).
    ``margin``: bytes that must stay free on the model path's filesystem after the download.
    """
    if not nodes:
        raise DiskError("no node was read")
    short: list[str] = []
    lines: list[str] = []
    unknown: list[str] = []
    for host in sorted(nodes):
        node = nodes[host]
        image, ckpt = node.get("image") or {}, node.get("checkpoint") or {}
        model_fs, docker_fs = node.get("model_fs") or {}, node.get("docker_fs") or {}
        image_need = 0
        if not image.get("present"):
            if image.get("bytes") is None:
                unknown.append(f"{host}: the registry's manifest of {image.get('ref')} gave no size (counted as 0)")
            image_need = int(image.get("bytes") or 0)
        ckpt_need = 0 if ckpt.get("staged") else int(ckpt.get("bytes") or 0)
        needs: dict[str, dict[str, Any]] = {}
        for fs, need, what in ((model_fs, ckpt_need + (margin if ckpt_need else 0), "checkpoint"),
                               (docker_fs, image_need, "image")):
            key = str(fs.get("source") or fs.get("target") or what)
            slot = needs.setdefault(key, {"need": 0, "avail": int(fs.get("avail") or 0),
                                          "target": fs.get("target") or "?", "what": []})
            slot["need"] += need
            slot["what"].append(what)
        parts = []
        if image_need:
            parts.append(f"image {image.get('ref')} {_gb(image_need)} (compressed layers; more once extracted)")
        if ckpt_need:
            parts.append(f"checkpoint {ckpt.get('repo')}@{str(ckpt.get('commit'))[:12]} {_gb(ckpt_need)}")
        lines.append(f"{host}: " + ("; ".join(parts) if parts else "nothing to stage (both already held)"))
        for slot in needs.values():
            if slot["need"] and slot["need"] > slot["avail"]:
                what = " and the ".join(slot["what"])
                kept = f" plus a margin of {margin} bytes" if margin and "checkpoint" in slot["what"] else ""
                short.append(f"{host} needs {slot['need']} bytes ({_gb(slot['need'])}) on {slot['target']} for the "
                             f"{what}{kept} ({'; '.join(parts)}), {slot['avail']} bytes ({_gb(slot['avail'])}) free")
    if short:
        raise DiskError("not enough disk to stage the upgrade next to the known-good release, nothing was stopped, "
                        "pulled or downloaded: " + "; ".join(short) + ". Free room (playbooks/prune.yml removes what "
                        "releases beyond dgxspark_vllm_upgrade_keep_staged hold), or lower "
                        "dgxspark_vllm_upgrade_keep_staged and prune")
    return {"lines": lines, "unknown": unknown,
            "msg": "disk for the upgrade next to the known-good: " + "; ".join(lines)
                   + (("; " + "; ".join(unknown)) if unknown else "")}


def parse_df(text: str) -> dict[str, Any]:
    """``df -B1 --output=source,avail,target PATH``'s data line -> source, avail, target."""
    rows = [line.split() for line in str(text).strip().splitlines()[1:] if line.strip()]
    if not rows or len(rows[-1]) < 3:
        raise DiskError(f"df gave no data line: {text!r}")
    source, avail, target = rows[-1][0], rows[-1][1], " ".join(rows[-1][2:])
    try:
        return {"source": source, "avail": int(avail), "target": target}
    except ValueError:
        raise DiskError(f"df's free bytes {avail!r} is not a number") from None


def staged(commit: str, selected: Mapping[str, Any] | None, parked: Sequence[str] | Mapping[str, Any]) -> bool:
    """Whether the commit is the tree at the model path or parked beside it."""
    return bool(commit) and ((selected or {}).get("commit") == commit or commit in parked)
