# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Releases: what a serving group is, and the cluster's history of them (the known-good ones marked).

Private module: may change at any time. Pure functions, except the two file helpers at the end (the history file on
the head: read and refused as the collection refuses other root-only files, written atomically).

A **release** is the identity of a serving group plus how it was judged:

- the image: the digest the image staging recorded on the head (``_pins.RECORD_PATH``; its image ID when the image
  has no repo digest, e.g. built or loaded locally), and the reference;
- the model: its repository and the commit the checkpoint staging stamped on the head (``_manifest.STAMP_NAME``);
- the profile and its resolved settings (``dgxspark_vllm_config.settings``), with a stable hash of them;
- the KV byte value the launch used (the serve container's ``--kv-cache-memory-bytes``; else the configured one;
  ``None`` when the engine sized the KV cache itself);
- the verify result (ok, its time, its report).

Its **id** is a short hash of the identity alone (image, model repo and commit, settings hash, KV value): the same
serving group gets the same id on every run and every controller. The **history** (JSON, root-only on the head)::

    {"format": 1, "cluster": "", "serving": "<id>",
     "releases": [{"id": ..., "known_good": true, "known_good_at": ..., "recorded_at": ..., "updated_at": ...,
                   "image": {...}, "model": {...}, ..., "baseline": {...}}, ...]}

A release's ``baseline`` is verify's short benchmark (``_bench.baseline_from``: decode tok/s at concurrency 1, TTFT
p50 and output tok/s at the configured concurrency, the parameters, when, how long); records written before
baselines have none and stay valid. A release that regressed against the last known-good's baseline
(``_regression.compare``) keeps the comparison as ``regression`` and is not known-good.

Newest last; recording an id already there updates its entry and moves it last; the last ``keep`` are kept, but
never at the cost of the serving release or the last known-good one.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ansible_collections.dgxspark.vllm.plugins.module_utils import _pins, _safe_paths, _secret_file

HISTORY_FORMAT = 1
HISTORY_PATH = "/var/lib/dgxspark/releases.json"
# verify's reports on the head, beside the history: the one each recorded release names, and the newest others
REPORTS_PATH = "/var/lib/dgxspark/verify-reports"
REPORTS_SUBJECT = "the verify reports folder"
REPORTS_VARIABLE = "dgxspark_vllm_config.verify_reports_path"
REPORT_NAME = re.compile(r"^verify-[A-Za-z0-9][A-Za-z0-9._-]*\.json$")
DEFAULT_KEEP = 10
ID_LENGTH = 12
SETTINGS_HASH_LENGTH = 16
SHORT = 12
KV_FLAG = "--kv-cache-memory-bytes"
# Settings that are identity parts of their own: the image (by digest) and the KV value (as the launch used it).
NOT_IN_SETTINGS_HASH = frozenset({"image", "kv_cache_memory_bytes"})


class ReleaseError(ValueError):
    """A release that cannot be known or recorded, or a history that cannot be used; the message says why and what
    to do."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _hash(value: Any, length: int) -> str:
    return hashlib.sha256(_canonical(value).encode("ascii")).hexdigest()[:length]


def settings_hash(profile: str, settings: Mapping[str, Any]) -> str:
    """A stable hash of the profile name and the settings that make the serve (unset ones, the image and the KV value
    left out: those are identity parts of their own). Key order does not matter."""
    kept = {str(key): value for key, value in settings.items() if key not in NOT_IN_SETTINGS_HASH and value is not None}
    return _hash({"profile": profile, "settings": kept}, SETTINGS_HASH_LENGTH)


def release_id(image: str, model_repo: str, model_commit: str, settings_digest: str, kv_bytes: int | None) -> str:
    """The release's id: a short hash of its identity (image digest or ID, model repo and commit, settings hash, KV)."""
    return _hash({"image": image, "model_repo": model_repo, "model_commit": model_commit,
                  "settings_hash": settings_digest, "kv_cache_memory_bytes": kv_bytes}, ID_LENGTH)


def _kv_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ReleaseError(f"{where} is {value!r}, not a byte count")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ReleaseError(f"{where} is {value!r}, not a byte count") from None
    if number <= 0:
        raise ReleaseError(f"{where} is {number}, not a positive byte count")
    return number


