"""Sealed frames: every message names its sender, a counter, and carries an HMAC-SHA256.

A sealed frame is::

    SKZ2 | len(sender) (1) | sender | session (8) | counter (8) | sent_ms (8) | payload | tag (32)

``tag = HMAC-SHA256(K, key_expr || 0 || everything before the tag)`` with ``K`` derived from the
cluster secret and the network version. Covering the Zenoh key binds a message to its topic and,
for node-addressed sends and requests, to its destination: a frame cannot be moved elsewhere.

What the receiver checks (`Opener.open`), and what each failure is called:

* ``forged``: the tag does not verify (no secret, or altered);
* ``replayed``: a (sender, session, counter) already seen, or older than the replay window;
* ``stale``: the first frame of a session this node has not seen yet was sent more than
  `max_age_s` ago (a replay of a session that ended before this node came up);
* ``malformed``: not a frame at all.

Only then is the sender delivered to callbacks as the message's sender, so the kernel's check
"GLOBAL_EVENTS only from the master" holds against anyone without the secret.

Signed frames (magic ``SKZ3``, signing.py) also prove *which* member sent them: after ``sent_ms``
they carry the sender's binding (public key and the cluster CA's signature over node id, version,
session and key, 96 bytes), and before the tag an Ed25519 signature (64 bytes) over
``key_expr || 0 || everything before it``. Where the receiver requires a signature (the transport:
control plane and request/reply) an ``SKZ2`` frame is ``unsigned``, and a frame whose key, binding
or signature is not the named sender's is ``impersonation``; the MAC is still checked first, so an
outsider costs one HMAC, never an Ed25519 verification.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .signing import NodeSigner, Verifier

MAGIC = b"SKZ2"
SIGNED_MAGIC = b"SKZ3"
_BINDING = 96
_SIGNATURE = 64
TAG_BYTES = 32
_FIXED = 8 + 8 + 8
WINDOW = 8192  # counters a session may arrive out of order by (planes drain independently)
MAX_SESSIONS = 4096  # (sender, session) windows kept, least recently used dropped


class Rejected(ValueError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Sealer:
    """Seals this node's frames: one random session id per start, one counter for all planes."""

    def __init__(self, key: bytes, sender: str, session: bytes | None = None, signer: NodeSigner | None = None) -> None:
        raw = sender.encode()
        if not raw or len(raw) > 255:
            raise ValueError(f"node id {sender!r} must be 1-255 bytes")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.session = session if session is not None else secrets.token_bytes(8)
        self._head = len(raw).to_bytes(1, "big") + raw + self.session
        self._signer = signer
        self._counter = itertools.count(1)  # next() is atomic under the GIL: safe across threads

    def seal(self, key_expr: str, payload: bytes, sign: bool = False) -> bytes:
        """The sealed frame; `sign` adds this node's binding and signature (needs a signer)."""
        parts = [
            MAGIC,
            self._head,
            next(self._counter).to_bytes(8, "big"),
            int(time.time() * 1000).to_bytes(8, "big"),
        ]
        if sign:
            if self._signer is None:
                raise ValueError("this sealer has no signing key")
            parts[0] = SIGNED_MAGIC
            parts += (self._signer.binding, payload)
            unsigned = b"".join(parts)
            body = unsigned + self._signer.sign(key_expr.encode() + b"\x00" + unsigned)
        else:
            parts.append(payload)
            body = b"".join(parts)
        mac = self._mac.copy()
        mac.update(key_expr.encode())
        mac.update(b"\x00")
        mac.update(body)
        return body + mac.digest()


class _Window:
    """Anti-replay sliding window over one session's counters (like IPsec's, WINDOW wide)."""

    __slots__ = ("bits", "top")

    def __init__(self) -> None:
        self.top = 0
        self.bits = 0

    def check(self, counter: int) -> bool:
        if counter > self.top:
            return True
        behind = self.top - counter
        return behind < WINDOW and not (self.bits >> behind) & 1

    def mark(self, counter: int) -> None:
        if counter > self.top:
            shift = counter - self.top
            self.bits = ((self.bits << shift) | 1) & ((1 << WINDOW) - 1) if shift < WINDOW else 1
            self.top = counter
        else:
            self.bits |= 1 << (self.top - counter)


class Opener:
    """Verifies frames from every sender; thread-safe (Zenoh calls back on several threads)."""

    def __init__(
        self,
        key: bytes,
        max_age_s: float = 300.0,
        verifier: Verifier | None = None,
        needs_signature: Callable[[str], bool] = lambda key_expr: False,
    ) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.verifier = verifier
        self._needs_signature = needs_signature
        self.max_age_s = max_age_s
        self._windows: OrderedDict[bytes, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, key_expr: str, frame: bytes) -> tuple[str, bytes]:
        """(sender, payload) of an authentic, fresh frame; raises Rejected otherwise."""
        magic = frame[:4]
        signed = magic == SIGNED_MAGIC
        if len(frame) < len(MAGIC) + 1 + _FIXED + TAG_BYTES or not (signed or magic == MAGIC):
            raise Rejected("malformed", f"no sealed skulk frame ({len(frame)} bytes, starts {frame[:6]!r})")
        n = frame[4]
        start = 5 + n
        extra = _BINDING + _SIGNATURE if signed else 0
        if n == 0 or len(frame) < start + _FIXED + extra + TAG_BYTES:
            raise Rejected("malformed", f"truncated frame ({len(frame)} bytes, sender length {n})")
        body, tag = frame[:-TAG_BYTES], frame[-TAG_BYTES:]
        mac = self._mac.copy()
        mac.update(key_expr.encode())
        mac.update(b"\x00")
        mac.update(body)
        if not hmac.compare_digest(mac.digest(), tag):
            raise Rejected("forged", f"bad MAC on {key_expr} (sent without this cluster's secret, or altered)")
        try:
            sender = frame[5:start].decode()
        except UnicodeDecodeError:
            raise Rejected("malformed", "sender id is not utf-8") from None
        payload_at, payload_end = start + _FIXED, len(frame) - TAG_BYTES
        if signed:
            if self.verifier is None:
                raise Rejected("impersonation", f"signed frame on {key_expr} but this node checks no signatures")
            payload_at, payload_end = payload_at + _BINDING, payload_end - _SIGNATURE
            self.verifier.check(
                key_expr,
                sender,
                frame[start : start + 8],
                frame[start + _FIXED : payload_at],
                key_expr.encode() + b"\x00" + frame[:payload_end],
                frame[payload_end : payload_end + _SIGNATURE],
            )
        elif self._needs_signature(key_expr):
            raise Rejected("unsigned", f"unsigned frame from {sender} on {key_expr}, where members sign")
        session_key = frame[4 : start + 8]  # sender and session id
        counter = int.from_bytes(frame[start + 8 : start + 16], "big")
        with self._lock:
            window = self._windows.get(session_key)
            if window is None:
                sent_ms = int.from_bytes(frame[start + 16 : start + 24], "big")
                age = time.time() - sent_ms / 1000
                if age > self.max_age_s:
                    raise Rejected(
                        "stale",
                        f"first frame seen of a session of {sender} was sent {age:.0f}s ago "
                        f"(a replay, or this host's clock is off by more than {self.max_age_s:.0f}s)",
                    )
                window = self._windows[session_key] = _Window()
                if len(self._windows) > MAX_SESSIONS:
                    self._windows.popitem(last=False)
            else:
                self._windows.move_to_end(session_key)
            if not window.check(counter):
                raise Rejected("replayed", f"frame {counter} of {sender} was already delivered (replay)")
            window.mark(counter)
        return sender, frame[payload_at:payload_end]
