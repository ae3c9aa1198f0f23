"""Peer transfer: a model placed on a node that lacks it is copied from the members that hold it.

Where the files are: every node lists the models it holds in its `NodeResources.models_present`
telemetry reading (the store sets `facts["models_present"]`, bounded); a node that needs a model
asks the members that list it, and goes to the hub only when none can serve it.

The file service is HTTP on each node's API port:

* `POST /store/peer/grant {model_id, requester, stream}`: the holder checks that `requester` is a
  member it holds a live cluster session with, mints a random per-transfer token bound to that
  member and model (10 minutes), and sends it **over the cluster's data plane** to the requester's
  open chunk stream `stream`; the HTTP answer carries only the manifest. Someone who can reach the
  HTTP port but is not a member never sees a token.
* `GET /store/peer/files/{model_id}?file=NAME` with `Authorization: Bearer TOKEN`: the file, with
  `Range` requests (206).

The holder serves the bytes from a file server of its own (`peer_files.py`: `sendfile`, keep-alive,
ranges). The requester (`rangecopy.py`) fetches every file in ranges from all holders at once
(several ranges in flight each), writes them in place, hashes them as they land, and checks each
file's SHA-256 against the holder's sidecar manifest and the card's pinned hashes; an interrupted
copy resumes from its finished ranges. A file that fails the check is fetched again from one
source at a time, so a holder with a damaged copy is found and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlparse

from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse
from skulk_kernel.api import ModelCard, NodeResources, NodeSurface, TokenChunk, new_id

from .copyproc import CHILD_FROM_BYTES, copy_in_child
from .peer_files import FileServer, Refused, Served
from .plugin import STORE_PEER
from .rangecopy import FileCopy, RangeSource
from .store import Progress

if TYPE_CHECKING:
    from .store import LocalModelStore

log = logging.getLogger("skulk.store.peer")
TOKEN_TTL_S = 600.0
INVENTORY_LIMIT = 512
#: holders one copy reads from at once: a receiver's link is full well before this many
MAX_SOURCES = 4


# ====================================================================== holder side


@dataclass
class Grant:
    model_id: str
    requester: str
    expires: float


@dataclass
class PeerServer:
    """The holder's half: tokens, the file server, and what has been served (bytes per requester)."""

    node: NodeSurface
    store: LocalModelStore
    grants: dict[str, Grant] = field(default_factory=dict)
    served: Counter[str] = field(default_factory=Counter)
    data_port: int | None = None
    _files: FileServer | None = None

    def start(self, host: str) -> None:
        """The file server: its own port, a thread per connection, `sendfile` for the bytes (the
        API's ASGI stack copies every block through Python; this keeps a copy near the wire)."""
        self._files = FileServer(self.resolve, self._count)
        self.data_port = self._files.start(host)

    def stop(self) -> None:
        if self._files is not None:
            self._files.stop()
            self._files = None

    def _count(self, requester: str, n: int) -> None:
        self.served[requester] += n

    def resolve(self, token: str, model_id: str, name: str) -> Served | Refused:
        """The file server's question: may this token read this file, and where is it."""
        grant = self.authorize(token, model_id)
        if grant is None:
            return Refused(403, "no valid transfer token for this model (ask /store/peer/grant)")
        if name not in self.store.manifest(model_id):
            return Refused(404, f"{name!r} is not a file of {model_id}")
        return Served(self.store.folder(model_id) / name, grant.requester)

    async def grant(self, model_id: str, requester: str, stream: str) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        self.grants = {t: g for t, g in self.grants.items() if g.expires > now}
        if requester == self.node.node_id or requester not in self.node.reachable_nodes():
            return 403, {
                "message": f"{requester!r} is not a member this node holds a session with",
                "code": "not_member",
            }
        manifest = self.store.manifest(model_id)
        if not manifest:
            return 404, {"message": f"this node does not hold {model_id}", "code": "not_held"}
        token = secrets.token_urlsafe(24)
        self.grants[token] = Grant(model_id, requester, now + TOKEN_TTL_S)
        # the token goes to the member over the cluster's own transport, never in this answer
        await self.node.send_chunk(requester, TokenChunk(command_id=stream, seq=0, text=token, finish_reason="stop"))
        folder = self.store.folder(model_id)
        files = {name: {"size": (folder / name).stat().st_size, "sha256": digest} for name, digest in manifest.items()}
        return 200, {"node_id": self.node.node_id, "model_id": model_id, "files": files, "data_port": self.data_port}

    def authorize(self, token: str, model_id: str) -> Grant | None:
        grant = self.grants.get(token)
        if grant is None or grant.expires < time.monotonic() or grant.model_id != model_id:
            return None
        if grant.requester not in self.node.reachable_nodes():
            return None
        return grant


