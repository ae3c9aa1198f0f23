"""GET /state: the replicated State plus live telemetry, and a derived health summary per node.

Telemetry is merged at read time (it is never in State). Health is computed read-only from what
the response already holds, with a remediation for every reason, so an operator sees why a node
is being routed around.
"""

from __future__ import annotations

from typing import Any

from skulk_kernel.api import (
    DownloadProgress,
    NodeDisk,
    NodeHealthNotes,
    NodeHeartbeat,
    NodeIdentity,
    NodeMemory,
    NodeResources,
    NodeSurface,
    NodeSystem,
)
from skulk_master import MASTER

from .reference_wire import to_reference

LOW_DISK_BYTES = 2 * 1024**3
HEARTBEAT_WARN_S = 10.0


def _inner(reading: Any) -> dict[str, Any]:
    return next(iter(reading.wire().values()))


def master_log_status(node: NodeSurface) -> Any:
    """The master plugin's event-log status on the master, else None (the log is the master's)."""
    master = node.services.get(MASTER) if node.is_master else None
    return master.event_log_status() if master is not None else None


def plugin_reasons(node: NodeSurface, node_id: str) -> list[dict[str, Any]]:
    """What `node_id`'s plugins report (version mismatch, hardware conflict, refused peers, disk,
    registry): this node's own notes, another node's from its `NodeHealthNotes` reading (sent on
    change), so any node's /state names every node's problems. Each reason names its node."""
    if node_id == node.node_id:
        notes = node.health_notes
    else:
        got = node.readings.get(NodeHealthNotes, node_id)
        notes = got.reading.notes if got is not None else {}
    identity = node.readings.get(NodeIdentity, node_id)
    name = identity.reading.friendly_name if identity is not None else node_id
    return [
        {
            "level": "warn",
            "message": f"{plugin}: " + "; ".join(f"{code}: {text}" for code, text in sorted(plugin_notes.items())),
            "remediation": f"see GET /v1/diagnostics/node on {name}",
            "node": node_id,
            "nodeName": name,
        }
        for plugin, plugin_notes in sorted(notes.items())
        if plugin_notes
    ]


def node_health(node: NodeSurface, node_id: str, state: Any) -> dict[str, Any]:
    reasons = []
    beat = node.readings.get(NodeHeartbeat, node_id)
    if node_id != node.node_id and (beat is None or beat.age_s > HEARTBEAT_WARN_S):
        age = "never" if beat is None else f"{beat.age_s:.0f}s ago"
        reasons.append(
            {
                "level": "warn",
                "message": f"last heartbeat {age}",
                "remediation": "check the node is running and reachable; it is pruned after the timeout",
            }
        )
    disk = node.readings.get(NodeDisk, node_id)
    if disk is not None and disk.reading.free_bytes < LOW_DISK_BYTES:
        level = "error" if disk.reading.free_bytes < 256 * 1024**2 else "warn"
        reasons.append(
            {
                "level": level,
                "message": f"models disk has {disk.reading.free_bytes / 1024**3:.1f} GiB free",
                "remediation": f"free space in {disk.reading.models_dir} or set SKULK_MODELS_DIR",
            }
        )
    for model_id, status in state.downloads.get(node_id, {}).items():
        if type(status).__name__ == "DownloadFailedStatus":
            reasons.append(
                {
                    "level": "error",
                    "message": f"download of {model_id} failed: {status.error_message}",
                    "remediation": "fix the cause (disk, network) and place the model again",
                }
            )
    if node_id == node.node_id:
        log_status = master_log_status(node)
        if log_status is not None and log_status.mode != "persisting":
            reasons.append(
                {
                    "level": "warn",
                    "message": f"event log is counting-only: {log_status.reason}",
                    "remediation": "free disk space under SKULK_HOME and restart the node",
                }
            )
    reasons += plugin_reasons(node, node_id)
    level = "error" if any(r["level"] == "error" for r in reasons) else "warn" if reasons else "ok"
    return {"level": level, "reasons": reasons}


def state_view(node: NodeSurface) -> dict[str, Any]:
    state = node.state
    body = to_reference(state.wire())
    nodes = set(state.topology.nodes) | node.readings.nodes()
    by_kind = {
        "nodeIdentities": NodeIdentity,
        "nodeMemory": NodeMemory,
        "nodeSystem": NodeSystem,
        "nodeResources": NodeResources,
        "nodeDisk": NodeDisk,
    }
    for key, kind in by_kind.items():
        body[key] = {nid: _inner(r.reading) for nid, r in node.readings.latest(kind).items()}
    body["nodeNetwork"] = {
        nid: {"dataTransport": body["nodeResources"].get(nid, {}).get("dataTransport")} for nid in nodes
    }
    body["downloadProgress"] = {nid: _inner(r.reading) for nid, r in node.readings.latest(DownloadProgress).items()}
    body["nodeHealth"] = {nid: node_health(node, nid, state) for nid in sorted(nodes)}
    body["masterNodeId"] = node.master_id
    return body
