# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several checkpoint commits staged on a node, the one the launch serves at ``dgxspark_vllm_model_path``.

Private module: may change at any time. Pure decisions, and the few renames that carry them out (``select``,
``remove_parked``), which follow no symlink.

The recipe's layout is one flat tree at the model path (``--local-dir``), and the launch serves that path. A new
commit staged there used to overwrite the old one, so a release of the old commit could not come back without a
download. Here the tree at the model path is the **selected** commit (its stamp, ``_manifest.STAMP_NAME``, names it)
and every other verified commit is **parked** beside it, whole, in the store ``<model path>.commits/<commit>/``
(a sibling folder, so a rename moves a tree in no time and copies nothing)::

    /var/tmp/models/GLM-5.3-Flash-NVFP4            the commit the launch serves (stamped)
    /var/tmp/models/GLM-5.3-Flash-NVFP4.commits/
        0123...cdef/                               another verified commit, stamped, parked whole

- `plan_select`: which tree moves where so that the wanted commit is at the model path (park the selected one when it
  is another verified commit, bring the wanted one back when it is parked). A tree at the model path without a stamp
  (an interrupted download) stays where it is unless the wanted commit is parked: it then moves to the store's
  ``.unverified`` folder (the one an earlier move left there is removed: nothing verified is thrown away).
- `plan_prune`: the retention choice - which parked commits and which recorded images the last N releases of the
  history no longer need; never the serving release's nor the last known-good's, and only once the serving release is
  the known-good.

An existing flat tree needs no migration: it is the selected commit. A model path that is a mount point cannot be
renamed: the store is refused, naming the fix (the model path one level below the mount point).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf
from ansible_collections.dgxspark.vllm.plugins.module_utils import _pins

STORE_SUFFIX = ".commits"
UNVERIFIED = ".unverified"
DEFAULT_KEEP = 2


class StoreError(ValueError):
    """A store that cannot be used as asked; the message names the path, what is wrong and the fix."""


def store_dir(local_dir: str) -> str:
    """The store of the model path: its sibling ``<name>.commits``."""
    path = os.path.normpath(str(local_dir))
    if path in ("/", "") or not os.path.isabs(path):
        raise StoreError(f"the model path {local_dir!r} is not an absolute folder below /: it has no store")
    return path + STORE_SUFFIX


def parked_path(local_dir: str, commit: str) -> str:
    if not _pins.is_commit(commit):
        raise StoreError(f"{commit!r} is not a 40-hex commit: only a verified commit is parked")
    return os.path.join(store_dir(local_dir), commit)


def _stamp_names(stamp: Mapping[str, Any] | None) -> tuple[str, str] | None:
    if not stamp or not _pins.is_commit(stamp.get("commit")):
        return None
    return str(stamp.get("repo") or ""), str(stamp.get("commit"))


