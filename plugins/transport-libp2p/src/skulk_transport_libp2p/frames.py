"""Wire formats of this transport, pure bytes in and out (no libp2p), so they are unit-tested alone.

* A gossipsub message's data is ``MAGIC | len(sender) | sender | record...``, each record
  ``seq (8 bytes) | len (4 bytes) | payload``: the node id of its publisher, then one or more of its
  messages on the topic with its sequence numbers there. Several records per gossipsub message
  is what makes a burst cheap (py-libp2p costs milliseconds of CPU per message, not per byte).
  py-libp2p hands received messages on in tasks of their own, which trio runs in any order, so
  the receiver puts records back in order by `seq` (reorder.py).
* Direct streams (links and requests) carry frames ``length (4 bytes) | kind (1 byte) | body``.
"""

from __future__ import annotations

import struct

MAGIC = b"SKL1"
_SEQ = struct.Struct(">Q")
_LEN = struct.Struct(">I")
RECORD_HEADER = _SEQ.size + _LEN.size

# link frame kinds
HELLO = b"H"  # body: json {"node": id, "v": version, "addrs": [multiaddr...]}; first frame on a link
BEAT = b"B"  # empty; keeps the peer's lease
MESSAGE = b"M"  # body: len(topic) | topic | payload: node-addressed send()
# request stream frames
REQUEST = b"Q"  # body: len(topic) | topic | len(sender) | sender | payload
REPLY = b"R"  # body: the handler's reply
ERROR = b"E"  # body: utf-8 reason


class MalformedFrame(ValueError):
    pass


def sender_header(node_id: str) -> bytes:
    raw = node_id.encode()
    if not raw or len(raw) > 255:
        raise ValueError(f"node id {node_id!r} must be 1-255 bytes")
    return raw


def encode_record(seq: int, payload: bytes) -> bytes:
    return _SEQ.pack(seq) + _LEN.pack(len(payload)) + payload


def encode_broadcast(sender: bytes, records: list[bytes]) -> bytes:
    """One gossipsub message: the header, then records made by `encode_record`."""
    return b"".join((MAGIC, bytes((len(sender),)), sender, *records))


def decode_broadcast(data: bytes) -> tuple[str, list[tuple[int, bytes]]]:
    """(sender node id, [(seq, payload)...]); MalformedFrame for anything else."""
    if len(data) < len(MAGIC) + 1 or data[: len(MAGIC)] != MAGIC:
        raise MalformedFrame(f"no skulk header ({len(data)} bytes, starts {data[:8]!r})")
    n = data[len(MAGIC)]
    start = len(MAGIC) + 1
    at = start + n
    if n == 0 or len(data) < at + RECORD_HEADER:
        raise MalformedFrame(f"truncated header ({len(data)} bytes, sender length {n})")
    try:
        sender = data[start:at].decode()
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"sender id is not utf-8: {exc}") from None
    records = []
    while at < len(data):
        if len(data) < at + RECORD_HEADER:
            raise MalformedFrame(f"truncated record header at byte {at}")
        (seq,) = _SEQ.unpack_from(data, at)
        (length,) = _LEN.unpack_from(data, at + _SEQ.size)
        end = at + RECORD_HEADER + length
        if end > len(data):
            raise MalformedFrame(f"record of {length} bytes at byte {at} runs past the end ({len(data)})")
        records.append((seq, data[at + RECORD_HEADER : end]))
        at = end
    return sender, records


def encode_frame(kind: bytes, body: bytes = b"") -> bytes:
    return _LEN.pack(len(body) + 1) + kind + body


def parse_frame_length(header: bytes, limit: int) -> int:
    """The body length (kind byte included) of a frame whose 4-byte header is `header`."""
    (length,) = _LEN.unpack(header)
    if length < 1 or length > limit:
        raise MalformedFrame(f"frame length {length} outside 1..{limit}")
    return length


def pack_fields(*fields: bytes) -> bytes:
    """Short fields, each 1-byte length prefixed, then nothing: the caller appends a payload."""
    out = []
    for field in fields:
        if len(field) > 255:
            raise ValueError(f"field of {len(field)} bytes is longer than 255")
        out += [bytes((len(field),)), field]
    return b"".join(out)


def unpack_fields(body: bytes, count: int) -> tuple[list[str], bytes]:
    """`count` short utf-8 fields, then the rest of `body`."""
    fields: list[str] = []
    at = 0
    for _ in range(count):
        if at >= len(body):
            raise MalformedFrame("truncated field")
        n = body[at]
        end = at + 1 + n
        if end > len(body):
            raise MalformedFrame("truncated field")
        try:
            fields.append(body[at + 1 : end].decode())
        except UnicodeDecodeError as exc:
            raise MalformedFrame(f"field is not utf-8: {exc}") from None
        at = end
    return fields, body[at:]