def add_peer_routes(app: Any, node: NodeSurface) -> None:
    from skulk_api_control.openapi_body import body_schema

    from .bodies import GrantBody

    def server() -> PeerServer | None:
        return node.services.get(STORE_PEER)

    def refuse(status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code}}, status)

    @app.post("/store/peer/grant", openapi_extra=body_schema(GrantBody))
    async def grant(request: Request) -> Any:
        peer = server()
        if peer is None:
            return refuse(503, "this node's store is not running", "no_store")
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k), str) for k in ("model_id", "requester", "stream")
        ):
            return refuse(400, 'body must be {"model_id", "requester", "stream"} (strings)', "invalid_json")
        status, answer = await peer.grant(body["model_id"], body["requester"], body["stream"])
        if status != 200:
            return refuse(status, answer["message"], answer["code"])
        return answer

    @app.get("/store/peer/files/{model_id:path}")
    async def serve_file(model_id: str, file: str, request: Request) -> Any:
        peer = server()
        if peer is None:
            return refuse(503, "this node's store is not running", "no_store")
        token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        grant = peer.authorize(token, model_id)
        if grant is None:
            return refuse(403, "no valid transfer token for this model (ask /store/peer/grant)", "bad_token")
        manifest = peer.store.manifest(model_id)
        if file not in manifest:
            return refuse(404, f"{file!r} is not a file of {model_id}", "no_such_file")
        path = peer.store.folder(model_id) / file
        peer.served[grant.requester] += _range_length(request.headers.get("range"), path.stat().st_size)
        return FileResponse(path, media_type="application/octet-stream")


def _range_length(header: str | None, size: int) -> int:
    if not header or not header.startswith("bytes="):
        return size
    start, _, end = header[6:].partition("-")
    try:
        return (int(end) if end else size - 1) - int(start or 0) + 1
    except ValueError:
        return size


# ====================================================================== requester side


@dataclass
class Source:
    node_id: str
    base_url: str
    token: str
    files: dict[str, dict[str, Any]]
    sent: int = 0
    broken: bool = False


