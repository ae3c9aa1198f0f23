"""Keys and the frame header every message carries (the sender's node id).

A frame is ``MAGIC | len(sender) (1 byte) | sender (utf-8) | payload``. Anything else on a skulk key
is malformed: the receiver drops it with a log line and goes on.
"""

from __future__ import annotations

import re

MAGIC = b"SKZ1"
_HEADER_MIN = len(MAGIC) + 1
_CHUNK_RE = re.compile(r"[^/*$#?\s]+")


class MalformedFrame(ValueError):
    pass


def check_chunk(value: str, what: str) -> str:
    """A node id or topic must be one valid Zenoh key chunk."""
    if not value or not _CHUNK_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} cannot be part of a Zenoh key (no '/', '*', '$', '#', '?', spaces)")
    return value


def encode(sender: bytes, payload: bytes) -> bytes:
    """`sender` is the utf-8 node id, pre-encoded once per transport."""
    return b"".join((MAGIC, len(sender).to_bytes(1, "big"), sender, payload))


def sender_header(node_id: str) -> bytes:
    raw = node_id.encode()
    if len(raw) > 255:
        raise ValueError(f"node id {node_id!r} is longer than 255 bytes")
    return raw


def decode(frame: bytes) -> tuple[str, bytes]:
    if len(frame) < _HEADER_MIN or frame[: len(MAGIC)] != MAGIC:
        raise MalformedFrame(f"no skulk frame header ({len(frame)} bytes, starts {frame[:8]!r})")
    n = frame[len(MAGIC)]
    end = _HEADER_MIN + n
    if n == 0 or len(frame) < end:
        raise MalformedFrame(f"truncated sender id ({len(frame)} bytes, sender length {n})")
    try:
        sender = frame[_HEADER_MIN:end].decode()
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"sender id is not utf-8: {exc}") from None
    return sender, frame[end:]


class Keys:
    """The key space of one network version: ``skulk/<version>/...``."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.root = f"skulk/{version}"

    def broadcast(self, plane: str, topic: str) -> str:
        return f"{self.root}/{plane}/{topic}"

    def addressed(self, plane: str, topic: str, node_id: str) -> str:
        return f"{self.root}/{plane}/{topic}/{node_id}"

    def rpc(self, topic: str, node_id: str) -> str:
        return f"{self.root}/rpc/{topic}/{node_id}"

    def alive(self, node_id: str) -> str:
        return f"{self.root}/alive/{node_id}"

    # every version's liveliness tokens, so another version's node is seen (and reported)
    ALIVE_ANY_VERSION = "skulk/*/alive/*"

    @staticmethod
    def parse_alive(key: str) -> tuple[str, str] | None:
        """(version, node_id) of ``skulk/<version>/alive/<node_id>``."""
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "skulk" and parts[2] == "alive":
            return parts[1], parts[3]
        return None