def kv_from_args(args: Sequence[str]) -> int | None:
    """The ``--kv-cache-memory-bytes`` value among a container's arguments (``--flag N`` or ``--flag=N``, also inside
    one argument that is a shell command line); None when the flag is absent."""
    tokens: list[str] = []
    for arg in args:
        try:
            tokens.extend(shlex.split(str(arg)))
        except ValueError:
            tokens.extend(str(arg).split())
    found: int | None = None
    for index, token in enumerate(tokens):
        if token == KV_FLAG:
            if index + 1 >= len(tokens):
                raise ReleaseError(f"the serve container's {KV_FLAG} has no value")
            found = _kv_int(tokens[index + 1], f"the serve container's {KV_FLAG}")
        elif token.startswith(KV_FLAG + "="):
            found = _kv_int(token.partition("=")[2], f"the serve container's {KV_FLAG}")
    return found


def launch_kv(serve_args: Sequence[str] | None, configured: Any) -> tuple[int | None, str]:
    """The KV value the launch used and where it was read: the serve container's flag, else the configured value,
    else None (the engine sized the KV cache from gpu_memory_utilization)."""
    if serve_args is not None:
        found = kv_from_args(serve_args)
        if found is not None:
            return found, f"the serve container's {KV_FLAG}"
    if configured not in (None, ""):
        return _kv_int(configured, "dgxspark_vllm_kv_cache_memory_bytes"), "dgxspark_vllm_kv_cache_memory_bytes"
    return None, "none: the engine sized the KV cache itself (no --kv-cache-memory-bytes)"


def _image_part(image: str, record: Mapping[str, Any] | None, record_path: str, missing: list[str]) -> dict[str, Any]:
    if record is None:
        missing.append(f"the image digest: no image record at {record_path} on the head (written by the image "
                       "staging); run it (--tags image)")
        return {}
    if record.get("image") != image:
        missing.append(f"the image digest: the head's record at {record_path} is for {record.get('image')!r}, the "
                       f"configuration serves {image!r}; run the image staging (--tags image)")
        return {}
    digest = str(record.get("digest") or "")
    image_id = str(record.get("image_id") or "")
    if not digest and not image_id:
        missing.append(f"the image digest: the head's record at {record_path} names neither a digest nor an image "
                       "ID; run the image staging (--tags image)")
        return {}
    # configured: the image the inventory asked for when it was staged (a rollback's record keeps it beside the digest)
    return {"reference": str(record.get("reference") or image), "digest": digest, "image_id": image_id,
            "configured": str(record.get("configured") or record.get("image") or image)}


def _model_part(model_repo: str, stamp: Mapping[str, Any] | None, stamp_path: str,
                missing: list[str], revision: str = "") -> dict[str, Any]:
    if stamp is None:
        missing.append(f"the model commit: no checkpoint stamp at {stamp_path} on the head (written by the "
                       "checkpoint staging once the tree is verified); run it (--tags checkpoint)")
        return {}
    if stamp.get("repo") != model_repo:
        missing.append(f"the model commit: the head's stamp at {stamp_path} is for {stamp.get('repo')!r}, the "
                       f"configuration serves {model_repo!r}; run the checkpoint staging (--tags checkpoint)")
        return {}
    commit = stamp.get("commit")
    if not _pins.is_commit(commit):
        missing.append(f"the model commit: the head's stamp at {stamp_path} names {commit!r}, not a 40-hex commit; "
                       "run the checkpoint staging (--tags checkpoint)")
        return {}
    part = {"repo": model_repo, "commit": str(commit)}
    if revision:
        part["revision"] = revision   # the configured revision (a branch, or the commit itself)
    return part


def _verify_part(verify: Mapping[str, Any] | None) -> dict[str, Any]:
    verify = verify or {}
    part = {"ok": verify.get("ok") is True, "finished": str(verify.get("finished") or ""),
            "report": str(verify.get("report") or "")}
    if verify.get("head_report"):
        part["head_report"] = str(verify["head_report"])   # the report's copy on the head, with the history
    return part