class PeerFetcher:
    """Called by the store (in a worker thread) before it would go to the hub."""

    def __init__(self, node: NodeSurface, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.loop = loop
        self.last_sources: dict[str, dict[str, int]] = {}  # model id -> node id -> bytes from it
        self._answered: dict[str, str] = {}  # node id -> the API address that answered its last grant
        self._http: Any = None
        self._http_lock = threading.Lock()
        # made ahead (it loads the CA bundle: half a second on a loaded host), not on the first copy
        threading.Thread(target=self._client, name="peer-http-client", daemon=True).start()

    def holders(self, model_id: str) -> list[tuple[str, list[str]]]:
        """(node id, base URLs to try) of every reachable member that lists the model."""
        reachable = self.node.reachable_nodes()
        found = []
        for node_id, received in self.node.readings.latest(NodeResources).items():
            res = received.reading
            if node_id == self.node.node_id or node_id not in reachable or model_id not in res.models_present:
                continue
            if not res.api_available or not res.api_port:
                continue
            found.append((node_id, [f"http://{addr}:{res.api_port}" for addr in res.addresses or ("127.0.0.1",)]))
        return sorted(found)

    def api_urls(self, node_id: str) -> list[str]:
        """The base URLs of a member's API, from its latest `NodeResources` reading."""
        received = self.node.readings.latest(NodeResources).get(node_id)
        if received is None or not received.reading.api_port:
            return []
        res = received.reading
        return [f"http://{addr}:{res.api_port}" for addr in res.addresses or ("127.0.0.1",)]

    def _client(self) -> Any:
        """One HTTP client for every grant: building one costs an SSL context (tens of ms, more on
        a loaded host), paid per address tried when each request made its own."""
        import httpx

        with self._http_lock:
            if self._http is None:
                self._http = httpx.Client(timeout=httpx.Timeout(10, connect=2))
            return self._http

    def _token(self, model_id: str, holder: str, urls: list[str]) -> Source | None:
        import httpx

        stream_id = new_id()
        stream = self.node.streams.open(stream_id, idle_timeout=15)
        known = self._answered.get(holder)
        try:
            for url in sorted(urls, key=lambda u: u != known):  # the address that answered last time first
                try:
                    answer = self._client().post(
                        f"{url}/store/peer/grant",
                        json={"model_id": model_id, "requester": self.node.node_id, "stream": stream_id},
                    )
                except httpx.HTTPError:
                    continue  # that address is not the one the holder's API listens on
                self._answered[holder] = url
                if answer.status_code != 200:
                    log.info("peer %s refused %s: %s", holder, model_id, answer.text[:200])
                    return None
                token = asyncio.run_coroutine_threadsafe(_first_text(stream), self.loop).result(20)
                granted = answer.json()
                base = url
                if granted.get("data_port"):  # the holder's sendfile server, same address
                    base = f"{url.rsplit(':', 1)[0]}:{granted['data_port']}/files"
                else:
                    base = f"{url}/store/peer/files"
                return Source(holder, base, token, dict(granted["files"]))
            return None
        except Exception as exc:
            log.info("no token from peer %s for %s: %s", holder, model_id, exc)
            return None
        finally:
            self.loop.call_soon_threadsafe(self.node.streams.close, stream_id)

    def __call__(
        self,
        card: ModelCard,
        staging: Path,
        progress: Progress,
        store: LocalModelStore,
        only: set[str] | None = None,
    ) -> Path | None:
        """Copy the model from the members that hold it (`only`: from these members alone)."""
        asked = time.monotonic()
        holders = [h for h in self.holders(card.model_id) if only is None or h[0] in only]
        if not holders:
            return None
        pinned = {n: m for n, m in dict(card.sections.get("source", {}).get("files", {})).items()}
        sources: list[Source] = []
        # a few holders, drawn at random so that many requesters spread over many holders; their
        # grants at once (each is an HTTP request and a token over the data plane)
        asked_for = random.sample(holders, min(len(holders), 2 * MAX_SOURCES))
        with ThreadPoolExecutor(len(asked_for), thread_name_prefix="peer-grant") as pool:
            granted = list(pool.map(lambda h: (h[0], self._token(card.model_id, h[0], h[1])), asked_for))
        for holder, src in granted:
            if src is None or len(sources) == MAX_SOURCES:
                continue
            wrong = [
                n for n, m in pinned.items() if m.get("sha256") and src.files.get(n, {}).get("sha256") != m["sha256"]
            ]
            if wrong or not all(n in src.files for n in pinned):
                log.warning("peer %s holds a different %s (%s); not copying from it", holder, card.model_id, wrong)
                continue
            sources.append(src)
        if not sources:
            return None
        files = {n: src_meta for n, src_meta in sources[0].files.items() if not pinned or n in pinned}
        # the holder's manifest gives the sizes: refuse before the first byte when they do not fit
        # (a partial file an interrupted copy left has its blocks already: it needs no more room)
        need = sum(int(m["size"]) for n, m in files.items() if not _reserved(_part(staging, n), int(m["size"])))
        store.ensure_room(need, f"copying {card.model_id} from peers")
        staging.mkdir(parents=True, exist_ok=True)
        reporter = store._reporter(card.model_id, {n: int(m["size"]) for n, m in files.items()}, "copying from peers")
        began = time.monotonic()
        for name, meta in files.items():
            if not copy_file(card.model_id, name, meta, staging, sources, reporter, progress):
                log.warning("no peer gave a good copy of %s/%s", card.model_id, name)
                return None
        total = sum(int(m["size"]) for m in files.values())
        took = time.monotonic() - began
        self.last_sources[card.model_id] = {s.node_id: s.sent for s in sources}
        log.info(
            "copied %s (%.1f MB) from %d peer(s) %s in %.2f s (%.1f MB/s; grants %.2f s before)",
            card.model_id,
            total / 1e6,
            len(sources),
            {s.node_id[:8]: s.sent for s in sources},
            took,
            total / 1e6 / max(took, 1e-6),
            began - asked,
        )
        shutil.rmtree(staging / ".peer", ignore_errors=True)
        return staging


def copy_file(
    model_id: str,
    name: str,
    meta: dict[str, Any],
    staging: Path,
    sources: list[Source],
    reporter: Any,
    progress: Progress,
) -> bool:
    """All sources at once, then (if the hash is wrong) each source alone until one is right.

    The partial file and its record of finished ranges stay in `staging/.peer` when no source
    could finish it, so the next copy (after a restart, or from other members) resumes there.
    """
    size, want = int(meta["size"]), str(meta["sha256"])
    part = _part(staging, name)
    attempts = [[s for s in sources if not s.broken]] + [[s] for s in sources]
    for group in attempts:
        group = [s for s in group if not s.broken]
        if not group:
            continue
        ranged = [_range_source(s, model_id, name) for s in group]
        copy = FileCopy(part, size, want, ranged, lambda done: reporter.update({name: done}, progress))
        result = copy_in_child(copy) if size >= CHILD_FROM_BYTES else copy.run()
        reporter.update({name: copy.done_bytes}, progress, done=result.status == "ok")
        for src, r in zip(group, ranged, strict=True):
            src.sent += r.received
            src.broken = src.broken or r.broken
        if result.resumed_bytes:
            log.info("%s/%s: resumed with %.1f MB already here", model_id, name, result.resumed_bytes / 1e6)
        if result.status == "ok":
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, target)
            return True
        if result.status == "incomplete":
            log.warning(
                "%s/%s: no source could finish it (%s); %.1f MB kept for a resume",
                model_id,
                name,
                {r.node_id[:8]: r.last_error for r in ranged if r.last_error},
                copy.done_bytes / 1e6,
            )
            continue
        log.warning(
            "%s/%s from %s failed SHA-256 verification; fetching it again",
            model_id,
            name,
            [s.node_id[:8] for s in group],
        )
        if len(group) == 1:
            group[0].broken = True
    return False


