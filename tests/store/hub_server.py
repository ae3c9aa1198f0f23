"""A loopback server that speaks the model hub's download protocol, for tests and the bench.

Hugging Face cannot be reached from the machines Skulk is tested on, so the store's real client
(`huggingface_hub`) is pointed at this server with `HF_ENDPOINT`. It serves the routes that
`huggingface_hub` calls while resolving and downloading a model:

* `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}` (model info: `sha`, `siblings`
  with sizes and LFS SHA-256 when `blobs=1`),
* `GET /api/models/{repo}/tree/{rev}` (the file list),
* `GET /api/models?search=` (search),
* `HEAD` and `GET /{repo}/resolve/{rev}/{file}` (`X-Repo-Commit`, `ETag`, `Content-Length`,
  `Accept-Ranges`; a `Range` GET answers 206 with `Content-Range`).

A revision is a branch name (`main`) or the repository's full commit id; anything else is a 404
with the hub's `X-Error-Code`. Every byte of file content sent is counted per file in
`bytes_sent` (the access log the resume and "downloaded once" tests read), and `throttle_bps`
slows file bodies down so a test can kill a node mid-download.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    path: Path
    size: int
    sha256: str
    lfs: bool


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    commit: str = ""
    downloads: int = 0

    @classmethod
    def from_files(cls, repo_id: str, files: dict[str, Path]) -> HubRepo:
        entries = {}
        for name, path in files.items():
            size = path.stat().st_size
            entries[name] = HubFile(path, size, _sha256(path), lfs=size > 10_000 or name.endswith(".gguf"))
        commit = hashlib.sha1(json.dumps({n: f.sha256 for n, f in sorted(entries.items())}).encode()).hexdigest()
        return cls(repo_id, entries, commit)

    def etag(self, name: str) -> str:
        f = self.files[name]
        return f.sha256 if f.lfs else _git_blob_sha(f.path.read_bytes())

    def sibling(self, name: str, blobs: bool) -> dict[str, Any]:
        f = self.files[name]
        out: dict[str, Any] = {"rfilename": name}
        if blobs:
            out["size"] = f.size
            out["blobId"] = self.etag(name)
            if f.lfs:
                out["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
        return out


@dataclass
class LoopbackHub:
    """The server; `start()` binds 127.0.0.1 on a free port, `url` is what HF_ENDPOINT gets."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    throttle_bps: float = 0.0
    bytes_sent: Counter[str] = field(default_factory=Counter)
    requests: list[str] = field(default_factory=list)
    tokens_seen: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LoopbackHub:
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="loopback-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def sent_for(self, filename: str) -> int:
        return sum(n for key, n in self.bytes_sent.items() if key.endswith("/" + filename))

    def __enter__(self) -> LoopbackHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the hub keeps its own log
        pass

    # ------------------------------------------------------------ helpers

    def _json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_found(self, code: str, message: str) -> None:
        self._json({"error": message}, 404, {"X-Error-Code": code, "X-Error-Message": message})

    def _repo(self, repo_id: str, rev: str | None) -> HubRepo | None:
        repo = self.owner.repos.get(unquote(repo_id))
        if repo is None:
            self._not_found("RepoNotFound", f"Repository {repo_id} not found")
            return None
        if rev is not None and unquote(rev) not in ("main", repo.commit):
            self._not_found("RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _record(self) -> None:
        self.owner.requests.append(f"{self.command} {self.path}")
        auth = self.headers.get("Authorization", "")
        if auth:
            self.owner.tokens_seen.append(auth.removeprefix("Bearer "))

    # ------------------------------------------------------------ routes

    def do_HEAD(self) -> None:
        self._record()
        self._route()

    def do_GET(self) -> None:
        self._record()
        self._route()

    def _route(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        path = url.path
        if path == "/api/models":
            needle = (query.get("search") or [""])[0].lower()
            limit = int((query.get("limit") or ["20"])[0])
            found = [
                {"id": r.repo_id, "modelId": r.repo_id, "sha": r.commit, "downloads": r.downloads, "likes": 0}
                for r in self.owner.repos.values()
                if needle in r.repo_id.lower()
            ]
            return self._json(found[:limit])
        if m := _TREE.match(path):
            repo = self._repo(m["repo"], m["rev"])
            if repo is None:
                return None
            tree = [
                {"type": "file", "path": n, "size": f.size, "oid": repo.etag(n)}
                | ({"lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}} if f.lfs else {})
                for n, f in sorted(repo.files.items())
            ]
            return self._json(tree)
        if m := _INFO.match(path):
            repo = self._repo(m["repo"], m["rev"])
            if repo is None:
                return None
            blobs = (query.get("blobs") or [""])[0].lower() in ("1", "true")
            return self._json(
                {
                    "id": repo.repo_id,
                    "modelId": repo.repo_id,
                    "sha": repo.commit,
                    "private": False,
                    "downloads": repo.downloads,
                    "tags": ["gguf"] if any(n.endswith(".gguf") for n in repo.files) else [],
                    "siblings": [repo.sibling(n, blobs) for n in sorted(repo.files)],
                }
            )
        if m := _RESOLVE.match(path):
            repo = self._repo(m["repo"], m["rev"])
            if repo is None:
                return None
            name = unquote(m["file"])
            if name not in repo.files:
                return self._not_found("EntryNotFound", f"{name} does not exist in {repo.repo_id}")
            return self._file(repo, name)
        return self._not_found("NotFound", f"no route {path}")

    def _file(self, repo: HubRepo, name: str) -> None:
        f = repo.files[name]
        start, end = 0, f.size - 1
        status = 200
        if rng := self.headers.get("Range"):
            m = re.match(r"bytes=(\d*)-(\d*)$", rng.strip())
            if m is None:
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if m[1]:
                start = int(m[1])
                end = int(m[2]) if m[2] else f.size - 1
            else:  # suffix range
                start = max(0, f.size - int(m[2]))
            end = min(end, f.size - 1)
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.etag(name)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        if start == 0 and status == 200:
            repo.downloads += 1
        key = f"{repo.repo_id}/{name}"
        block = 256 * 1024
        began = time.monotonic()
        sent = 0
        with open(f.path, "rb") as src:
            src.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                data = src.read(min(block, remaining))
                if not data:
                    break
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    return
                self.owner.bytes_sent[key] += len(data)
                sent += len(data)
                remaining -= len(data)
                if self.owner.throttle_bps > 0:
                    ahead = sent / self.owner.throttle_bps - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
