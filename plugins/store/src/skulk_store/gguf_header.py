"""A GGUF header reader: the key/value metadata only, from the first bytes of a file.

`gguf.GGUFReader` maps the whole file and builds every tensor view, which takes seconds on a
small model; a card needs only the scalar metadata at the front. This reads the key/value section
from a byte prefix (a local file's first megabytes, or a range request to the hub) and raises
`Truncated` when the prefix ends inside it, so the caller can fetch more.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Truncated(ValueError):
    """The prefix ended inside the metadata; read more bytes."""


class NotGGUF(ValueError):
    """The bytes are not a GGUF file."""


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise Truncated(f"need {self.at + n} bytes, have {len(self.data)}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if inner in _SCALARS:  # skipped: vocabularies and scores are not card facts
                self.take(struct.calcsize(_SCALARS[inner]) * count)
            else:
                for _ in range(count):
                    self.value(inner)
            return None
        if kind not in _SCALARS:
            raise NotGGUF(f"unknown GGUF value type {kind}")
        return self.unpack(_SCALARS[kind])


def read_metadata(data: bytes) -> dict[str, Any]:
    """Scalar metadata (arrays are skipped) from a prefix of a GGUF file."""
    cur = _Cursor(data)
    if cur.take(4) != MAGIC:
        raise NotGGUF("the file does not start with the GGUF magic")
    version = cur.unpack("<I")
    if version < 2:
        raise NotGGUF(f"GGUF version {version} is too old")
    cur.unpack("<Q")  # tensor count
    meta: dict[str, Any] = {}
    for _ in range(cur.unpack("<Q")):
        key = cur.string()
        value = cur.value(cur.unpack("<I"))
        if value is not None:
            meta[key] = value
    return meta


def read_file_metadata(path: Path, first: int = 4 << 20) -> dict[str, Any]:
    size = path.stat().st_size
    want = first
    with open(path, "rb") as f:
        while True:
            f.seek(0)
            try:
                return read_metadata(f.read(want))
            except Truncated:
                if want >= size:
                    raise
                want *= 4
