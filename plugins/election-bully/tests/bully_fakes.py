"""A tiny in-memory cluster for election tests: fake nodes on one shared in-process bus.

A FakeNode exposes the subset of the Node API the election uses (node_id, options.force_master,
state.last_event_applied_idx, subscribe/publish, spawn, transports["control"].on_peer, set_master)
and records every master change it is told about. The Bus delivers every published message to every
subscriber (the sender included, as real transports do), each node in order through its own pump
task, and can cut links to simulate partitions and frozen nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from types import SimpleNamespace
from typing import Any

from skulk_election_bully.election import BullyElection
from skulk_election_bully.plugin import BullyConfig
from skulk_kernel.api import PeerEvent, Topic

# Fast timings so multi-node scenarios take a second or two; the ratios match the defaults.
FAST = BullyConfig(campaign_timeout_s=0.3, heartbeat_s=0.1, master_timeout_s=0.6)


class Bus:
    def __init__(self) -> None:
        self.nodes: dict[str, FakeNode] = {}
        self.muted: set[str] = set()  # nodes whose outgoing messages are dropped
        self.cut: set[tuple[str, str]] = set()  # (sender, receiver) links that drop messages

    def allowed(self, src: str, dst: str) -> bool:
        return src == dst or (src not in self.muted and (src, dst) not in self.cut)

    def deliver(self, src: str, topic: Topic, payload: bytes) -> None:
        for node in list(self.nodes.values()):
            if self.allowed(src, node.node_id):
                node.receive(src, topic, payload)

    def inject(self, src: str, payload: bytes, topic: Topic = Topic.ELECTION) -> None:
        """A message from `src` (which need not be a node) to everyone."""
        for node in list(self.nodes.values()):
            node.receive(src, topic, payload)

    def join(self, node: FakeNode) -> None:
        for other in self.nodes.values():
            other.transport.emit(PeerEvent(node.node_id, True))
            node.transport.emit(PeerEvent(other.node_id, True))
        self.nodes[node.node_id] = node

    def leave(self, node: FakeNode, *, notify: bool) -> None:
        self.nodes.pop(node.node_id, None)
        if notify:
            for other in self.nodes.values():
                other.transport.emit(PeerEvent(node.node_id, False))

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        a, b = list(side_a), list(side_b)
        self.cut |= {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}

    def heal(self) -> None:
        self.cut.clear()
        self.muted.clear()


class FakeTransport:
    name = "fake"

    def __init__(self) -> None:
        self.callbacks: list[Callable[[PeerEvent], None]] = []
        self.owner: Any = None  # the FakeNode, for send()

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None:
        self.callbacks.append(callback)

    @property
    def peers(self) -> frozenset[str]:
        node = self.owner
        return frozenset(n for n in node.bus.nodes if n != node.node_id) if node is not None else frozenset()

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        """An addressed message (a follower's status to its master), through the same muting and cuts."""
        node = self.owner
        target = node.bus.nodes.get(node_id)
        if node is not None and node.alive and target is not None and node.bus.allowed(node.node_id, node_id):
            target.receive(node.node_id, topic, payload)

    def emit(self, event: PeerEvent) -> None:
        for callback in self.callbacks:
            callback(event)


class FakeNode:
    def __init__(
        self, bus: Bus, node_id: str, *, force_master: bool = False, applied: int = -1, config: BullyConfig = FAST
    ) -> None:
        self.bus = bus
        self.node_id = node_id
        self.options = SimpleNamespace(force_master=force_master)
        self.state = SimpleNamespace(last_event_applied_idx=applied)
        self.transport = FakeTransport()
        self.transport.owner = self
        self.transports = {"control": self.transport, "telemetry": self.transport, "data": self.transport}
        self.master_id: str | None = None
        self.changes: list[str | None] = []
        self.election = BullyElection(config)
        self._queues: dict[Topic, list[asyncio.Queue[tuple[str, bytes]]]] = defaultdict(list)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.alive = False

    def __repr__(self) -> str:
        return f"<{self.node_id} master={self.master_id} changes={self.changes}>"

    # -- the Node API subset
    def subscribe(self, topic: Topic, handler: Callable[[str, bytes], Awaitable[None] | None]) -> None:
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._queues[topic].append(queue)

        async def pump() -> None:
            while True:
                sender, payload = await queue.get()
                result = handler(sender, payload)
                if asyncio.iscoroutine(result):
                    await result

        self.spawn(pump(), f"pump-{topic.value}")

    async def publish(self, topic: Topic, payload: bytes) -> None:
        if self.alive:
            self.bus.deliver(self.node_id, topic, payload)

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.node_id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def set_master(self, master_id: str | None) -> None:
        self.master_id = master_id
        self.changes.append(master_id)

    # -- test helpers
    def receive(self, sender: str, topic: Topic, payload: bytes) -> None:
        for queue in self._queues[topic]:
            queue.put_nowait((sender, payload))

    async def start(self) -> FakeNode:
        self.alive = True
        self.bus.join(self)
        await self.election.start(self, self.set_master)
        return self

    async def stop(self) -> None:
        """A clean shutdown: the election says goodbye, the transport reports the departure."""
        await self.election.stop()
        self.alive = False
        self.bus.leave(self, notify=True)
        await self._cancel_tasks()

    async def crash(self) -> None:
        """Gone without a word: no goodbye, no membership event (a kill -9 behind a slow transport)."""
        self.alive = False
        self.bus.leave(self, notify=False)
        await self._cancel_tasks()

    async def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def start_nodes(bus: Bus, *specs: dict[str, Any] | str, gap_s: float = 0.0) -> list[FakeNode]:
    nodes = []
    for spec in specs:
        kwargs = {"node_id": spec} if isinstance(spec, str) else dict(spec)
        node = FakeNode(bus, **kwargs)
        await node.start()
        nodes.append(node)
        if gap_s:
            await asyncio.sleep(gap_s)
    return nodes


def agreed_master(nodes: Iterable[FakeNode]) -> str | None:
    """The master every node reports, when they all report the same live one, which alone leads."""
    nodes = list(nodes)
    masters = {n.master_id for n in nodes}
    if len(masters) != 1:
        return None
    (master,) = masters
    leaders = [n.node_id for n in nodes if n.election.is_master]
    if master is None or leaders != [master]:
        return None
    return master


async def wait_until(check: Callable[[], Any], timeout: float, what: str, nodes: Iterable[FakeNode] = ()) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {list(nodes)}")
        await asyncio.sleep(0.02)


async def wait_agreed(nodes: list[FakeNode], timeout: float) -> str:
    return await wait_until(lambda: agreed_master(nodes), timeout, "one agreed master", nodes)


@contextlib.asynccontextmanager
async def cluster() -> Any:
    """A Bus whose nodes are all stopped at the end of the test."""
    bus = Bus()
    try:
        yield bus
    finally:
        for node in list(bus.nodes.values()):
            await node.crash()


class SharedBus:
    """Members of an in-process network of real Nodes (see BusTransport)."""

    def __init__(self) -> None:
        self.members: dict[str, BusTransport] = {}

    def join(self, transport: BusTransport) -> None:
        for other in list(self.members.values()):
            other.emit(PeerEvent(transport.node_id, True))
            transport.emit(PeerEvent(other.node_id, True))
        self.members[transport.node_id] = transport

    def leave(self, transport: BusTransport) -> None:
        if self.members.pop(transport.node_id, None) is not None:
            for other in list(self.members.values()):
                other.emit(PeerEvent(transport.node_id, False))


class BusTransport:
    """contracts.Transport over a SharedBus, so several real Nodes in one process form a cluster."""

    name = "testbus"

    def __init__(self, bus: SharedBus) -> None:
        self.bus = bus
        self.node_id = ""
        self._subs: dict[Topic, list[Callable[[str, bytes], None]]] = defaultdict(list)
        self._peer_callbacks: list[Callable[[PeerEvent], None]] = []

    async def start(self, node_id: str, options: dict[str, Any]) -> None:
        self.node_id = node_id
        self.bus.join(self)

    async def stop(self) -> None:
        self.bus.leave(self)

    async def publish(self, topic: Topic, payload: bytes) -> None:
        for member in list(self.bus.members.values()):
            for callback in list(member._subs[topic]):
                callback(self.node_id, payload)

    def subscribe(self, topic: Topic, callback: Callable[[str, bytes], None]) -> None:
        self._subs[topic].append(callback)

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        member = self.bus.members.get(node_id)
        if member is not None:
            for callback in list(member._subs[topic]):
                callback(self.node_id, payload)

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None:
        self._peer_callbacks.append(callback)
        for node_id in list(self.bus.members):
            if node_id != self.node_id:
                callback(PeerEvent(node_id, True))

    def emit(self, event: PeerEvent) -> None:
        for callback in list(self._peer_callbacks):
            callback(event)
