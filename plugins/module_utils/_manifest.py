# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint manifests: hub metadata for one exact commit vs a local tree, stamp files, the denylist.

Private and pure (stdlib only): no network, no huggingface_hub. A manifest is what the hub says a commit
holds (every file with its size; the SHA-256 of every LFS file, the git blob id of the others). A local
tree is verified against it; a stamp file records a verified tree so that a re-run checks sizes and
modification times instead of hashing hundreds of GB again.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

STAMP_NAME = ".dgxspark-stamp.json"
STAMP_FORMAT = 1
# Folders and files in a local tree that are not checkpoint files: huggingface_hub's own local_dir
# metadata (.cache/huggingface), our partial downloads (.cache/dgxspark), the stamp.
IGNORED_TOP = (".cache", STAMP_NAME)
# One read per hash update: big enough that hashlib releases the GIL for nearly all the time spent hashing
# (it does for any update over 2 KiB) and that the read syscalls stay few; one buffer per file being hashed.
HASH_CHUNK = 16 * 1024 * 1024

# Repositories refused unless the user overrides it, with the reason shown.
DENYLIST: dict[str, str] = {
    "LibertAIDAI/GLM-5.3-Flash-NVFP4": (
        "its ModelOpt NVFP4 build hits an open vLLM bug (vllm-project/vllm issue #54150) that silently "
        "corrupts token IDs, visible only in non-English text and tool-call output; use "
        "RedHatAI/GLM-5.3-Flash-NVFP4 (the bug report's confirmed-clean control)"
    ),
}

# generation_config.json keys that are sampling values
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty")


class ManifestError(Exception):
    """Hub metadata or a stamp that cannot be used as it is."""


class DenylistedRepoError(ManifestError):
    """The repository is on the denylist and the override is off."""