def plan_select(current: Mapping[str, Any] | None, current_exists: bool, repo: str, commit: str,
                parked: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What moves so that ``repo@commit`` is the tree at the model path.

    ``current``: the stamp of the tree at the model path (None: no stamp); ``current_exists``: whether that tree
    exists; ``parked``: commit -> stamp of each parked tree (``list_parked``). Returns ``park`` (the selected commit
    to move into the store, or None), ``set_aside`` (an unstamped tree moves to the store's .unverified folder),
    ``unpark`` (the wanted commit to bring back, or None), ``selected`` (the wanted commit is there already) and a
    ``message``."""
    if not _pins.is_commit(commit):
        raise StoreError(f"{commit!r} is not a 40-hex commit: resolve the revision first")
    names = _stamp_names(current)
    wanted_parked = commit in parked and (parked[commit] or {}).get("repo") == repo
    if names == (repo, commit):
        return {"park": None, "set_aside": False, "unpark": None, "selected": True,
                "message": f"{repo}@{commit[:12]} is the selected tree"}
    park = None
    set_aside = False
    if names is not None:
        park = names[1]
        if park in parked:
            raise StoreError(f"{park} is both the selected tree and parked in the store (a copy of each): remove the "
                             f"store's folder {park} (or the model path's tree) and run again")
    elif current_exists and wanted_parked:
        set_aside = True
    parts = []
    if park:
        parts.append(f"{names[0]}@{park[:12]} parked in the store")
    if set_aside:
        parts.append(f"the unverified tree at the model path set aside ({UNVERIFIED})")
    if wanted_parked:
        parts.append(f"{repo}@{commit[:12]} brought back from the store (nothing downloaded)")
    else:
        parts.append(f"{repo}@{commit[:12]} is not staged on this node yet")
    return {"park": park, "set_aside": set_aside, "unpark": commit if wanted_parked else None, "selected": False,
            "message": "; ".join(parts)}


# ------------------------------------------------------------------------------------------------ on the node


def _is_folder(path: str) -> bool:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StoreError(f"{path} is not a folder (a symlink or a file): the store keeps folders only; move it away")
    return True


def list_parked(local_dir: str) -> dict[str, dict[str, Any]]:
    """commit -> stamp of every parked tree whose stamp names its folder's commit (others are not the store's)."""
    store = store_dir(local_dir)
    if not _is_folder(store):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(store)):
        path = os.path.join(store, name)
        if not _pins.is_commit(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        stamp = mf.read_stamp(path)
        if stamp and stamp.get("commit") == name:
            out[name] = stamp
    return out


def _rename(src: str, dst: str, local_dir: str) -> None:
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.EXDEV):
            raise StoreError(
                f"cannot move {src} to {dst} ({exc.strerror}): the model path {local_dir} is a mount point or on "
                f"another filesystem than its parent folder. Several commits are kept beside it in "
                f"{store_dir(local_dir)}: set dgxspark_vllm_model_path to a folder one level below the mount point "
                "(its tree moved there once by hand)") from exc
        raise StoreError(f"cannot move {src} to {dst}: {exc.strerror}") from exc


def select(local_dir: str, repo: str, commit: str, check_mode: bool = False) -> dict[str, Any]:
    """Carry out ``plan_select`` on this node (check_mode: only say it). The store is made root's, mode 0755; the
    model path's parent was checked by the caller (every level root's, no symlink)."""
    local_dir = os.path.normpath(local_dir)
    parked = list_parked(local_dir)
    current_exists = _is_folder(local_dir)
    current = mf.read_stamp(local_dir) if current_exists else None
    plan = plan_select(current, current_exists, repo, commit, parked)
    plan["changed"] = not plan["selected"] and bool(plan["park"] or plan["set_aside"] or plan["unpark"])
    # check mode moves nothing: it verifies the wanted commit where it is (a commit not staged: a folder not there)
    plan["root"] = parked_path(local_dir, commit) if check_mode and (plan["unpark"] or plan["park"]) else local_dir
    if check_mode or not plan["changed"]:
        return plan
    store = store_dir(local_dir)
    if not _is_folder(store):
        os.mkdir(store, 0o755)
    if plan["park"]:
        _rename(local_dir, parked_path(local_dir, plan["park"]), local_dir)
    if plan["set_aside"]:
        aside = os.path.join(store, UNVERIFIED)
        if _is_folder(aside):
            shutil.rmtree(aside)   # fd-based on Linux: follows no symlink inside
        _rename(local_dir, aside, local_dir)
    if plan["unpark"]:
        _rename(parked_path(local_dir, plan["unpark"]), local_dir, local_dir)
    return plan


def tree_bytes(path: str) -> int:
    """The bytes of the regular files below ``path`` (no symlink followed; a hard link counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def remove_parked(local_dir: str, commit: str) -> int:
    """Remove one parked tree (never the model path's); its bytes."""
    path = parked_path(local_dir, commit)
    if not _is_folder(path):
        return 0
    size = tree_bytes(path)
    shutil.rmtree(path)
    return size


# ------------------------------------------------------------------------------------------------- retention


def _image_key(entry: Mapping[str, Any]) -> str:
    image = entry.get("image") or {}
    return str(image.get("digest") or image.get("image_id") or "")


def plan_prune(history: Mapping[str, Any], keep: int, parked: Mapping[str, int],
               images: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a prune frees: the parked commits and the recorded images no release among the last ``keep`` of the
    history needs (newest last), nor the serving release, nor the last known-good.

    ``parked``: commit -> bytes of each parked tree on the node; ``images``: the node's images of the releases'
    repositories (``Id``, ``RepoDigests``, ``Size``). Only an image some release of the history recorded is pruned
    (by its digest or ID), never another. Nothing is pruned unless the serving release is the last known-good (a
    prune follows a new known-good). ``keep`` below 1 is refused."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise StoreError(f"dgxspark_vllm_upgrade_keep_staged is {keep!r}: keep at least the serving release (1 or "
                         "more)")
    releases = list(history.get("releases") or [])
    serving = history.get("serving")
    good = None
    for entry in releases:
        if entry.get("known_good"):
            good = entry
    if not serving or good is None or good.get("id") != serving:
        return {"checkpoints": [], "images": [], "bytes": 0, "kept": [],
                "message": "nothing pruned: the serving release is not the last known-good (a prune follows a new "
                           "known-good)"}
    kept = list(releases[-keep:])
    for entry in releases:
        if entry.get("id") in (serving, good.get("id")) and entry not in kept:
            kept.append(entry)
    kept_commits = {str((entry.get("model") or {}).get("commit") or "") for entry in kept}
    kept_images = {_image_key(entry) for entry in kept}
    recorded = {_image_key(entry) for entry in releases} - {""}
    checkpoints = [{"commit": commit, "bytes": int(size)} for commit, size in sorted(parked.items())
                   if commit not in kept_commits]
    pruned_images = []
    for image in images:
        digests = {str(item).partition("@")[2] for item in image.get("RepoDigests") or []}
        keys = digests | {str(image.get("Id") or "")}
        if keys & kept_images or not keys & recorded:
            continue
        pruned_images.append({"id": str(image.get("Id") or ""), "digests": sorted(digests & recorded) or sorted(digests),
                              "bytes": int(image.get("Size") or 0)})
    total = sum(item["bytes"] for item in checkpoints) + sum(item["bytes"] for item in pruned_images)
    names = [f"checkpoint {item['commit'][:12]}" for item in checkpoints] + \
        [f"image {item['id'][7:19] if item['id'].startswith('sha256:') else item['id'][:12]}" for item in pruned_images]
    message = (f"prune {', '.join(names)}: {total} bytes freed; kept the last {keep} releases "
               f"({', '.join(str(entry.get('id')) for entry in kept)})" if names else
               f"nothing to prune: the last {keep} releases ({', '.join(str(entry.get('id')) for entry in kept)}) "
               "need every parked commit and recorded image")
    return {"checkpoints": checkpoints, "images": pruned_images, "bytes": total,
            "kept": [entry.get("id") for entry in kept], "message": message}
