# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage one checkpoint commit on this node: resolve, download (huggingface_hub), verify, stamp.

The thin adapter between _manifest (pure) and huggingface_hub, which is imported lazily so that the rest
of the collection (and check mode with a given manifest) works without it. Downloads go through
huggingface_hub's own HTTP layer (HfApi.model_info, hf_hub_url, http_get: the hub protocol, auth headers,
HF_ENDPOINT, in-run retries with HTTP Range), into partial files this module keeps between runs, so an
interrupted run resumes where it stopped (huggingface_hub itself discards its partial files on failure).

The staged folder (local_dir, or the hub cache folder) is checked before anything is asked of the hub: every level
root's, no symlink, nobody else can write (_safe_paths); missing levels are made root's, mode 0755. Everything
written below it goes through _safe_paths.SafeTree: no symlink is followed, nothing is unlinked or renamed through a
resolved path.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Callable

from ansible_collections.dgxspark.vllm.plugins.module_utils import _checkpoint_store as cs
from ansible_collections.dgxspark.vllm.plugins.module_utils import _manifest as mf
from ansible_collections.dgxspark.vllm.plugins.module_utils import _safe_paths as sp
from ansible_collections.dgxspark.vllm.plugins.module_utils._units import human_bytes

PART_SUFFIX = ".dgxspark-part"
DISK_MARGIN_BYTES = 1 << 30


class StageError(Exception):
    """A staging failure with a message a user can act on."""


class HubLibraryMissingError(StageError):
    pass


def import_hub() -> Any:
    try:
        import huggingface_hub  # pylint: disable=import-outside-toplevel
        from huggingface_hub import file_download  # noqa: F401  pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise HubLibraryMissingError(
            "huggingface_hub is not importable by the Python that runs this module (%s). The checkpoint role "
            "installs it into a venv on the node (checkpoint_venv) from PyPI or from a wheelhouse pushed from the "
            "controller (checkpoint_wheelhouse); point ansible_python_interpreter for this task at that venv." % exc
        ) from exc
    return huggingface_hub


@dataclass
class Layout:
    """Where the files of one commit live on disk, and where their partial downloads are kept."""
    kind: str
    root: str                   # the tree that is verified (local_dir, or snapshots/<commit>)
    repo_cache: str | None = None

    def file_path(self, entry: mf.FileEntry) -> str:
        return os.path.join(self.root, entry.path)

    def part_path(self, entry: mf.FileEntry) -> str:
        if self.kind == "hf_cache":
            return os.path.join(self.blob_path(entry) + PART_SUFFIX)
        return os.path.join(self.root, ".cache", "dgxspark", entry.path + PART_SUFFIX)

    def blob_path(self, entry: mf.FileEntry) -> str:
        return os.path.join(self.repo_cache or "", "blobs", entry.sha256 or entry.blob_id or "")

    def final_path(self, entry: mf.FileEntry) -> str:
        """Where a finished download is moved (the blob in HF-cache layout)."""
        return self.blob_path(entry) if self.kind == "hf_cache" else self.file_path(entry)


def make_layout(kind: str, manifest: mf.Manifest, local_dir: str | None, cache_dir: str | None) -> Layout:
    if kind == "local_dir":
        if not local_dir:
            raise StageError("layout local_dir needs local_dir (checkpoint path)")
        return Layout(kind, os.path.abspath(local_dir))
    if kind == "hf_cache":
        if not cache_dir:
            raise StageError("layout hf_cache needs cache_dir (the HF hub cache, e.g. $HF_HOME/hub)")
        repo_cache = os.path.join(os.path.abspath(cache_dir), "models--" + manifest.repo.replace("/", "--"))
        return Layout(kind, os.path.join(repo_cache, "snapshots", manifest.commit), repo_cache)
    raise StageError("unknown layout %r" % kind)


