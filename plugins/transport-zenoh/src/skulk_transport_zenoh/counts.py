"""Messages sent and received per plane: what a node costs the network, per second, at any size.

Read by `/v1/diagnostics/node` (`transports.<plane>.messages`) and by `bench/bench_scale.py`, which
divides two snapshots by the time between them. Plain integer increments under the GIL: a count
lost to a race between two transport threads does not matter to a rate.
"""

from __future__ import annotations

from skulk_kernel.api import Topic


class MessageCounts:
    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._received: dict[str, int] = {}

    def sent(self, topic: Topic) -> None:
        plane = topic.plane.value
        self._sent[plane] = self._sent.get(plane, 0) + 1

    def received(self, topic: Topic) -> None:
        plane = topic.plane.value
        self._received[plane] = self._received.get(plane, 0) + 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{plane: {"sent": n, "received": n}} since the transport started (own deliveries excluded)."""
        planes = sorted({*self._sent, *self._received})
        return {p: {"sent": self._sent.get(p, 0), "received": self._received.get(p, 0)} for p in planes}