class HashCancelledError(Exception):
    """A file's hashing stopped early because another file's check failed (never leaves files_match)."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str | None = None      # LFS files: the hub's lfs.sha256
    blob_id: str | None = None     # git blob id (sha1 of "blob <size>\\0" + content), for non-LFS files

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "blob_id": self.blob_id}


@dataclass(frozen=True)
class Manifest:
    repo: str
    commit: str
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def by_path(self) -> dict[str, FileEntry]:
        return {entry.path: entry for entry in self.files}

    def to_dict(self) -> dict[str, Any]:
        return {"repo": self.repo, "commit": self.commit, "total_bytes": self.total_bytes,
                "files": [entry.to_dict() for entry in self.files]}


def safe_relpath(path: str) -> str:
    """A repository file name that stays inside the tree, or ManifestError."""
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        raise ManifestError("unusable file name in hub metadata: %r" % (path,))
    norm = posixpath.normpath(path)
    if norm != path or path.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
        raise ManifestError("file name leaves the checkpoint directory: %r" % (path,))
    if norm.split("/", 1)[0] in IGNORED_TOP:
        raise ManifestError("file name collides with local bookkeeping (%s): %r" % ("/".join(IGNORED_TOP), path))
    return norm


def _is_commit(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value)


def manifest_from_model_info(info: Mapping[str, Any], repo: str | None = None) -> Manifest:
    """Hub model info (the JSON of /api/models/<repo>/revision/<rev>?blobs=true) -> Manifest.

    Siblings must carry sizes (files metadata requested); LFS siblings must carry lfs.sha256.
    """
    commit = info.get("sha")
    if not _is_commit(commit):
        raise ManifestError("hub metadata has no commit sha (got %r): cannot pin the revision" % (commit,))
    repo_id = repo or info.get("id") or info.get("modelId")
    if not repo_id:
        raise ManifestError("hub metadata names no repository")
    siblings = info.get("siblings")
    if not isinstance(siblings, list) or not siblings:
        raise ManifestError("hub metadata for %s@%s lists no files" % (repo_id, commit))
    files = []
    seen = set()
    for sib in siblings:
        name = safe_relpath(sib.get("rfilename"))
        if name in seen:
            raise ManifestError("hub metadata lists %s twice" % name)
        seen.add(name)
        size = sib.get("size")
        lfs = sib.get("lfs") or None
        if lfs is not None:
            sha = lfs.get("sha256")
            lfs_size = lfs.get("size", size)
            if not (isinstance(sha, str) and len(sha) == 64):
                raise ManifestError("LFS file %s has no sha256 in the hub metadata" % name)
            if size is None:
                size = lfs_size
            if lfs_size != size:
                raise ManifestError("LFS file %s: size %r and lfs.size %r disagree" % (name, size, lfs_size))
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError("file %s has no size in the hub metadata (were files metadata requested?)" % name)
        files.append(FileEntry(path=name, size=size, sha256=lfs.get("sha256").lower() if lfs else None,
                               blob_id=sib.get("blobId") if lfs is None else None))
    return Manifest(repo=repo_id, commit=commit, files=tuple(sorted(files, key=lambda e: e.path)))


def manifest_from_dict(data: Mapping[str, Any]) -> Manifest:
    """The inverse of Manifest.to_dict (a manifest handed from one node to another)."""
    try:
        files = tuple(sorted((FileEntry(path=safe_relpath(f["path"]), size=int(f["size"]),
                                        sha256=f.get("sha256"), blob_id=f.get("blob_id"))
                              for f in data["files"]), key=lambda e: e.path))
        repo, commit = data["repo"], data["commit"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError("not a manifest: %s" % exc) from exc
    if not _is_commit(commit):
        raise ManifestError("manifest commit %r is not a 40-hex commit id" % (commit,))
    return Manifest(repo=repo, commit=commit, files=files)


# ---------------------------------------------------------------------------------------- denylist

def denylist_reason(repo: str, denylist: Mapping[str, str] | None = None) -> str | None:
    table = DENYLIST if denylist is None else denylist
    wanted = repo.strip().lower()
    for name, reason in table.items():
        if name.lower() == wanted:
            return reason
    return None


def check_denylist(repo: str, allow: bool = False, denylist: Mapping[str, str] | None = None) -> str | None:
    """Raise DenylistedRepoError for a denylisted repo unless allowed; return the reason (or None)."""
    reason = denylist_reason(repo, denylist)
    if reason and not allow:
        raise DenylistedRepoError("refusing %s: %s. Set checkpoint_allow_denylisted (module option "
                                  "allow_denylisted) to stage it anyway." % (repo, reason))
    return reason


# ---------------------------------------------------------------------------------------- hashing

def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (a container's cpuset), else all."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def hash_workers(workers: int | None, jobs: int) -> int:
    """Threads for jobs files: workers when given, else one per available CPU; never more than jobs, at least 1."""
    if workers is not None and workers < 1:
        raise ValueError("workers must be at least 1, got %r" % (workers,))
    wanted = available_cpus() if workers is None else workers
    return max(1, min(wanted, jobs))


def _advise_sequential(fd: int) -> None:
    """Tell the kernel the file is read once front to back (a larger read-ahead window), where it listens."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


def _digest_file(path: str, digest: Any, cancel: threading.Event | None = None) -> str:
    """Feed the file at path to digest and return its hex digest.

    Reads go into one reused buffer of up to HASH_CHUNK bytes (readinto, no copies); both the read and the
    hash update release the GIL, so threads hashing different files run in parallel. cancel set stops the
    loop at the next chunk with HashCancelledError.
    """
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        _advise_sequential(fd)
        buffer = bytearray(max(1, min(HASH_CHUNK, os.fstat(fd).st_size)))
        view = memoryview(buffer)
        while True:
            if cancel is not None and cancel.is_set():
                raise HashCancelledError(path)
            count = handle.readinto(view)
            if not count:
                break
            digest.update(view[:count])
    return digest.hexdigest()


def git_blob_id(path: str, size: int, cancel: threading.Event | None = None) -> str:
    digest = hashlib.sha1(b"blob %d\x00" % size)  # noqa: S324 - git's object id, not a security use
    return _digest_file(path, digest, cancel)


def sha256_file(path: str, cancel: threading.Event | None = None) -> str:
    return _digest_file(path, hashlib.sha256(), cancel)