def fetch_manifest(repo: str, revision: str, endpoint: str | None, token: str | None,
                   timeout: float = 30.0) -> mf.Manifest:
    """Resolve revision to a commit and read every file's size and hash from the hub."""
    hub = import_hub()
    api = hub.HfApi(endpoint=endpoint, token=token or False)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=timeout)
    except Exception as exc:  # huggingface_hub raises many kinds; all end the same way here
        raise StageError("cannot read %s@%s from the hub at %s: %s: %s" % (
            repo, revision, endpoint or "huggingface.co", type(exc).__name__, exc)) from exc
    siblings = []
    for sib in info.siblings or []:
        lfs = getattr(sib, "lfs", None)
        siblings.append({"rfilename": sib.rfilename, "size": sib.size, "blobId": sib.blob_id,
                         "lfs": {"sha256": lfs.sha256, "size": lfs.size} if lfs else None})
    return mf.manifest_from_model_info({"id": info.id or repo, "sha": info.sha, "siblings": siblings}, repo=repo)


class Progress:
    """Writes bytes done / total / rate to a JSON status file (atomically), at most every interval seconds."""

    def __init__(self, path: str | None, bytes_total: int, files_total: int, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.bytes_total = bytes_total
        self.files_total = files_total
        self.bytes_done = 0
        self.files_done = 0
        self.current = ""
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.last_write = 0.0

    def add(self, nbytes: int) -> None:
        self.bytes_done += nbytes
        now = self.clock()
        if now - self.last_write >= self.interval:
            self.write("downloading")

    def write(self, state: str) -> None:
        self.last_write = self.clock()
        if not self.path:
            return
        elapsed = max(self.last_write - self.started, 1e-6)
        data = {"state": state, "file": self.current, "files_done": self.files_done, "files_total": self.files_total,
                "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "rate_bytes_per_s": int(self.bytes_done / elapsed), "elapsed_s": round(elapsed, 1),
                "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data["summary"] = progress_summary(data)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, self.path)


def progress_summary(data: dict[str, Any]) -> str:
    """One line of a download's progress: state, bytes done / total (percent) at the mean rate, files done / total
    and the file now downloading."""
    done, total = int(data.get("bytes_done") or 0), int(data.get("bytes_total") or 0)
    percent = 100.0 * done / max(total, 1)
    line = (f"{data.get('state', 'resolving')} {human_bytes(done)} / {human_bytes(total)} ({percent:.1f} %) at "
            f"{human_bytes(int(data.get('rate_bytes_per_s') or 0))}/s, file {data.get('files_done', 0)}/"
            f"{data.get('files_total', 0)}")
    return f"{line} {data['file']}" if data.get("file") else line


class _CountingFile:
    """The file object http_get writes to, counting bytes for the progress file."""

    def __init__(self, handle: Any, progress: Progress) -> None:
        self._handle = handle
        self._progress = progress

    def write(self, data: bytes) -> int:
        written = self._handle.write(data)
        self._progress.add(len(data))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def download_one(repo: str, commit: str, entry: mf.FileEntry, part: str, endpoint: str | None,
                 token: str | None, progress: Progress, tree: sp.SafeTree) -> None:
    """Download entry into part, continuing from what part already holds (HTTP Range); part is opened below the
    tree's folder without following a symlink."""
    hub = import_hub()
    from huggingface_hub import file_download  # pylint: disable=import-outside-toplevel
    tree.makedirs(os.path.dirname(part))
    have = tree.size(part)
    if have > entry.size:
        tree.unlink(part)
        have = 0
    url = hub.hf_hub_url(repo, entry.path, revision=commit, endpoint=endpoint)
    headers = hub.utils.build_hf_headers(token=token or False)
    headers["Accept-Encoding"] = "identity"
    progress.add(0)
    with tree.open_append(part) as handle:
        try:
            file_download.http_get(url, _CountingFile(handle, progress), resume_size=have, headers=headers,
                                   expected_size=entry.size, displayed_filename=entry.path)
        except Exception as exc:
            handle.flush()
            kept = handle.tell()
            raise StageError("download of %s stopped at %d of %d bytes (%s: %s); the partial file is kept "
                             "at %s and the next run resumes from there" % (
                                 entry.path, kept, entry.size, type(exc).__name__, exc, part)) from exc


def _link_snapshot(layout: Layout, entry: mf.FileEntry, tree: sp.SafeTree) -> bool:
    """HF-cache layout: snapshots/<commit>/<file> -> ../../blobs/<etag> (relative). True when changed. The entry
    there (a link or a file) is replaced itself; nothing it points to is touched."""
    link = layout.file_path(entry)
    target = os.path.relpath(layout.blob_path(entry), os.path.dirname(link))
    if tree.readlink(link) == target:
        return False
    info = tree.lstat(link)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise StageError("%s is a folder where the snapshot's link to its blob belongs: remove it and run again" % link)
    tree.symlink(target, link)
    return True


@dataclass
class StageResult:
    manifest: mf.Manifest
    root: str
    verify: mf.VerifyResult
    changed: bool = False
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    refetched: list[str] = field(default_factory=list)
    would_download: list[str] = field(default_factory=list)
    would_download_bytes: int = 0
    stamp_valid_before: bool = False
    stamp_reason: str = ""
    copy_root: str = ""                 # what a copy from another node is relative to (repo cache, or the tree)
    copy_paths: list[str] = field(default_factory=list)   # the files to copy there (would_download's)
    generation_config: dict[str, Any] | None = None
    denylist_reason: str | None = None
    store: dict[str, Any] = field(default_factory=dict)   # keep_commits: what _checkpoint_store.select did


def stage(*, repo: str, revision: str, layout_kind: str, local_dir: str | None, cache_dir: str | None,
          endpoint: str | None, token: str | None, download: bool, full_verify: bool, check_mode: bool,
          allow_denylisted: bool = False, manifest: mf.Manifest | None = None, progress_path: str | None = None,
          progress_interval: float = 1.0, min_free_bytes: int = DISK_MARGIN_BYTES,
          workers: int | None = None, trusted_uids: Collection[int] | None = None,
          folder_variable: str = "", keep_commits: bool = False) -> StageResult:
    """Verify (and with download, complete) one commit's tree; workers threads hash files (default: per CPU).

    First of all (before the hub is asked), the staged folder (local_dir, or cache_dir) is checked: every existing
    level owned by root or trusted_uids (default: root and the running user), no symlink, not writable by others
    (StageError otherwise, naming the level and the fix); its missing levels are made (mode 0755) unless
    check_mode. folder_variable names the setting in the messages (default: the option, local_dir or cache_dir).

    keep_commits (local_dir): once the revision is resolved, the commit is selected at local_dir from the store beside
    it (_checkpoint_store.select): another verified commit there is parked whole, the wanted one brought back when it
    is parked (nothing downloaded), so every verified commit stays staged."""
    reason = mf.check_denylist(repo, allow_denylisted)
    anchor = local_dir if layout_kind == "local_dir" else cache_dir
    if anchor:
        trusted = set(trusted_uids or ()) | {0, os.geteuid()}
        subject = "the model folder" if layout_kind == "local_dir" else "the hub cache folder"
        variable = folder_variable or ("local_dir" if layout_kind == "local_dir" else "cache_dir")
        try:
            sp.ensure_folder(os.path.abspath(anchor), trusted, subject, variable, create=not check_mode)
        except sp.UnsafePathError as exc:
            raise StageError(str(exc)) from exc
    if manifest is None:
        manifest = fetch_manifest(repo, revision, endpoint, token)
    elif manifest.repo != repo:
        raise StageError("the given manifest is for %s, not %s" % (manifest.repo, repo))
    selection: dict[str, Any] = {}
    root_dir = local_dir
    if keep_commits and layout_kind == "local_dir" and local_dir:
        try:
            selection = cs.select(os.path.abspath(local_dir), manifest.repo, manifest.commit, check_mode)
            if not check_mode:
                sp.ensure_folder(os.path.abspath(local_dir), trusted, subject, variable, create=True)
        except cs.StoreError as exc:
            raise StageError(str(exc)) from exc
        except sp.UnsafePathError as exc:
            raise StageError(str(exc)) from exc
        root_dir = selection["root"]
    layout = make_layout(layout_kind, manifest, root_dir, cache_dir)
    tree = sp.SafeTree(os.path.abspath(str(anchor)))
    try:
        out = _stage(repo, revision, layout, tree, manifest, reason, endpoint, token, download, full_verify,
                     check_mode, progress_path, progress_interval, min_free_bytes, workers)
    except sp.UnsafePathError as exc:
        raise StageError(str(exc)) from exc
    out.store = selection
    out.changed = out.changed or (bool(selection.get("changed")) and not check_mode)
    return out


def _stage(repo: str, revision: str, layout: Layout, tree: sp.SafeTree, manifest: mf.Manifest, reason: str | None,
           endpoint: str | None, token: str | None, download: bool, full_verify: bool, check_mode: bool,
           progress_path: str | None, progress_interval: float, min_free_bytes: int,
           workers: int | None) -> StageResult:
    stamp = mf.read_stamp(layout.root)
    valid, why = mf.stamp_valid(layout.root, manifest, stamp)
    trusted = {} if full_verify else mf.stamp_trusted(stamp, manifest)
    result = mf.verify_tree(layout.root, manifest, trusted, workers)
    out = StageResult(manifest=manifest, root=layout.root, verify=result, stamp_valid_before=valid,
                      stamp_reason=why, denylist_reason=reason)
    needed = [e for e in manifest.files if e.path in set(result.bad)]
    if layout.kind == "hf_cache":
        # a snapshot link may be missing while its blob is already there (another revision, same content, or
        # blobs copied from another node); a file linked now counts as verified (its blob was just hashed)
        unlinked = [e for e in needed if e.path in result.missing]
        verdicts = mf.files_match([(layout.blob_path(e), e) for e in unlinked], workers)
        linked: dict[str, tuple[int, int]] = {}
        for entry, verdict in zip(unlinked, verdicts):
            if verdict is None:
                needed.remove(entry)
                if not check_mode:
                    _link_snapshot(layout, entry, tree)
                    out.changed = True
                    st = os.stat(layout.file_path(entry))
                    linked[entry.path] = (st.st_size, st.st_mtime_ns)
        if linked:
            trusted_linked = _trusted_after(layout, result)
            trusted_linked.update(linked)
            out.verify = result = mf.verify_tree(layout.root, manifest, trusted_linked, workers)
    out.would_download = [e.path for e in needed]
    out.copy_root = (layout.repo_cache or "") if layout.kind == "hf_cache" else layout.root
    out.copy_paths = [os.path.relpath(layout.final_path(e), out.copy_root) for e in needed]
    out.would_download_bytes = sum(e.size for e in needed)
    if needed and download and not check_mode:
        fresh = _download_all(layout, tree, manifest, needed, endpoint, token, progress_path, progress_interval,
                              min_free_bytes, out)
        trusted_now = _trusted_after(layout, result)
        trusted_now.update(fresh)
        out.verify = mf.verify_tree(layout.root, manifest, trusted_now, workers)
    if out.verify.ok and not check_mode:
        if layout.kind == "hf_cache" and revision != manifest.commit:
            ref = os.path.join(layout.repo_cache or "", "refs", revision)
            if _read_text(tree, ref) != manifest.commit:
                tree.write_text(ref, manifest.commit)
                out.changed = True
        if not mf.stamp_valid(layout.root, manifest)[0]:
            stamp_text = json.dumps(mf.build_stamp(layout.root, manifest), indent=1, sort_keys=True) + "\n"
            tree.write_text(mf.stamp_path(layout.root), stamp_text)
            out.changed = True
    if out.verify.ok:
        out.generation_config = _read_json(os.path.join(layout.root, "generation_config.json"))
    return out


def _trusted_after(layout: Layout, before: mf.VerifyResult) -> dict[str, tuple[int, int]]:
    """Files verified good before the download keep their verdict (no second hash of hundreds of GB)."""
    trusted = {}
    for path in before.good:
        st = os.stat(os.path.join(layout.root, path))
        trusted[path] = (st.st_size, st.st_mtime_ns)
    return trusted


def _download_all(layout: Layout, tree: sp.SafeTree, manifest: mf.Manifest, needed: list[mf.FileEntry],
                  endpoint: str | None, token: str | None, progress_path: str | None, interval: float, min_free: int,
                  out: StageResult) -> dict[str, tuple[int, int]]:
    """Download every needed file (each hashed once, as a partial file); return what was hashed good."""
    fresh = {}
    bad_before = set(out.verify.wrong_size + out.verify.wrong_hash)
    tree.makedirs(layout.root)
    remaining = 0
    for entry in needed:
        part = layout.part_path(entry)
        remaining += entry.size - tree.size(part)
    free = shutil.disk_usage(layout.root).free
    if free < remaining + min_free:
        raise StageError("not enough free disk under %s: %d bytes free, %d still to download plus a %d-byte margin"
                         % (layout.root, free, remaining, min_free))
    progress = Progress(progress_path, out.would_download_bytes, len(needed), interval)
    for entry in needed:
        progress.current = entry.path
        final = layout.final_path(entry)
        part = layout.part_path(entry)
        tree.makedirs(os.path.dirname(final))
        if entry.path in bad_before and tree.lstat(layout.file_path(entry)) is not None:
            _set_aside(tree, final, part, entry)
            out.refetched.append(entry.path)
        for attempt in (1, 2):
            progress.add(tree.size(part))
            download_one(manifest.repo, manifest.commit, entry, part, endpoint, token, progress, tree)
            if mf.file_matches(part, entry) is None:
                break
            # resumed from a bad prefix (or the hub sent bad bytes): start over once, then give up
            tree.unlink(part)
            if attempt == 2:
                raise StageError("%s does not match the hub's hash for %s@%s after a fresh download"
                                 % (entry.path, manifest.repo, manifest.commit))
        tree.replace(part, final)
        if layout.kind == "hf_cache":
            _link_snapshot(layout, entry, tree)
        st = os.stat(layout.file_path(entry))
        fresh[entry.path] = (st.st_size, st.st_mtime_ns)
        out.downloaded.append(entry.path)
        out.downloaded_bytes += entry.size
        out.changed = True
        progress.files_done += 1
    progress.write("done")
    return fresh


def _set_aside(tree: sp.SafeTree, final: str, part: str, entry: mf.FileEntry) -> None:
    """A file that failed verification: a short regular one is kept as the start of the download (resumed, then
    hashed); anything else is removed and fetched again from byte 0. final is the file itself (local_dir) or the
    entry's own blob (hf_cache: the snapshot's link is replaced after the download): never what a link resolves to,
    so a planted symlink is removed itself and its target is left alone."""
    info = tree.lstat(final)
    if info is None:
        return
    if stat.S_ISREG(info.st_mode) and info.st_size < entry.size and tree.lstat(part) is None:
        tree.replace(final, part)
    elif not stat.S_ISDIR(info.st_mode):
        tree.unlink(final)
    else:
        raise StageError("%s is a folder where the file %s belongs: remove it and run again" % (final, entry.path))


def _read_text(tree: sp.SafeTree, path: str) -> str | None:
    """A small regular file's text (stripped) below the tree, None when missing or not a regular file."""
    info = tree.lstat(path)
    if info is None or not stat.S_ISREG(info.st_mode):
        return None
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read().strip()


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