def build_release(*, image: str, image_record: Mapping[str, Any] | None, model_repo: str,
                  stamp: Mapping[str, Any] | None, profile: str, settings: Mapping[str, Any],
                  serve_args: Sequence[str] | None = None, kv_configured: Any = None,
                  verify: Mapping[str, Any] | None = None, cluster: str = "",
                  image_record_path: str = _pins.RECORD_PATH,
                  stamp_path: str = "the checkpoint stamp", model_revision: str = "") -> dict[str, Any]:
    """The release a serving group is, from what the head recorded and the resolved configuration.

    ``image_record``: the image staging's record on the head (``_pins.parse_image_record``; None when absent);
    ``stamp``: the checkpoint's stamp on the head (None when absent); ``serve_args``: the head's serve container's
    arguments (None: not read); ``model_revision``: the configured revision, kept beside the commit. ReleaseError
    naming every part that cannot be known, and how to get it.
    """
    missing: list[str] = []
    image_part = _image_part(image, image_record, image_record_path, missing)
    model_part = _model_part(model_repo, stamp, stamp_path, missing, model_revision)
    if not profile:
        missing.append("the profile: no profile name was given")
    if not isinstance(settings, Mapping):
        missing.append("the settings: dgxspark_vllm_config.settings is not a mapping")
        settings = {}
    try:
        kv_bytes, kv_source = launch_kv(serve_args, kv_configured)
    except ReleaseError as exc:
        missing.append(f"the KV value: {exc}")
        kv_bytes, kv_source = None, ""
    if missing:
        raise ReleaseError("the serving release cannot be known: " + "; ".join(missing))
    settings_digest = settings_hash(profile, settings)
    image_key = image_part["digest"] or image_part["image_id"]
    return {
        "id": release_id(image_key, model_part["repo"], model_part["commit"], settings_digest, kv_bytes),
        "cluster": cluster,
        "image": image_part,
        "model": model_part,
        "profile": profile,
        "settings_hash": settings_digest,
        "settings": {key: settings[key] for key in sorted(settings) if settings[key] is not None},
        "kv_cache_memory_bytes": kv_bytes,
        "kv_source": kv_source,
        "verify": _verify_part(verify),
    }


# ------------------------------------------------------------------------------------------------- history


def new_history(cluster: str = "") -> dict[str, Any]:
    return {"format": HISTORY_FORMAT, "cluster": cluster, "serving": None, "releases": []}


def parse_history(text: str | None, path: str = HISTORY_PATH) -> dict[str, Any]:
    """A history file's content; an empty history for no content. A file that is not a history of this format is
    refused (never replaced: it may hold what the last known-good was)."""
    if text is None or not text.strip():
        return new_history()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReleaseError(f"{path} is not JSON ({exc}): it is left as it is; move it aside to start a new "
                           "history") from None
    if not isinstance(data, dict) or data.get("format") != HISTORY_FORMAT:
        raise ReleaseError(f"{path} is not a release history of format {HISTORY_FORMAT}: it is left as it is; move "
                           "it aside to start a new history")
    releases = data.get("releases")
    if not isinstance(releases, list) or not all(isinstance(r, dict) and isinstance(r.get("id"), str)
                                                 for r in releases):
        raise ReleaseError(f"{path}: its releases are not a list of releases with ids: it is left as it is; move it "
                           "aside to start a new history")
    return {"format": HISTORY_FORMAT, "cluster": str(data.get("cluster") or ""), "serving": data.get("serving"),
            "releases": releases}


def dumps(history: Mapping[str, Any]) -> str:
    return json.dumps(history, indent=1, sort_keys=True) + "\n"


def check_cluster(history: Mapping[str, Any], cluster: str, path: str = HISTORY_PATH) -> None:
    """Refuse a history that another named cluster recorded (each cluster keeps its own, on its own head). A history
    of an unnamed cluster (a single-cluster inventory) is this head's, whatever the inventory now names it."""
    theirs = history.get("cluster") or ""
    if history.get("releases") and theirs and cluster and theirs != cluster:
        raise ReleaseError(f"{path} holds the history of cluster {theirs}, this run's cluster is {cluster}: each "
                           "cluster keeps its own history on its own head; check dgxspark_vllm_clusters and the "
                           f"--limit (if this head now serves {cluster}, move the file aside to start its history)")


def find(history: Mapping[str, Any], release: str) -> dict[str, Any] | None:
    for entry in history.get("releases") or []:
        if entry.get("id") == release:
            return entry
    return None


def serving(history: Mapping[str, Any]) -> dict[str, Any] | None:
    """The release recorded as serving (None when none is)."""
    return find(history, history.get("serving") or "") if history.get("serving") else None


def last_known_good(history: Mapping[str, Any]) -> dict[str, Any] | None:
    """The newest release marked known-good (None when none is)."""
    for entry in reversed(history.get("releases") or []):
        if entry.get("known_good"):
            return entry
    return None