def file_matches(path: str, entry: FileEntry, cancel: threading.Event | None = None) -> str | None:
    """None when the file on disk is entry; otherwise 'missing', 'wrong_size' or 'wrong_hash'."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "missing"
    if size != entry.size:
        return "wrong_size"
    if entry.sha256:
        return None if sha256_file(path, cancel) == entry.sha256 else "wrong_hash"
    if entry.blob_id:
        return None if git_blob_id(path, size, cancel) == entry.blob_id else "wrong_hash"
    return None


def files_match(checks: Sequence[tuple[str, FileEntry]], workers: int | None = None) -> list[str | None]:
    """file_matches for every (path, entry) of checks, hashed in parallel; the verdicts in the order of checks.

    workers threads (default: one per available CPU) take the largest files first, so the pool ends balanced
    instead of waiting on one big shard started last. When a file's check raises (permission denied, an
    I/O error), the files not started yet are not hashed, those being hashed stop at their next
    chunk, and the error is raised: the first by position in checks among those that failed.
    """
    count = hash_workers(workers, len(checks))
    if count == 1:
        return [file_matches(path, entry) for path, entry in checks]
    cancel = threading.Event()
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="dgxspark-hash") as pool:
        futures = {i: pool.submit(file_matches, checks[i][0], checks[i][1], cancel)
                   for i in largest_first([check[1].size for check in checks])}
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        if any(_failure(future) for future in futures.values()):
            cancel.set()
            for future in futures.values():
                future.cancel()
    for i in range(len(checks)):
        error = _failure(futures[i])
        if error is not None:
            raise error
    return [futures[i].result() for i in range(len(checks))]


def largest_first(sizes: Sequence[int]) -> list[int]:
    """Indexes of sizes, largest first; equal sizes keep their order."""
    return sorted(range(len(sizes)), key=lambda i: -sizes[i])


def _failure(future: Future) -> BaseException | None:
    """The exception a finished check raised (a check stopped by cancellation does not count), else None."""
    if not future.done() or future.cancelled():
        return None
    error = future.exception()
    return None if isinstance(error, HashCancelledError) else error


# ---------------------------------------------------------------------------------------- verify

@dataclass
class VerifyResult:
    good: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    wrong_size: list[str] = field(default_factory=list)
    wrong_hash: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    hashed_bytes: int = 0

    @property
    def ok(self) -> bool:
        """Every manifest file is present and correct (extra files do not make a tree bad)."""
        return not (self.missing or self.wrong_size or self.wrong_hash)

    @property
    def bad(self) -> list[str]:
        return sorted(self.missing + self.wrong_size + self.wrong_hash)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "good": sorted(self.good), "missing": sorted(self.missing),
                "wrong_size": sorted(self.wrong_size), "wrong_hash": sorted(self.wrong_hash),
                "extra": sorted(self.extra), "hashed_bytes": self.hashed_bytes}


def list_tree(root: str) -> list[str]:
    """Relative paths of the files under root (following symlinks to files), bookkeeping left out."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in IGNORED_TOP]
            filenames = [f for f in filenames if f not in IGNORED_TOP]
        for name in filenames:
            rel = name if rel_dir == "." else posixpath.join(rel_dir.replace(os.sep, "/"), name)
            found.append(rel)
    return sorted(found)


def verify_tree(root: str, manifest: Manifest, trusted: Mapping[str, tuple[int, int]] | None = None,
                workers: int | None = None) -> VerifyResult:
    """Check every manifest file under root: size always, content hash unless trusted.

    trusted maps a path to the (size, mtime_ns) recorded when it was last hashed good (from a stamp); a file
    whose size and mtime_ns still match is counted good without hashing. The files left to hash are hashed
    in parallel (files_match, workers threads); every list keeps the manifest's order.
    """
    trusted = trusted or {}
    status = {entry.path: _stat_status(os.path.join(root, entry.path), entry, trusted) for entry in manifest.files}
    to_hash = [entry for entry in manifest.files if status[entry.path] == "hash"]
    verdicts = files_match([(os.path.join(root, entry.path), entry) for entry in to_hash], workers)
    result = VerifyResult()
    for entry, verdict in zip(to_hash, verdicts):
        status[entry.path] = "good" if verdict is None else "wrong_hash"
        result.hashed_bytes += entry.size
    for entry in manifest.files:
        getattr(result, status[entry.path]).append(entry.path)
    if os.path.isdir(root):
        expected = manifest.by_path()
        result.extra = [p for p in list_tree(root) if p not in expected]
    return result


