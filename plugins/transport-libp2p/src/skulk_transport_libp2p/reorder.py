"""Per-publisher ordering on top of gossipsub, which hands messages on in no particular order.

Each (publisher, topic) has its own next expected sequence number. A message ahead of it waits;
a gap not filled within `gap_s` (the message was lost) is skipped with a log line, so one lost
message delays its publisher's later ones by at most `gap_s` and never stops the topic. The first
message of a publisher not seen before (this node joined late) starts its sequence, after a short
wait for any earlier one overtaken on the way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("skulk.transport.libp2p.reorder")

Deliver = Callable[[str, str, bytes], None]  # (topic, sender, payload)
FIRST_WAIT_S = 0.05


@dataclass
class _Stream:
    expected: int | None  # None: the first message's wait is running
    held: dict[int, bytes] = field(default_factory=dict)
    since: float = 0.0  # when the oldest gap (or the first wait) began


class Reorder:
    def __init__(self, deliver: Deliver, gap_s: float) -> None:
        self._deliver = deliver
        self.gap_s = gap_s
        self._streams: dict[tuple[str, str], _Stream] = {}
        self.skipped = 0

    def push(self, topic: str, sender: str, seq: int, payload: bytes, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = (topic, sender)
        stream = self._streams.get(key)
        if stream is None:
            stream = _Stream(expected=0 if seq == 0 else None, since=now)
            self._streams[key] = stream
        if stream.expected is not None and seq < stream.expected:
            return  # a duplicate, or a message older than a gap already skipped
        if not stream.held:
            stream.since = now
        stream.held[seq] = payload
        self._drain(topic, sender, stream)

    def _drain(self, topic: str, sender: str, stream: _Stream) -> None:
        if stream.expected is None:
            return
        while stream.expected in stream.held:
            payload = stream.held.pop(stream.expected)
            stream.expected += 1
            self._deliver(topic, sender, payload)

    def tick(self, now: float | None = None) -> None:
        """Skip gaps older than gap_s and end first waits; call a few times per second."""
        now = time.monotonic() if now is None else now
        for (topic, sender), stream in self._streams.items():
            if not stream.held:
                continue
            if stream.expected is None:
                if now - stream.since >= FIRST_WAIT_S:
                    stream.expected = min(stream.held)
                    self._drain(topic, sender, stream)
                continue
            if now - stream.since >= self.gap_s:
                nxt = min(stream.held)
                self.skipped += nxt - stream.expected
                log.warning(
                    "%d message(s) from %s on %s never arrived; skipped after %.1fs",
                    nxt - stream.expected,
                    sender,
                    topic,
                    self.gap_s,
                )
                stream.expected = nxt
                self._drain(topic, sender, stream)
                stream.since = now

    def forget(self, sender: str) -> None:
        """A publisher left: drop its state (a node that returns is a new node with a new id)."""
        for key in [k for k in self._streams if k[1] == sender]:
            del self._streams[key]
