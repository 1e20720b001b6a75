#!/usr/bin/env python3
"""A small Hugging Face Hub stand-in for the lab: serves local folders as model repos (stdlib only).

    hub.py serve --root DIR [--host H] [--port P] [--token T]
    hub.py make-random DIR --shards 4 --shard-mib 16 [--seed 0]

Repos are DIR/<org>/<name>/ (any files, nested folders allowed). Each folder is one commit, a 40-hex id derived from
its content: DIR/<org>/<name>/ is served under the revision `main` and under its commit id; a folder
DIR/<org>/<name>@<label>/ is another commit of the same repo, served under its commit id only (an older or newer
revision next to `main`). Speaks the part of the hub protocol huggingface_hub uses to read a model repo:

  GET  /api/models/<repo>[/revision/<rev>]   model info; `?blobs=true` adds size, blobId, lfs{sha256,size}
  GET  /api/models/<repo>/tree/<rev>[/<dir>] `?recursive=true`: files (oid, size, lfs) and folders, one page
  HEAD|GET /<repo>/resolve/<rev>/<file>     ETag, X-Repo-Commit, X-Linked-Etag/X-Linked-Size (LFS files),
                                             Content-Length, Accept-Ranges; `Range: bytes=a-[b]` -> 206
  errors as the hub sends them: 404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound,
  401 when --token is set and the request does not carry `Authorization: Bearer <token>`.

Lab controls (not hub protocol), JSON:
  PUT    /_lab/fault   {"mode": "drop_after"|"cut_at", "bytes": N, "match": "<fnmatch of file path>",
                        "times": K}   drop_after: a response body is cut (connection closed) after N bytes;
                        cut_at: nothing past byte offset N of the file is ever sent (a request starting at or
                        beyond N is cut right after its headers). times: how many cut responses (-1: no limit).
  DELETE /_lab/fault   back to normal          GET /_lab/stats   {"body_bytes": ..., "requests": [...]}
  POST   /_lab/reset   clear stats             POST /_lab/rescan re-read DIR (hashes cached by size+mtime)
  GET    /_lab/repos   {repo: main's commit}   GET  /_lab/commits  {repo: {"main"|<label>: commit}}

Not implemented: uploads/commits, branches other than main, tags, refs/pr, pagination (one page),
`expand`, xet, datasets and spaces, gated repos, redirects to a CDN (files are served directly).
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".npz", ".ckpt")
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 1 << 20


def is_lfs(path, size):
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


class Repos:
    def __init__(self, root):
        self.root = root
        self.lock = threading.Lock()
        self.cache = {}   # abs path -> (size, mtime_ns, sha256, blob_id)
        self.repos = {}
        self.rescan()

    def _hashes(self, path, st):
        key = (st.st_size, st.st_mtime_ns)
        hit = self.cache.get(path)
        if hit and hit[:2] == key:
            return hit[2], hit[3]
        sha, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\x00" % st.st_size)
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                sha.update(chunk)
                blob.update(chunk)
        self.cache[path] = key + (sha.hexdigest(), blob.hexdigest())
        return sha.hexdigest(), blob.hexdigest()

    def _commit(self, base):
        files = {}
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".git"))
            for fname in sorted(filenames):
                full = os.path.join(dirpath, fname)
                rel = os.path.relpath(full, base).replace(os.sep, "/")
                st = os.stat(full)
                sha, blob = self._hashes(full, st)
                files[rel] = {"path": full, "size": st.st_size, "sha256": sha, "blob": blob,
                              "lfs": is_lfs(rel, st.st_size)}
        commit = hashlib.sha1("".join("%s\0%s\n" % (p, f["sha256"]) for p, f in sorted(files.items()))
                              .encode()).hexdigest()
        return {"commit": commit, "files": files}

    def rescan(self):
        repos, others = {}, []
        for org in sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []:
            for name in sorted(os.listdir(os.path.join(self.root, org))):
                base = os.path.join(self.root, org, name)
                if not os.path.isdir(base):
                    continue
                if "@" in name:
                    others.append((org, name))
                    continue
                repo = self._commit(base)
                repo["commits"] = {repo["commit"]: repo}
                repo["labels"] = {"main": repo["commit"]}
                repos["%s/%s" % (org, name)] = repo
        for org, name in others:   # another commit of a repo whose main folder is there
            plain, _, label = name.partition("@")
            repo = repos.get("%s/%s" % (org, plain))
            if repo is not None:
                other = self._commit(os.path.join(self.root, org, name))
                repo["commits"][other["commit"]] = other
                repo["labels"][label] = other["commit"]
        with self.lock:
            self.repos = repos


class Lab:
    def __init__(self):
        self.lock = threading.Lock()
        self.fault = None
        self.body_bytes = 0
        self.requests = []

    def take_fault(self, path):
        """The fault to apply to this response (and count it), or None."""
        with self.lock:
            fault = self.fault
            if not fault or not fnmatch.fnmatch(path, fault.get("match", "*")):
                return None
            if fault.get("times", -1) == 0:
                return None
            return dict(fault)

    def used_fault(self):
        with self.lock:
            if self.fault and self.fault.get("times", -1) > 0:
                self.fault["times"] -= 1

    def record(self, entry):
        with self.lock:
            self.body_bytes += entry.get("sent", 0)
            self.requests.append(entry)
            del self.requests[:-1000]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "dgxspark-lab-hub/1"
    repos = None
    lab = None
    token = None

    def log_message(self, fmt, *args):  # one line per request on stderr, as http.server does, but terse
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    # ---------------------------------------------------------------------------------------------- helpers
    def _send(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status, data, headers=None):
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status, code, message):
        self._json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self):
        if not self.token:
            return True
        if self.headers.get("Authorization", "") == "Bearer " + self.token:
            return True
        self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
        return False

    def _repo(self, repo_id, rev):
        repo = self.repos.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        found = repo["commits"].get(repo["commit"] if rev == "main" else rev)
        if found is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
            return None
        return found

    # ---------------------------------------------------------------------------------------------- routes
    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def do_PUT(self):
        self._route()

    def do_POST(self):
        self._route()

    def do_DELETE(self):
        self._route()

    def _route(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        try:
            if parts[:1] == ["_lab"]:
                return self._lab_route(parts[1:])
            if self.command not in ("GET", "HEAD"):
                return self._error(405, "MethodNotAllowed", "read-only hub")
            if not self._authorized():
                return None
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = "/".join(parts[2:4])
                rest = parts[4:]
                if not rest:
                    return self._model_info(repo_id, "main", query)
                if rest[0] == "revision" and len(rest) == 2:
                    return self._model_info(repo_id, rest[1], query)
                if rest[0] == "tree" and len(rest) >= 2:
                    return self._tree(repo_id, rest[1], "/".join(rest[2:]), query)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            return self._error(404, "EntryNotFound", "no route for %s" % url.path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return None

    def _model_info(self, repo_id, rev, query):
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path, f in sorted(repo["files"].items()):
            sib = {"rfilename": path}
            if blobs:
                sib.update(size=f["size"], blobId=f["blob"])
                if f["lfs"]:
                    sib["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
            siblings.append(sib)
        self._json(200, {"_id": repo["commit"][:24], "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0],
                         "sha": repo["commit"], "lastModified": "2026-01-01T00:00:00.000Z", "private": False,
                         "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [],
                         "library_name": "transformers", "siblings": siblings})

    def _tree(self, repo_id, rev, sub, query):
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        entries, folders = [], set()
        for path, f in sorted(repo["files"].items()):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix):]
            if "/" in rel and not recursive:
                folders.add(prefix + rel.split("/", 1)[0])
                continue
            if recursive:
                bits = rel.split("/")[:-1]
                for i in range(1, len(bits) + 1):
                    folders.add(prefix + "/".join(bits[:i]))
            entry = {"type": "file", "oid": f["blob"], "size": f["size"], "path": path}
            if f["lfs"]:
                entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0, "path": p}
                    for p in sorted(folders)]
        if prefix and not entries:
            return self._error(404, "EntryNotFound", "%s does not exist" % sub)
        self._json(200, entries)

    def _resolve(self, repo_id, rev, path):
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        f = repo["files"].get(path)
        if f is None:
            return self._error(404, "EntryNotFound", "%s does not exist at %s" % (path, rev))
        size = f["size"]
        etag = f["sha256"] if f["lfs"] else f["blob"]
        headers = {"ETag": '"%s"' % etag, "X-Repo-Commit": repo["commit"], "Accept-Ranges": "bytes"}
        if f["lfs"]:
            headers.update({"X-Linked-Etag": '"%s"' % etag, "X-Linked-Size": str(size)})
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            try:
                unit, spec = rng.split("=", 1)
                first, last = spec.split(",")[0].strip().split("-", 1)
                if unit.strip() != "bytes":
                    raise ValueError(unit)
                if first == "":
                    start, end = max(size - int(last), 0), size - 1
                else:
                    start, end = int(first), (int(last) if last else size - 1)
                end = min(end, size - 1)
            except ValueError:
                return self._error(400, "BadRequest", "bad Range header %r" % rng)
            if start >= size or start > end:
                headers["Content-Range"] = "bytes */%d" % size
                return self._send(416, b"", headers)
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, end, size)
        length = end - start + 1
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        entry = {"t": round(time.time(), 3), "method": self.command, "path": "%s/%s" % (repo_id, path),
                 "range": rng, "status": status, "start": start, "sent": 0, "cut": False}
        if self.command == "HEAD":
            return self.lab.record(entry)
        fault = self.lab.take_fault(path)
        limit = length
        if fault and fault.get("mode") == "drop_after":
            limit = min(length, int(fault["bytes"]))
        elif fault and fault.get("mode") == "cut_at":
            limit = max(0, min(length, int(fault["bytes"]) - start))
        cut = limit < length
        if cut:
            self.lab.used_fault()
        sent = 0
        try:
            with open(f["path"], "rb") as handle:
                handle.seek(start)
                while sent < limit:
                    chunk = handle.read(min(CHUNK, limit - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
            self.wfile.flush()
        finally:
            entry.update(sent=sent, cut=cut)
            self.lab.record(entry)
        if cut:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _lab_route(self, parts):
        what = parts[0] if parts else ""
        if what == "fault" and self.command == "PUT":
            length = int(self.headers.get("Content-Length") or 0)
            fault = json.loads(self.rfile.read(length) or b"{}")
            if fault.get("mode") not in ("drop_after", "cut_at") or int(fault.get("bytes", -1)) < 0:
                return self._error(400, "BadRequest", "need mode drop_after|cut_at and bytes >= 0")
            fault.setdefault("match", "*")
            fault["times"] = int(fault.get("times", -1))
            with self.lab.lock:
                self.lab.fault = fault
            return self._json(200, fault)
        if what == "fault" and self.command == "DELETE":
            with self.lab.lock:
                self.lab.fault = None
            return self._json(200, {})
        if what == "fault" and self.command == "GET":
            return self._json(200, self.lab.fault or {})
        if what == "stats" and self.command == "GET":
            with self.lab.lock:
                data = {"body_bytes": self.lab.body_bytes, "requests": list(self.lab.requests)}
            return self._json(200, data)
        if what == "reset" and self.command == "POST":
            with self.lab.lock:
                self.lab.body_bytes, self.lab.requests = 0, []
            return self._json(200, {})
        if what == "rescan" and self.command == "POST":
            self.repos.rescan()
            return self._json(200, {r: v["commit"] for r, v in self.repos.repos.items()})
        if what == "repos" and self.command == "GET":
            return self._json(200, {r: v["commit"] for r, v in self.repos.repos.items()})
        if what == "commits" and self.command == "GET":
            return self._json(200, {r: v["labels"] for r, v in self.repos.repos.items()})
        return self._error(404, "EntryNotFound", "unknown lab control")


def make_server(root, host="127.0.0.1", port=0, token=None):
    """A ready ThreadingHTTPServer (port 0: any free port; see server.server_address)."""
    handler = type("BoundHandler", (Handler,), {"repos": Repos(root), "lab": Lab(), "token": token})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def make_random(directory, shards, shard_mib, seed):
    """A deterministic multi-shard repo of random bytes, with a config and an index like a real checkpoint."""
    os.makedirs(directory, exist_ok=True)
    weight_map = {}
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        rng = random.Random("%d-%d" % (seed, i))
        path = os.path.join(directory, name)
        want = shard_mib * 1024 * 1024
        if not (os.path.exists(path) and os.path.getsize(path) == want):
            with open(path + ".tmp", "wb") as handle:
                for _ in range(shard_mib):
                    handle.write(rng.randbytes(1024 * 1024))
            os.replace(path + ".tmp", path)
        weight_map["layer.%d.weight" % i] = name
    files = {
        "config.json": {"architectures": ["RandomBytes"], "model_type": "random", "shards": shards},
        "generation_config.json": {"temperature": 1.0},
        "model.safetensors.index.json": {"metadata": {"total_size": shards * shard_mib << 20}, "weight_map": weight_map},
    }
    for name, data in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--root", required=True)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=80)
    serve.add_argument("--token", default=os.environ.get("LAB_HUB_TOKEN") or None)
    rnd = sub.add_parser("make-random")
    rnd.add_argument("dir")
    rnd.add_argument("--shards", type=int, default=4)
    rnd.add_argument("--shard-mib", type=int, default=16)
    rnd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "make-random":
        make_random(args.dir, args.shards, args.shard_mib, args.seed)
        return 0
    server = make_server(args.root, args.host, args.port, args.token)
    sys.stderr.write("lab hub on %s:%d serving %s\n" % (server.server_address[0], server.server_address[1],
                                                        ", ".join(sorted(server.RequestHandlerClass.repos.repos))))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