def _stat_status(path: str, entry: FileEntry, trusted: Mapping[str, tuple[int, int]]) -> str:
    """What the file's metadata alone says: 'missing', 'wrong_size', 'good' (trusted, unchanged) or 'hash'."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    if st.st_size != entry.size:
        return "wrong_size"
    if trusted.get(entry.path) == (st.st_size, st.st_mtime_ns):
        return "good"
    return "hash"


# ---------------------------------------------------------------------------------------- stamp

def stamp_path(root: str) -> str:
    return os.path.join(root, STAMP_NAME)


def build_stamp(root: str, manifest: Manifest, now: float | None = None) -> dict[str, Any]:
    """The stamp of a verified tree: repo, commit, every file with size and mtime_ns, the time."""
    files = {}
    for entry in manifest.files:
        st = os.stat(os.path.join(root, entry.path))
        files[entry.path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                             "sha256": entry.sha256, "blob_id": entry.blob_id}
    return {"format": STAMP_FORMAT, "repo": manifest.repo, "commit": manifest.commit,
            "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
            "total_bytes": manifest.total_bytes, "files": files}


def write_stamp(root: str, manifest: Manifest, now: float | None = None) -> dict[str, Any]:
    stamp = build_stamp(root, manifest, now)
    tmp = stamp_path(root) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(stamp, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, stamp_path(root))
    return stamp


def read_stamp(root: str) -> dict[str, Any] | None:
    """The stamp in root, or None when there is none or it is unreadable (an unreadable stamp is no stamp)."""
    try:
        with open(stamp_path(root), encoding="utf-8") as handle:
            data = json.load(handle)
    except (FileNotFoundError, ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def remove_stamp(root: str) -> None:
    try:
        os.unlink(stamp_path(root))
    except FileNotFoundError:
        pass


def stamp_trusted(stamp: Mapping[str, Any] | None, manifest: Manifest) -> dict[str, tuple[int, int]]:
    """Per-file (size, mtime_ns) a stamp vouches for, for this manifest only.

    A stamp for another repo, another commit or another format vouches for nothing; a file whose expected
    size or hash differs from what the stamp recorded is not vouched for.
    """
    if not stamp or stamp.get("format") != STAMP_FORMAT:
        return {}
    if stamp.get("repo") != manifest.repo or stamp.get("commit") != manifest.commit:
        return {}
    files = stamp.get("files") or {}
    trusted = {}
    for entry in manifest.files:
        rec = files.get(entry.path)
        if not isinstance(rec, dict):
            continue
        if rec.get("size") != entry.size or rec.get("sha256") != entry.sha256 or rec.get("blob_id") != entry.blob_id:
            continue
        try:
            trusted[entry.path] = (int(rec["size"]), int(rec["mtime_ns"]))
        except (KeyError, TypeError, ValueError):
            continue
    return trusted


def stamp_valid(root: str, manifest: Manifest, stamp: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """(valid, reason): does the stamp vouch for every file of manifest, as it is on disk now?"""
    stamp = read_stamp(root) if stamp is None else stamp
    if not stamp:
        return False, "no stamp"
    if stamp.get("repo") != manifest.repo or stamp.get("commit") != manifest.commit:
        return False, "stamp is for %s@%s" % (stamp.get("repo"), stamp.get("commit"))
    trusted = stamp_trusted(stamp, manifest)
    for entry in manifest.files:
        try:
            st = os.stat(os.path.join(root, entry.path))
        except FileNotFoundError:
            return False, "%s is missing" % entry.path
        if trusted.get(entry.path) != (st.st_size, st.st_mtime_ns):
            return False, "%s changed since it was verified" % entry.path
    return True, "stamp matches every file"


def sampling_values(generation_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampling values a checkpoint's generation_config.json sets."""
    return {k: generation_config[k] for k in SAMPLING_KEYS if generation_config and k in generation_config}


def sampling_conflicts(generation_config: Mapping[str, Any] | None, intended: Mapping[str, Any] | None) -> list[str]:
    """Readable conflicts between the sampling values the inventory intends and the checkpoint's own."""
    own = sampling_values(generation_config)
    problems = []
    for key, value in sorted((intended or {}).items()):
        if key not in own:
            problems.append("%s=%r is set in inventory but the checkpoint's generation_config.json sets no %s"
                            % (key, value, key))
        elif own[key] != value:
            problems.append("%s=%r in inventory contradicts the checkpoint's %s=%r" % (key, value, key, own[key]))
    return problems
