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
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import threading
import time
from collections import OrderedDict

MAGIC = b"SKZ2"
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

    def __init__(self, key: bytes, sender: str) -> None:
        raw = sender.encode()
        if not raw or len(raw) > 255:
            raise ValueError(f"node id {sender!r} must be 1-255 bytes")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._head = MAGIC + len(raw).to_bytes(1, "big") + raw + secrets.token_bytes(8)
        self._counter = itertools.count(1)  # next() is atomic under the GIL: safe across threads

    def seal(self, key_expr: str, payload: bytes) -> bytes:
        body = b"".join(
            (
                self._head,
                next(self._counter).to_bytes(8, "big"),
                int(time.time() * 1000).to_bytes(8, "big"),
                payload,
            )
        )
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

    def __init__(self, key: bytes, max_age_s: float = 300.0) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.max_age_s = max_age_s
        self._windows: OrderedDict[bytes, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, key_expr: str, frame: bytes) -> tuple[str, bytes]:
        """(sender, payload) of an authentic, fresh frame; raises Rejected otherwise."""
        if len(frame) < len(MAGIC) + 1 + _FIXED + TAG_BYTES or frame[:4] != MAGIC:
            raise Rejected("malformed", f"no sealed skulk frame ({len(frame)} bytes, starts {frame[:6]!r})")
        n = frame[4]
        start = 5 + n
        if n == 0 or len(frame) < start + _FIXED + TAG_BYTES:
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
        return sender, frame[start + _FIXED : -TAG_BYTES]
