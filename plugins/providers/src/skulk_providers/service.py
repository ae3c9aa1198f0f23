"""The per-node provider service: loaded extensions, the call server and caller, discovery.

Advertising is cheap and fetching is on demand: while its capabilities are ready, a node names them
(id@version) in its NodeResources telemetry reading; the full descriptors (schemas, revision) are
asked of that node over the provider topic's request/reply only when someone wants them. Both the
requests and the call frames ride the data-plane transport, whose frames are sealed with the
cluster secret: only members call each other.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from skulk_kernel.api import NodeResources, NodeSurface, Topic

from . import frames
from .api import Descriptor
from .client import Caller
from .config import ProvidersConfig
from .extensions import ExtensionRecord, Loaded
from .frames import CallError
from .server import CallServer

log = logging.getLogger("skulk.providers.service")
FRESH_S = 6.0  # a NodeResources reading older than this: the node's capabilities are not trusted
DESCRIBE = b'{"describe": true}'
ADVERTISE_S = 1.0  # how often readiness is asked (the telemetry loop sends the tag when it changed)


class ProviderService:
    """Owns this node's side of capabilities: what it offers and how it calls others'."""

    def __init__(self, node: NodeSurface, config: ProvidersConfig, loaded: Loaded) -> None:
        self.node = node
        self.config = config
        self.records: list[ExtensionRecord] = loaded.records
        self.capabilities = loaded.capabilities
        self.server = CallServer(loaded.capabilities, config, self._send, node.spawn, node.reachable_nodes)
        self.caller = Caller(node.node_id, self._send, config.max_payload_bytes)
        self.ready: list[str] = []

    @property
    def _transport(self) -> Any:
        return self.node.transports[Topic.PROVIDER.plane.value]

    async def _send(self, node_id: str, payload: bytes) -> None:
        await self._transport.send(node_id, Topic.PROVIDER, payload)

    def start(self) -> None:
        self.node.subscribe(Topic.PROVIDER, self._on_frame)
        self._transport.serve(Topic.PROVIDER, self._describe)
        self.node.spawn(self.server.sweep(lambda: self.node.stopping), "providers-sweep")
        self.refresh()
        self.node.spawn(self._advertise(), "providers-advertise")

    def refresh(self) -> None:
        """The telemetry tag: the capabilities ready now (NodeResources.capabilities, from facts)."""
        ready = []
        for ref, cap in self.capabilities.items():
            try:
                if cap.ready():
                    ready.append(ref)
            except Exception as exc:  # an extension's check raised: not ready, the node goes on
                log.debug("capability %s: ready() raised %r", ref, exc)
        self.ready = sorted(ready)
        self.node.facts["capabilities"] = self.ready

    async def _advertise(self) -> None:
        while not self.node.stopping:
            await asyncio.sleep(ADVERTISE_S)
            self.refresh()

    async def stop(self) -> None:
        self.ready = []
        self.node.facts["capabilities"] = []
        await self.server.close()

    async def _on_frame(self, sender: str, payload: bytes) -> None:
        try:
            frame = frames.decode(payload)
        except ValueError as exc:
            log.warning("dropped an unreadable provider frame from %s: %s", sender, str(exc)[:200])
            return
        if isinstance(frame, frames.Open | frames.Input | frames.InputEnd | frames.Cancel):
            await self.server.on_frame(sender, frame, len(payload))
        else:
            self.caller.on_frame(sender, frame)

    def _describe(self, sender: str, payload: bytes) -> bytes:
        return json.dumps(self.describe_local()).encode()

    def describe_local(self) -> dict[str, Any]:
        return {
            "node_id": self.node.node_id,
            "ready": list(self.ready),
            "capabilities": [
                c.descriptor.model_dump(mode="json", exclude={"ref", "revision"}) for c in self.capabilities.values()
            ],  # computed again (and so checked) by the asker
        }

    # ------------------------------------------------------------------ discovery

    def advertised(self) -> dict[str, tuple[str, ...]]:
        """node -> capability refs, from fresh telemetry (this node's own from what it loaded)."""
        out: dict[str, tuple[str, ...]] = {}
        alive = self.node.reachable_nodes()
        for node_id, got in self.node.readings.latest(NodeResources).items():
            caps = tuple(getattr(got.reading, "capabilities", ()))
            if caps and node_id in alive and got.age_s < FRESH_S:
                out[node_id] = caps
        if self.ready:
            out[self.node.node_id] = tuple(self.ready)
        return out

    async def describe(self, node_id: str) -> list[Descriptor]:
        """The descriptors node `node_id` serves, asked of it now (typed errors when it cannot answer)."""
        return (await self.describe_ready(node_id))[0]

    async def describe_ready(self, node_id: str) -> tuple[list[Descriptor], set[str]]:
        """The descriptors node `node_id` serves and which of them are ready, asked of it now."""
        if node_id == self.node.node_id:
            return [c.descriptor for c in self.capabilities.values()], set(self.ready)
        if node_id not in self.node.reachable_nodes():
            raise CallError("unknown_node", f"node {node_id} is not a reachable member (GET /state lists the nodes)")
        try:
            raw = await self._transport.request(node_id, Topic.PROVIDER, DESCRIBE, self.config.discovery_timeout_s)
            body = json.loads(raw)
            return [Descriptor.model_validate(d) for d in body["capabilities"]], set(body.get("ready", ()))
        except TimeoutError as exc:
            raise CallError("node_unreachable", f"node {node_id} did not describe its capabilities: {exc}") from exc
        except Exception as exc:
            raise CallError("node_unreachable", f"node {node_id} answered no descriptors: {exc!r}"[:500]) from exc

    async def discover(self, node_id: str | None = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Descriptors per node (one node, or every node that advertises some), and nodes that failed."""
        targets = [node_id] if node_id else sorted(self.advertised())
        results = await asyncio.gather(*(self.describe_ready(n) for n in targets), return_exceptions=True)
        found: list[dict[str, Any]] = []
        failed: dict[str, str] = {}
        for target, result in zip(targets, results, strict=True):
            if isinstance(result, CallError):
                if node_id:
                    raise result
                failed[target] = result.message
            elif isinstance(result, BaseException):
                failed[target] = repr(result)
            else:
                descriptors, ready = result
                found += [
                    {"node_id": target, "ready": d.ref in ready, **d.model_dump(mode="json")} for d in descriptors
                ]
        return found, failed
