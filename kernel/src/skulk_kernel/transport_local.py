"""The in-process transport: every plane inside one node, no network.

The kernel default, so a single node (and every unit test) runs with no transport plugin;
messages stay bytes so code paths match the networked transports."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .contracts import PeerEvent
from .topics import Topic


class LocalTransport:
    name = "local"

    def __init__(self) -> None:
        self._subs: dict[Topic, list[Callable[[str, bytes], None]]] = defaultdict(list)
        self._node_id = ""
        self._handlers: dict[Topic, Callable[[str, bytes], bytes]] = {}

    async def start(self, node_id: str, options: dict[str, Any]) -> None:
        self._node_id = node_id

    async def stop(self) -> None:
        self._subs.clear()

    async def publish(self, topic: Topic, payload: bytes) -> None:
        for callback in list(self._subs[topic]):
            callback(self._node_id, payload)

    def subscribe(self, topic: Topic, callback: Callable[[str, bytes], None]) -> None:
        self._subs[topic].append(callback)

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        if node_id == self._node_id:
            await self.publish(topic, payload)

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None:
        """A lone node has no peers."""

    def serve(self, topic: Topic, handler: Callable[[str, bytes], bytes]) -> None:
        self._handlers[topic] = handler

    async def request(self, node_id: str, topic: Topic, payload: bytes, timeout: float) -> bytes:
        handler = self._handlers.get(topic)
        if node_id != self._node_id or handler is None:
            raise TimeoutError(f"no node {node_id} serving {topic.value} in this process")
        return handler(self._node_id, payload)
