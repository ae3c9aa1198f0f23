"""Telemetry readings: this node's own probes, and the last-write-wins store of everyone's (receipt
time stamped locally with a monotonic clock: freshness never trusts a sender's clock)."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from . import codec
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
    """(kind, node) -> freshest reading. Bounded by construction: one slot per kind per node."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str], Received] = {}

    def put(self, node_id: str, reading: Any) -> None:
        self._slots[(type(reading).__name__, node_id)] = Received(reading, time.monotonic(), time.time())

    def put_encoded(self, sender: str, payload: bytes) -> None:
        reading = codec.decode_union(payload, _READING)
        if reading.node_id == sender:  # a node may only speak for itself
            self.put(sender, reading)

    def get(self, kind: type[Any], node_id: str) -> Received | None:
        return self._slots.get((kind.__name__, node_id))

    def latest(self, kind: type[Any]) -> dict[str, Received]:
        return {node: r for (k, node), r in self._slots.items() if k == kind.__name__}

    def nodes(self) -> set[str]:
        return {node for _, node in self._slots}

    def last_heard(self, node_id: str) -> float | None:
        """Seconds since anything was heard from `node_id`, or None."""
        ages = [r.age_s for (_, node), r in self._slots.items() if node == node_id]
        return min(ages) if ages else None

    def forget(self, node_id: str) -> None:
        for key in [k for k in self._slots if k[1] == node_id]:
            del self._slots[key]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
                 "models_present": tuple(facts.get("models_present", ()))}  # fmt: skip
    gpus = [g for g in facts.get("gpus", ()) if g.get("vram_total_bytes")]
    if gpus:
        resources["vram_total"] = sum(g["vram_total_bytes"] for g in gpus)
        resources["vram_available"] = sum(g.get("vram_free_bytes") or 0 for g in gpus)
    identity = NodeIdentity(node_id=nid, friendly_name=node.options.node_name, skulk_version=kernel_version(),
                            skulk_commit=commit, network_version=network)  # fmt: skip
    return [
        identity,
        NodeMemory(node_id=nid, ram_total=Memory(in_bytes=vm.total), ram_available=Memory(in_bytes=vm.available)),
        NodeSystem(node_id=nid, **system),
        NodeResources(node_id=nid, **resources),
        NodeDisk(node_id=nid, models_dir=models_dir, total_bytes=disk.total, free_bytes=disk.free),
        NodeHeartbeat(node_id=nid),
    ]
