"""Files on the data plane as `MediaChunk` pieces, and their assembly with verification.

Why pieces: a chunk is one message on the node-addressed `CHUNKS` topic and one item on the runner's
multiprocessing queue; a 1024x1024 PNG is 1-3 MB, so it travels as 256 KiB pieces (about 342 KB of
base64 each), never as one multi-megabyte message. The last piece of each file carries the SHA-256
of the whole file; the assembler refuses a file that is larger than the bound, out of order, or
whose digest does not match, so a damaged image is an error, never a corrupt PNG handed to a client.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from skulk_kernel.api import CommandId, MediaChunk

PIECE_BYTES = 256 * 1024


class PieceError(ValueError):
    """A file did not arrive whole (the message says how)."""


def split(command_id: str, data: bytes, mime: str, index: int, first_seq: int) -> Iterator[MediaChunk]:
    """The pieces of one file, numbered from `first_seq`; the digest rides on the last one."""
    count = max(1, -(-len(data) // PIECE_BYTES))
    digest = hashlib.sha256(data).hexdigest()
    for i in range(count):
        yield MediaChunk(
            command_id=CommandId(command_id),
            seq=first_seq + i,
            data=base64.b64encode(data[i * PIECE_BYTES : (i + 1) * PIECE_BYTES]).decode("ascii"),
            mime=mime,
            index=index,
            sha256=digest if i == count - 1 else "",
        )


@dataclass
class Assembler:
    """Collects the pieces of files 0..n-1 (in the stream's order) and verifies each when it ends."""

    max_bytes: int
    files: dict[int, bytes] = field(default_factory=dict)
    mimes: dict[int, str] = field(default_factory=dict)
    _open: dict[int, list[bytes]] = field(default_factory=dict)
    _sizes: dict[int, int] = field(default_factory=dict)

    def add(self, chunk: MediaChunk) -> None:
        if chunk.index in self.files:
            raise PieceError(f"image {chunk.index} got a piece after its last one")
        piece = base64.b64decode(chunk.data, validate=True) if chunk.data else b""
        size = self._sizes.get(chunk.index, 0) + len(piece)
        if size > self.max_bytes:
            raise PieceError(f"image {chunk.index} is over the limit of {self.max_bytes} bytes")
        self._sizes[chunk.index] = size
        self._open.setdefault(chunk.index, []).append(piece)
        self.mimes.setdefault(chunk.index, chunk.mime)
        if chunk.sha256:
            data = b"".join(self._open.pop(chunk.index))
            if hashlib.sha256(data).hexdigest() != chunk.sha256:
                raise PieceError(f"image {chunk.index} does not match its SHA-256")
            self.files[chunk.index] = data

    def complete(self, n: int) -> list[tuple[bytes, str]]:
        """The n files in order, or PieceError naming what is missing."""
        if self._open:
            raise PieceError(f"image(s) {sorted(self._open)} ended without their last piece")
        missing = [i for i in range(n) if i not in self.files]
        if missing:
            raise PieceError(f"image(s) {missing} of {n} did not arrive")
        return [(self.files[i], self.mimes[i]) for i in range(n)]
