"""A made file put back together from its `MediaChunk`s, bounded and verified.

The engine streams the file in pieces (base64 in `MediaChunk.data`, the SHA-256 of the whole file on
the last piece). The assembler writes the pieces to a `.part` file as they come, refuses a file
larger than its bound the moment it grows past it (never after holding it all in memory), checks
the digest on the last piece and only then renames the file into place. Anything else (a bad
digest, a piece of another file, undecodable base64) raises AssemblyError and the partial file is
deleted by `discard()`, which the job's one cleanup path calls.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from skulk_kernel.api import MediaChunk


class AssemblyError(Exception):
    """The file did not arrive whole; the message says how."""


class MediaAssembler:
    def __init__(self, target: Path, max_bytes: int, mime_prefix: str = "video/") -> None:
        self.target = target
        self.part = target.with_name(target.name + ".part")
        self.max_bytes = max_bytes
        self.mime_prefix = mime_prefix
        self.size = 0
        self.mime = ""
        self._digest = hashlib.sha256()
        self._file: BinaryIO | None = None

    def add(self, chunk: MediaChunk) -> bool:
        """Take one piece; True once the file is complete, verified and in place."""
        if chunk.index != 0:
            raise AssemblyError(f"a video job makes one file, but a piece of file {chunk.index} arrived")
        if not chunk.mime.startswith(self.mime_prefix):
            raise AssemblyError(f"the engine sent {chunk.mime!r}, not a {self.mime_prefix}* file")
        if self.mime and chunk.mime != self.mime:
            raise AssemblyError(f"the file changed type mid-stream ({self.mime} -> {chunk.mime})")
        self.mime = chunk.mime
        try:
            piece = base64.b64decode(chunk.data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise AssemblyError(f"a piece of the file is not valid base64: {exc}") from None
        self.size += len(piece)
        if self.size > self.max_bytes:
            raise AssemblyError(f"the file grew past the limit of {self.max_bytes} bytes")
        if self._file is None:
            self.part.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.part, "wb")  # closed in add() or discard()
        self._file.write(piece)
        self._digest.update(piece)
        if chunk.finish_reason is None:
            return False
        if chunk.finish_reason != "stop":
            raise AssemblyError(f"the file ended with finish_reason={chunk.finish_reason!r}")
        digest = self._digest.hexdigest()
        if chunk.sha256 != digest:
            raise AssemblyError(f"the file's SHA-256 is {digest}, the engine declared {chunk.sha256 or 'none'}")
        if self.size == 0:
            raise AssemblyError("the engine sent an empty file")
        self._close()
        os.replace(self.part, self.target)
        return True

    def sha256(self) -> str:
        return self._digest.hexdigest()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Delete whatever was written (idempotent): the partial file, and the target if it is there."""
        self._close()
        self.part.unlink(missing_ok=True)
        self.target.unlink(missing_ok=True)
