"""The telemetry relay: a follower hears one digest a round from the master, trusted from it alone."""

from __future__ import annotations

import asyncio
from typing import Any

from skulk_kernel.api import NodeHeartbeat, NodeIdentity, ReadingDigest, Topic, codec
from skulk_kernel.readings import ReadingStore
from skulk_master.relay import TelemetryRelay


class _Transport:
    def __init__(self) -> None:
        self.published: list[bytes] = []

    async def publish(self, topic: Topic, payload: bytes) -> None:
        assert topic is Topic.READINGS
        self.published.append(payload)


class _Node:
    def __init__(self, node_id: str, master: bool) -> None:
        self.node_id = node_id
        self.is_master = master
        self.transports = {"telemetry": _Transport()}
        self.handlers: list[Any] = []
        self.tasks: list[asyncio.Task[Any]] = []

    def subscribe(self, topic: Topic, handler: Any) -> None:
        self.handlers.append(handler)

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


def _identity(node_id: str, name: str) -> NodeIdentity:
    return NodeIdentity(node_id=node_id, friendly_name=name, skulk_version="0")


async def test_the_master_relays_a_round_in_one_digest_latest_per_node_and_kind() -> None:
    node = _Node("m", master=True)
    relay = TelemetryRelay(node, gap_s=0.05)  # type: ignore[arg-type]
    relay.attach()
    on_reading = node.handlers[0]
    for sender in ("a", "b", "c"):
        on_reading(sender, codec.encode(NodeHeartbeat(node_id=sender)))
    on_reading("a", codec.encode(_identity("a", "old")))
    on_reading("a", codec.encode(_identity("a", "new")))  # the latest of a kind wins
    on_reading("b", codec.encode(_identity("c", "forged")))  # a node speaks only for itself
    await asyncio.sleep(0.2)
    await relay.stop()
    published = node.transports["telemetry"].published
    assert len(published) == 1, "one digest for what arrived within a gap, nothing while nothing new arrived"
    store = ReadingStore()
    store.put_encoded("m", published[0], own_id="b")
    assert store.nodes() == {"a", "c"}, "a follower skips its own readings in the digest"
    identity = store.get(NodeIdentity, "a")
    assert identity is not None and identity.reading.friendly_name == "new"
    assert store.get(NodeIdentity, "c") is None


async def test_a_follower_relays_nothing() -> None:
    node = _Node("f", master=False)
    relay = TelemetryRelay(node, gap_s=0.05)  # type: ignore[arg-type]
    relay.attach()
    node.handlers[0]("a", codec.encode(NodeHeartbeat(node_id="a")))
    await asyncio.sleep(0.15)
    await relay.stop()
    assert node.transports["telemetry"].published == []


def test_a_digest_is_heard_from_any_master_but_never_overrides_our_own() -> None:
    """While two nodes both think they lead (a split at formation), each hears the other's digest."""
    digest = codec.encode(ReadingDigest(node_id="x", readings=(NodeHeartbeat(node_id="a"), _identity("f", "me?"))))
    store = ReadingStore()
    store.put_encoded("x", digest, own_id="f")
    assert store.nodes() == {"a"}