def _trim(releases: list[dict[str, Any]], keep: int, protected: Collection[str]) -> list[dict[str, Any]]:
    """The newest ``keep`` releases; the protected ones (serving, last known-good) are kept beyond that, and the
    oldest others dropped first."""
    out = list(releases)
    index = 0
    while len(out) > keep and index < len(out):
        if out[index].get("id") in protected:
            index += 1
            continue
        del out[index]
    return out


def record(history: Mapping[str, Any], release: Mapping[str, Any], *, now: str, known_good: bool = False,
           keep: int = DEFAULT_KEEP, baseline: Mapping[str, Any] | None = None,
           regression: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """The history with ``release`` recorded as serving (and known-good with ``known_good``), and whether that moved
    anything that matters: a new release, a known-good mark, the serving release, the order, a release dropped, a
    regression found or cleared.

    The same id again updates its entry (its verify result, its baseline, ``updated_at``) and makes it the newest;
    that refresh alone is not a change. known_good needs the release's verify ok. A known-good mark is taken back
    only by a regression (``regression`` with ``regressed`` true: the release was measured slower than the last
    known-good, ``_regression.compare``): the entry then keeps the comparison as ``regression`` and is not
    known-good, whatever ``known_good`` says. ``baseline`` (``_bench.baseline_from``) replaces the entry's baseline:
    a known-good release's baseline is its newest measurement that passed.
    """
    if keep < 1:
        raise ReleaseError(f"keep is {keep}: the history keeps at least the serving release (keep >= 1)")
    regressed = bool(regression and regression.get("regressed"))
    if known_good and not regressed and not (release.get("verify") or {}).get("ok") is True:
        raise ReleaseError(f"release {release.get('id')} did not pass verify: it is not recorded as known-good")
    releases = [dict(entry) for entry in history.get("releases") or []]
    old = find(history, str(release["id"]))
    entry = dict(old or {})
    entry.update(release)
    entry.setdefault("recorded_at", now)
    entry["updated_at"] = now
    if baseline is not None:
        entry["baseline"] = dict(baseline)
    if regressed:
        entry["known_good"], entry["known_good_at"] = False, None
        entry["regression"] = dict(regression or {}, found_at=now)
    else:
        entry.pop("regression", None)
        entry["known_good"] = bool((old or {}).get("known_good")) or known_good
        entry["known_good_at"] = (old or {}).get("known_good_at") or (now if known_good else None)
    before_order = [item.get("id") for item in releases]
    releases = [item for item in releases if item.get("id") != release["id"]] + [entry]
    protected = {release["id"]}
    good = last_known_good({"releases": releases})
    if good:
        protected.add(good["id"])
    releases = _trim(releases, keep, protected)
    out = {"format": HISTORY_FORMAT, "cluster": release.get("cluster") or history.get("cluster") or "",
           "serving": release["id"], "releases": releases}
    changed = (old is None or bool(old.get("known_good")) != entry["known_good"]
               or bool(old.get("regression")) != regressed
               or history.get("serving") != release["id"] or before_order != [item["id"] for item in releases])
    return out, changed


# ------------------------------------------------------------------------------------------ verify reports


def check_report_name(name: str) -> str:
    """A report's file name on the head: ``verify-<stamp>.json``, no folder part. ReleaseError otherwise."""
    if not REPORT_NAME.match(name or ""):
        raise ReleaseError(f"report_name {name!r} is not a verify report's file name (verify-<stamp>.json: letters, "
                           "digits, '.', '_' and '-' only, no folder)")
    return name


def referenced_reports(history: Mapping[str, Any], folder: str) -> set[str]:
    """The report file names in ``folder`` that a release of the history names as its head report."""
    names = set()
    for entry in history.get("releases") or []:
        path = str((entry.get("verify") or {}).get("head_report") or "")
        if path and os.path.dirname(path) == folder.rstrip("/"):
            names.add(os.path.basename(path))
    return names


def reports_to_prune(reports: Mapping[str, float], referenced: Collection[str], keep: int,
                     current: str = "") -> list[str]:
    """The reports to remove, oldest first: of ``reports`` (file name: modification time), every one that no release
    of the history names (``referenced``) and is not the ``current`` run's, beyond the newest ``keep`` of those. Names
    that are not verify reports are never listed."""
    if keep < 0:
        raise ReleaseError(f"keep is {keep}: a count of reports cannot be negative")
    loose = sorted((name for name in reports if REPORT_NAME.match(name) and name not in referenced
                    and name != current), key=lambda name: (reports[name], name), reverse=True)
    return sorted(loose[keep:], key=lambda name: (reports[name], name))


# ------------------------------------------------------------------------------------------------- showing


def row(entry: Mapping[str, Any], history: Mapping[str, Any]) -> dict[str, Any]:
    """One release as releases.yml lists it."""
    image = entry.get("image") or {}
    digest = str(image.get("digest") or image.get("image_id") or "")
    verify = entry.get("verify") or {}
    good = last_known_good(history)
    marks = [mark for mark, on in (("serving", history.get("serving") == entry.get("id")),
                                   ("last known-good", bool(good) and good.get("id") == entry.get("id")),
                                   ("regressed", bool((entry.get("regression") or {}).get("regressed")))) if on]
    return {
        "id": entry.get("id"),
        "when": entry.get("updated_at") or entry.get("recorded_at"),
        "image_digest": digest.partition(":")[2][:SHORT] if ":" in digest else digest[:SHORT],
        "model_commit": str((entry.get("model") or {}).get("commit") or "")[:SHORT],
        "settings_hash": entry.get("settings_hash"),
        "kv_cache_memory_bytes": entry.get("kv_cache_memory_bytes"),
        "verify": ("ok " if verify.get("ok") else "failed ") + str(verify.get("finished") or ""),
        "known_good": bool(entry.get("known_good")),
        "marks": marks,
        "baseline": baseline_text(entry.get("baseline")),
    }


def baseline_text(baseline: Any) -> str:
    """A release's baseline in a few words ("" when it has none): decode tok/s at 1, TTFT p50 and output tok/s at
    the concurrency it was measured at."""
    if not isinstance(baseline, Mapping):
        return ""
    return (f"decode {baseline.get('decode_tok_s')} tok/s, TTFT p50 {baseline.get('ttft_ms_p50')} ms and "
            f"{baseline.get('output_throughput')} tok/s out at concurrency {baseline.get('concurrency')}")


def lines(history: Mapping[str, Any]) -> list[str]:
    """The history as a table, oldest first (one line a release)."""
    out = ["id            when                  image         commit        settings          KV bytes      "
           "verify                  known-good"]
    for entry in history.get("releases") or []:
        item = row(entry, history)
        kv = item["kv_cache_memory_bytes"]
        marks = f" ({', '.join(item['marks'])})" if item["marks"] else ""
        out.append(f"{item['id']:<13} {item['when'] or '-':<21} {item['image_digest'] or '-':<13} "
                   f"{item['model_commit'] or '-':<13} {item['settings_hash'] or '-':<17} "
                   f"{'-' if kv is None else kv!s:<13} {item['verify']:<23} "
                   f"{'yes' if item['known_good'] else 'no'}{marks}"
                   f"{'; baseline: ' + item['baseline'] if item['baseline'] else ''}")
    if len(out) == 1:
        out.append("(no release recorded yet: one is recorded when verify passes)")
    return out


def describe(entry: Mapping[str, Any] | None) -> str:
    """One release in a sentence (status): id, image, model, profile, settings hash, KV, verify."""
    if not entry:
        return "none recorded"
    image = entry.get("image") or {}
    model = entry.get("model") or {}
    verify = entry.get("verify") or {}
    kv = entry.get("kv_cache_memory_bytes")
    return (f"{entry.get('id')} (image {image.get('digest') or image.get('image_id')}, model {model.get('repo')}@"
            f"{str(model.get('commit') or '')[:SHORT]}, profile {entry.get('profile')} settings "
            f"{entry.get('settings_hash')}, KV {'engine-sized' if kv is None else kv}, verify "
            f"{'ok' if verify.get('ok') else 'failed'} {verify.get('finished') or ''}"
            f"{', known-good' if entry.get('known_good') else ', not known-good'}"
            f"{', regressed' if (entry.get('regression') or {}).get('regressed') else ''}"
            f"{', baseline ' + baseline_text(entry.get('baseline')) if entry.get('baseline') else ''})")


def summary(history: Mapping[str, Any]) -> str:
    """The serving release and the last known-good, in one line."""
    current = serving(history)
    good = last_known_good(history)
    same = bool(current and good and current.get("id") == good.get("id"))
    return (f"serving release: {describe(current)}; last known-good: "
            f"{'the serving release' if same else describe(good)}")


# ----------------------------------------------------------------------------------- the file on the head


def _check_file(info: os.stat_result, path: str, euid: int) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise ReleaseError(f"{path} is a symlink: refused (a symlink could point the root-only history anywhere); "
                           "remove it and run again")
    if not stat.S_ISREG(info.st_mode):
        raise ReleaseError(f"{path} is not a regular file: refused; move it aside and run again")
    if info.st_uid not in (0, euid):
        raise ReleaseError(f"{path} belongs to {_safe_paths.owner_name(info.st_uid)}, not root: refused (another user "
                           f"could have rewritten the history); check it, then `sudo chown root: {path}`")
    if info.st_mode & 0o077:
        raise ReleaseError(f"{path} has mode {stat.S_IMODE(info.st_mode):04o}: group or others can use it; refused. "
                           f"Check it, then `sudo chmod 600 {path}`")


def _trusted(euid: int | None) -> set[int]:
    return {0, os.geteuid() if euid is None else euid}


def read_file(path: str, euid: int | None = None) -> str | None:
    """The history file's text (None when there is none). Its folder's levels must be root's (or this user's), no
    symlink, not writable by others; the file a regular file of root (or this user), mode 0600 or narrower."""
    me = os.geteuid() if euid is None else euid
    try:
        _safe_paths.check_levels(os.path.dirname(path), _trusted(me), "the release history folder",
                                 "dgxspark_vllm_config.release_history_path")
    except _safe_paths.UnsafePathError as exc:
        raise ReleaseError(str(exc)) from None
    try:
        _check_file(os.lstat(path), path, me)
    except FileNotFoundError:
        return None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        _check_file(os.fstat(fd), path, me)
        with os.fdopen(os.dup(fd), "r", encoding="utf-8") as handle:
            return handle.read()
    finally:
        os.close(fd)


def _write_private(path: str, text: str, me: int, subject: str, variable: str, check_mode: bool) -> bool:
    """Make path a 0600 file of this user holding text (a new file renamed into place); its folder made (0755) when
    missing and refused as read_file refuses the history's; an existing path refused unless a private regular file."""
    try:
        _safe_paths.ensure_folder(os.path.dirname(path), _trusted(me), subject, variable, create=not check_mode)
    except _safe_paths.UnsafePathError as exc:
        raise ReleaseError(str(exc)) from None
    if os.path.lexists(path):
        _check_file(os.lstat(path), path, me)
    return _secret_file.write_secret(path, text, check_mode=check_mode)


def write_file(path: str, text: str, check_mode: bool = False, euid: int | None = None) -> bool:
    """Make path a 0600 file of this user holding text (written to a new file, renamed into place); its folder is
    made (0755) when missing, refused as read_file refuses it. True when the file changed (or would)."""
    me = os.geteuid() if euid is None else euid
    return _write_private(path, text, me, "the release history folder", "dgxspark_vllm_config.release_history_path",
                          check_mode)


def list_reports(folder: str, euid: int | None = None) -> dict[str, float]:
    """The verify reports in folder (regular files named verify-*.json: modification time); {} when the folder is
    missing. The folder is refused as the history's is."""
    me = os.geteuid() if euid is None else euid
    if not os.path.lexists(folder):
        return {}
    try:
        _safe_paths.check_levels(folder, _trusted(me), REPORTS_SUBJECT, REPORTS_VARIABLE)
    except _safe_paths.UnsafePathError as exc:
        raise ReleaseError(str(exc)) from None
    found = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            if REPORT_NAME.match(entry.name) and entry.is_file(follow_symlinks=False):
                found[entry.name] = entry.stat(follow_symlinks=False).st_mtime
    return found


def write_report(folder: str, name: str, text: str, check_mode: bool = False, euid: int | None = None) -> str:
    """Write a verify report as ``folder/name`` (0600, this user's, a new file renamed into place; the folder made
    0755 when missing); its path."""
    me = os.geteuid() if euid is None else euid
    path = os.path.join(folder, check_report_name(name))
    _write_private(path, text, me, REPORTS_SUBJECT, REPORTS_VARIABLE, check_mode)
    return path


def remove_reports(folder: str, names: Sequence[str], check_mode: bool = False) -> list[str]:
    """Remove the named reports from folder (never following a symlink: only verify-*.json names are removed, as
    the entries they are); the paths removed (or that would be)."""
    removed = []
    for name in names:
        path = os.path.join(folder, check_report_name(name))
        if not check_mode:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        removed.append(path)
    return removed
