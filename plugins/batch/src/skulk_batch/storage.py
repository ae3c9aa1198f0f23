"""Bytes of files and result segments: on this node's disk, copied to other members over HTTP.

Where bytes live: `<root>/files/<file id>` and `<root>/segments/<batch id>/<start>-<end>.jsonl`.
A file or segment is written here first, then PUT to the next `copies - 1` live API nodes
(`/v1/batch-peer/...`, authenticated as a cluster member the way the store's node-to-node calls are:
`member_headers`), and only then named in its record with every node that holds it. A reader that
lacks the bytes fetches them from a holder named in the record. Names are checked against fixed
patterns, so a request cannot name a path.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path

from skulk_kernel.api import NodeResources, NodeSurface

log = logging.getLogger("skulk.batch.storage")
FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")
SEGMENT = re.compile(r"^[0-9]{1,9}-[0-9]{1,9}$")
PEER_TIMEOUT_S = 30.0


class StorageError(Exception):
    pass


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Storage:
    """This node's bytes, and the calls that copy them to and fetch them from other members."""

    def __init__(self, node: NodeSurface, root: Path, copies: int) -> None:
        self.node = node
        self.root = root
        self.copies = copies
        root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ local paths

    def path(self, kind: str, name: str) -> Path:
        """`kind` "files" (name: a file id) or "segments" (name: `<batch id>/<start>-<end>`)."""
        if kind == "files" and FILE_ID.match(name):
            return self.root / "files" / name
        if kind == "segments":
            batch_id, _, seg = name.partition("/")
            if BATCH_ID.match(batch_id) and SEGMENT.match(seg):
                return self.root / "segments" / batch_id / f"{seg}.jsonl"
        raise StorageError(f"not a batch {kind} name: {name!r}")

    def has(self, kind: str, name: str) -> bool:
        return self.path(kind, name).is_file()

    def write(self, kind: str, name: str, data: bytes) -> None:
        write_atomic(self.path(kind, name), data)

    def read_local(self, kind: str, name: str) -> bytes | None:
        path = self.path(kind, name)
        return path.read_bytes() if path.is_file() else None

    def delete(self, kind: str, name: str) -> None:
        self.path(kind, name).unlink(missing_ok=True)

    def delete_segments(self, batch_id: str) -> None:
        if not BATCH_ID.match(batch_id):
            return
        folder = self.root / "segments" / batch_id
        for item in folder.glob("*.jsonl"):
            item.unlink(missing_ok=True)
        folder.rmdir() if folder.is_dir() and not any(folder.iterdir()) else None

    # ------------------------------------------------------------------ other members

    def api_urls(self, node_id: str) -> list[str]:
        received = self.node.readings.latest(NodeResources).get(node_id)
        if received is None or not received.reading.api_available or not received.reading.api_port:
            return []
        res = received.reading
        return [f"http://{addr}:{res.api_port}" for addr in res.addresses or ("127.0.0.1",)]

    def peers(self) -> list[str]:
        """Live members (a session with this node) that serve the API, in a stable order."""
        reachable = self.node.reachable_nodes()
        return sorted(n for n in reachable if n != self.node.node_id and self.api_urls(n))

    async def replicate(self, kind: str, name: str, data: bytes, exclude: set[str] | None = None) -> tuple[str, ...]:
        """Copy to other members until `copies` nodes hold it (this one first): the holders."""
        import httpx
        from skulk_api_control.member_auth import member_headers

        holders: list[str] = [self.node.node_id]
        skip = exclude or set()
        for peer in self.peers():
            if len(holders) >= self.copies:
                break
            if peer in skip:
                continue
            for base in self.api_urls(peer):
                url = f"{base}/v1/batch-peer/{kind}/{name}"
                try:
                    async with httpx.AsyncClient(timeout=PEER_TIMEOUT_S) as client:
                        got = await client.put(url, content=data, headers=member_headers(self.node, "PUT", url))
                except httpx.HTTPError as exc:
                    log.info("copy of %s %s to %s at %s failed: %r", kind, name, peer, base, exc)
                    continue
                if got.status_code == 200:
                    holders.append(peer)
                    break
                log.warning("copy of %s %s to %s refused: %s %s", kind, name, peer, got.status_code, got.text[:200])
        if len(holders) < self.copies:
            log.warning(
                "%s %s is held by %d node(s) of the %d wanted (no more live members)",
                kind,
                name,
                len(holders),
                self.copies,
            )
        return tuple(holders)

    async def read(self, kind: str, name: str, holders: tuple[str, ...]) -> bytes:
        """The bytes, from this node's disk or the first holder that answers (kept here after)."""
        import httpx
        from skulk_api_control.member_auth import member_headers

        local = self.read_local(kind, name)
        if local is not None:
            return local
        for holder in holders:
            if holder == self.node.node_id:
                continue
            for base in self.api_urls(holder):
                url = f"{base}/v1/batch-peer/{kind}/{name}"
                try:
                    async with httpx.AsyncClient(timeout=PEER_TIMEOUT_S) as client:
                        got = await client.get(url, headers=member_headers(self.node, "GET", url))
                except httpx.HTTPError as exc:
                    log.info("fetch of %s %s from %s failed: %r", kind, name, holder, exc)
                    continue
                if got.status_code == 200:
                    return got.content
        raise StorageError(f"no live holder of {kind} {name} answered (holders: {', '.join(holders) or 'none'})")
