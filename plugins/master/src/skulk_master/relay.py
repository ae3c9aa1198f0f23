"""The master relays the cluster's telemetry: one digest per round to every node, not N messages.

Without it every node publishes its readings to every other node, so each node hears N-1 heartbeats
per round and the cluster carries N^2 messages (22 per second received per follower at 24 nodes,
growing with N). Now a follower addresses its readings to the master alone (the kernel routes
`Topic.READINGS` there while it holds a session with the master, and broadcasts otherwise), and the
master publishes what it heard in each round as one `ReadingDigest`: a follower hears one message
per round whatever the cluster's size; the master hears N-1, as it must to judge liveness.

A reading is relayed once (the latest per node, kind and model), in the digest that leaves at most
`GAP_S` after it arrived: a follower hears at most one digest per gap whatever the cluster's size,
and relaying adds at most a gap to a reading's age there (a heartbeat is at most ~3 s old at a
follower, under the 5 s after which placement treats readings as stale). A node that went silent is
not relayed, so it ages at every follower as it did before. A new peer is brought up to
date because every node re-sends all its readings when it sees a peer join (the kernel's
`SendFilter.reset`), and the next digest carries them. A node takes a digest from any master, not
only its own (`ReadingStore.put_encoded`): while two nodes both think they lead (a split as a
cluster forms), each must still hear the other's followers, or it prunes them as silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgpack
from pydantic import TypeAdapter
from skulk_kernel.api import NodeSurface, Reading, ReadingDigest, Topic, codec

log = logging.getLogger(__name__)

GAP_S = 1.0  # at most one digest this often (half the kernel's 2 s heartbeat interval)
MAX_PENDING = 32_768  # a ceiling whatever happens (4,096 nodes x 8 kinds)
HOLD_S = 5.0  # what a node heard before it knew it leads is relayed if it becomes master within this

_READING: TypeAdapter[Any] = TypeAdapter(Reading)


class TelemetryRelay:
    """Collects the readings addressed to this node while it is master; publishes them each round."""

    def __init__(self, node: NodeSurface, gap_s: float = GAP_S) -> None:
        self.node = node
        self.gap_s = gap_s
        self._arrived = asyncio.Event()
        self._pending: dict[tuple[str, str, str], tuple[float, Any]] = {}  # key -> (arrived, reading)
        self._task: asyncio.Task[Any] | None = None

    def attach(self) -> None:
        self.node.subscribe(Topic.READINGS, self._on_reading)
        self._task = self.node.spawn(self._loop(), "telemetry-relay")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_reading(self, sender: str, payload: bytes) -> None:
        """Kept even while this node is not (yet) master: a follower that heard the election's
        announcement sends here before this node's own `set_master` has run, and sends a reading
        again only when it changes (its heartbeats then wake the relay and carry it out)."""
        wire = msgpack.unpackb(payload, raw=False)
        if not isinstance(wire, dict) or "ReadingDigest" in wire:
            return  # a digest (every node hears them): the kernel's store takes it, not validated twice
        reading = _READING.validate_python(wire)
        if reading.node_id != sender:
            return  # a node speaking for another
        key = (sender, type(reading).__name__, getattr(reading, "model_id", ""))
        if key in self._pending or len(self._pending) < MAX_PENDING:
            self._pending[key] = (time.monotonic(), reading)
            self._arrived.set()

    def take_digest(self) -> ReadingDigest | None:
        """This round's readings, once each (what a non-master held past `HOLD_S` is dropped)."""
        fresh = [r for at, r in self._pending.values() if time.monotonic() - at < HOLD_S]
        self._pending.clear()
        return ReadingDigest(node_id=self.node.node_id, readings=tuple(fresh)) if fresh else None

    async def _loop(self) -> None:
        while True:
            await self._arrived.wait()
            await asyncio.sleep(self.gap_s)  # what arrives meanwhile leaves in the same digest
            self._arrived.clear()
            if not self.node.is_master:
                continue  # held: this node may be about to lead (the next arrival wakes us)
            digest = self.take_digest()
            if digest is None:
                continue
            try:  # past the kernel's routing: a digest goes to every node
                await self.node.transports["telemetry"].publish(Topic.READINGS, codec.encode(digest))
            except Exception:
                log.warning("could not publish the telemetry digest", exc_info=True)
