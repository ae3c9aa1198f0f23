"""Telemetry readings: this node's own probes, and the last-write-wins store of everyone's (receipt
time stamped locally with a monotonic clock: freshness never trusts a sender's clock)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from . import codec, telemetry
from .telemetry import Memory, NodeDisk, NodeHeartbeat, NodeIdentity, NodeMemory, NodeResources, NodeSystem, Reading

if TYPE_CHECKING:
    from .node import Node

_READING = TypeAdapter(Reading)


@dataclass(frozen=True)
class Received:
    reading: Any
    at_monotonic: float
    at_wall: float

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.at_monotonic


class ReadingStore:
    """node -> kind -> freshest reading. Bounded by construction: one slot per kind per node.

    Indexed by node first, so a node's age and its forgetting cost its own few slots, not a scan of
    the whole cluster's (the master asks every node's age every second). A heartbeat re-stamps the
    sender's other readings: a node sends a reading again only when it changed (SendFilter), so
    its heartbeat is what says the rest still holds.
    """

    MAX_NODES = 4096  # a ceiling whatever happens: past it, the node heard from longest ago goes

    def __init__(self) -> None:
        self._slots: dict[str, dict[str, Received]] = {}

    def put(self, node_id: str, reading: Any) -> None:
        got = Received(reading, time.monotonic(), time.time())
        if node_id not in self._slots and len(self._slots) >= self.MAX_NODES:
            self.forget(min(self._slots, key=lambda n: max(r.at_monotonic for r in self._slots[n].values())))
        slots = self._slots.setdefault(node_id, {})
        if isinstance(reading, NodeHeartbeat):
            for kind, old in slots.items():
                slots[kind] = Received(old.reading, got.at_monotonic, got.at_wall)
        slots[type(reading).__name__] = got

    def put_encoded(self, sender: str, payload: bytes, own_id: str = "") -> None:
        """A node's own reading, or a master's digest of a round's (any master's: while two nodes
        both think they lead, each must still hear the other's followers, or it prunes them)."""
        reading = codec.decode_union(payload, _READING)
        if isinstance(reading, telemetry.ReadingDigest):
            for relayed in reading.readings:
                if relayed.node_id != own_id:  # our own readings never wait for the net
                    self.put(relayed.node_id, relayed)
        elif reading.node_id == sender:  # a node may only speak for itself
            self.put(sender, reading)

    def get(self, kind: type[Any], node_id: str) -> Received | None:
        return self._slots.get(node_id, {}).get(kind.__name__)

    def latest(self, kind: type[Any]) -> dict[str, Received]:
        return {node: slots[kind.__name__] for node, slots in self._slots.items() if kind.__name__ in slots}

    def nodes(self) -> set[str]:
        return set(self._slots)

    def last_heard(self, node_id: str) -> float | None:
        """Seconds since anything was heard from `node_id`, or None."""
        ages = [r.age_s for r in self._slots.get(node_id, {}).values()]
        return min(ages) if ages else None

    def forget(self, node_id: str) -> None:
        self._slots.pop(node_id, None)


class SendFilter:
    """Which of this node's readings go out this round: the heartbeat always; another reading when
    it changed (memory and disk in 64 MiB and 256 MiB steps) or every REFRESH_S. Idle, a node sends
    one message a round instead of six; a new peer gets everything at once (`reset`)."""

    REFRESH_S = 30.0

    def __init__(self) -> None:
        self._sent: dict[str, tuple[Any, float]] = {}
        self._reset = asyncio.Event()

    def reset(self) -> None:  # now, not next round: a new master must not judge members by old digests
        self._sent.clear()
        self._reset.set()

    async def next_round(self, interval_s: float) -> None:
        wake = asyncio.ensure_future(self._reset.wait())
        try:  # asyncio.wait: 3.11's wait_for returns a reset landing with a cancel and loses the cancel
            await asyncio.wait((wake,), timeout=interval_s)
        finally:
            wake.cancel()
        self._reset.clear()

    def due(self, reading: Any) -> bool:
        kind, now = type(reading).__name__, time.monotonic()
        if isinstance(reading, NodeMemory):
            key: Any = (reading.ram_total.in_bytes, reading.ram_available.in_bytes >> 26)
        elif isinstance(reading, NodeDisk):
            key = (reading.models_dir, reading.total_bytes, reading.free_bytes >> 28)
        else:
            key = reading
        last = self._sent.get(kind)
        if last and last[0] == key and now - last[1] < self.REFRESH_S and not isinstance(reading, NodeHeartbeat):
            return False
        self._sent[kind] = (key, now)
        return True


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    return platform.processor()


def _addresses() -> tuple[str, ...]:
    import psutil

    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET]
    return tuple(sorted(set(found), key=lambda a: (a.startswith("127."), a)))


def probe_readings(node: Node, splits: dict[str, tuple[str, ...]]) -> list[Any]:
    """Everything this node says about itself each heartbeat interval."""
    import psutil

    from .plugins import kernel_version

    vm = psutil.virtual_memory()
    models_dir = str(node.facts.get("models_dir") or node.home)
    os.makedirs(models_dir, exist_ok=True)
    disk = shutil.disk_usage(models_dir)
    nid, facts = node.node_id, node.facts
    commit, network = os.environ.get("SKULK_COMMIT", ""), str(facts.get("network_version", ""))
    system = {"os": platform.system(), "arch": platform.machine(), "cpu_model": _cpu_model(),
              "cpu_count": os.cpu_count() or 1, "python": platform.python_version()}  # fmt: skip
    resources = {"backends": tuple(splits), "splits": splits, "addresses": _addresses(),
                 "engine_builds": dict(facts.get("engine_builds", {})), "data_transport": node.transports["data"].name,
                 "api_available": bool(facts.get("api_available")), "api_port": facts.get("api_port"),
                 "models_present": tuple(facts.get("models_present", ())),
                 "capabilities": tuple(facts.get("capabilities", ()))}  # fmt: skip
    gpus = [g for g in facts.get("gpus", ()) if g.get("vram_total_bytes")]
    if gpus:
        resources["vram_total"] = sum(g["vram_total_bytes"] for g in gpus)
        resources["vram_available"] = sum(g.get("vram_free_bytes") or 0 for g in gpus)
    notes = {p: {c: m[:500] for c, m in list(n.items())[:8]} for p, n in list(node.health_notes.items())[:16]}
    identity = NodeIdentity(node_id=nid, friendly_name=node.options.node_name, skulk_version=kernel_version(),
                            skulk_commit=commit, network_version=network)  # fmt: skip
    return [
        identity,
        NodeMemory(node_id=nid, ram_total=Memory(in_bytes=vm.total), ram_available=Memory(in_bytes=vm.available)),
        NodeSystem(node_id=nid, **system),
        NodeResources(node_id=nid, **resources),
        NodeDisk(node_id=nid, models_dir=models_dir, total_bytes=disk.total, free_bytes=disk.free),
        telemetry.NodeHealthNotes(node_id=nid, notes=notes),  # sent on change (SendFilter)
        NodeHeartbeat(node_id=nid),
    ]
