"""Telemetry readings: last-write-wins facts about nodes that are NOT in State.

Memory, load and heartbeats change every few seconds; putting them in the event log would fill the
replay tail with noise. They travel on the telemetry plane, the receiver stamps its own receipt time
(a sender's clock is never trusted) and `/state` merges the freshest readings at read time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from pydantic import Field

from .ids import NodeId
from .wire import Tagged, WireModel, tagged_union


class Memory(WireModel):
    in_bytes: int = Field(ge=0)


class NodeIdentity(Tagged):
    node_id: NodeId
    friendly_name: str
    skulk_version: str
    skulk_commit: str = ""
    network_version: str = ""


class NodeMemory(Tagged):
    node_id: NodeId
    ram_total: Memory
    ram_available: Memory


class NodeSystem(Tagged):
    node_id: NodeId
    os: str
    arch: str
    cpu_model: str = ""
    cpu_count: int = 1
    python: str = ""


class NodeResources(Tagged):
    node_id: NodeId
    backends: tuple[str, ...] = ()
    engine_builds: dict[str, str] = Field(default_factory=dict)
    data_transport: str = "local"
    api_available: bool = False
    api_port: int | None = None
    splits: dict[str, tuple[str, ...]] = Field(default_factory=dict)  # backend tag -> placements it can split
    addresses: tuple[str, ...] = ()  # this node's IPv4 addresses, loopback last
    vram_total: int | None = None  # bytes over this node's GPUs (None: no GPU seen); a pool of its own
    vram_available: int | None = None
    models_present: tuple[str, ...] = ()  # model ids whose files this node holds (the store bounds it)
    capabilities: tuple[str, ...] = ()  # provider capabilities ready here (id@version), from facts


class NodeDisk(Tagged):
    node_id: NodeId
    models_dir: str
    total_bytes: int = 0
    free_bytes: int = 0


class NodeHeartbeat(Tagged):
    node_id: NodeId


class NodeHealthNotes(Tagged):  # node.health_notes, so every node's /state names every node's problems
    node_id: NodeId
    notes: dict[str, dict[str, str]] = Field(default_factory=dict)  # plugin -> {code: message}, bounded


class DownloadProgress(Tagged):
    node_id: NodeId
    model_id: str
    downloaded_bytes: int = 0
    total_bytes: int = 0
    phase: str = ""


_Probed: TypeAlias = NodeIdentity | NodeMemory | NodeSystem | NodeResources | NodeDisk | NodeHeartbeat
_Relayable: TypeAlias = _Probed | DownloadProgress | NodeHealthNotes
Relayed: TypeAlias = _Relayable
if not TYPE_CHECKING:
    Relayed = tagged_union(_Relayable)


class ReadingDigest(Tagged):  # the master relays a round's readings in one message: O(1) per follower, not O(N)
    node_id: NodeId
    readings: tuple[Relayed, ...] = ()


Reading: TypeAlias = _Relayable | ReadingDigest
if not TYPE_CHECKING:
    Reading = tagged_union(Reading)