def _part(staging: Path, name: str) -> Path:
    """Where a file being copied lies until it is complete (with its `.ranges` record)."""
    return staging / ".peer" / (name.replace("/", "--") + ".part")


def _reserved(part: Path, size: int) -> bool:
    try:
        return part.stat().st_size == size and part.with_name(part.name + ".ranges").is_file()
    except OSError:
        return False


def _range_source(src: Source, model_id: str, name: str) -> RangeSource:
    """Where `src` serves one file: its file server's address and the request target."""
    url = urlparse(src.base_url)
    target = f"{url.path}/{quote(model_id, safe='/')}?file={quote(name, safe='')}"
    return RangeSource(src.node_id, url.hostname or "127.0.0.1", url.port or 80, target, src.token)


async def _first_text(stream: Any) -> str:
    async for chunk in stream:
        if isinstance(chunk, TokenChunk) and chunk.text:
            return chunk.text
        raise RuntimeError(f"the holder sent no token ({type(chunk).__name__})")
    raise RuntimeError("the token stream ended empty")


def inventory(store: LocalModelStore) -> tuple[str, ...]:
    """The model ids this node holds, for `NodeResources.models_present` (bounded)."""
    held = sorted(store.installed())
    if len(held) > INVENTORY_LIMIT:
        log.warning("this node holds %d models; advertising the first %d", len(held), INVENTORY_LIMIT)
    return tuple(held[:INVENTORY_LIMIT])
