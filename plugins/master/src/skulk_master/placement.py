"""Placement from a node's own view: live capacities from telemetry, and a dry run of the master's rule.

The master decides with `capacities()`; the API (`GET /instance/placement`, previews) and the steward
dry-run with `plan_placement()`, which runs the same pure `skulk_kernel.api.place` over the same
inputs, so a preview refuses exactly as the master would. Part of the master plugin rather than
the kernel: placement is the master's capability, the kernel only owns the pure rule.
"""

from __future__ import annotations

from datetime import UTC, datetime

from skulk_kernel.api import (
    DecisionView,
    Instance,
    NodeCapacity,
    NodeMemory,
    NodeResources,
    NodeSurface,
    NodeSystem,
    PlaceInstance,
    State,
    place,
    resolve_card,
)

STALE_AFTER_S = 2.5 * 2.0  # readings go stale after two heartbeat intervals (plus jitter)


def capacities(node: NodeSurface) -> dict[str, NodeCapacity]:
    """Fresh telemetry of every node that has reported both memory and backends.

    A node whose readings went stale, or whose transport session is gone (dead, frozen or cut off),
    is not a candidate even before the master prunes it: placing on it would only produce an
    instance that never becomes ready.
    """
    caps = {}
    resources = node.readings.latest(NodeResources)
    systems = node.readings.latest(NodeSystem)
    reachable = node.reachable_nodes()
    for node_id, received in node.readings.latest(NodeMemory).items():
        res = resources.get(node_id)
        if res is None or received.age_s > STALE_AFTER_S or node_id not in reachable:
            continue
        mem = received.reading
        caps[node_id] = NodeCapacity(
            node_id=node_id,
            ram_available=mem.ram_available.in_bytes,
            ram_total=mem.ram_total.in_bytes,
            backends=tuple(res.reading.backends),
            splits=res.reading.splits,
            addresses=res.reading.addresses,
            models_present=frozenset(res.reading.models_present),
            vram_available=res.reading.vram_available,
            os=system.reading.os if (system := systems.get(node_id)) is not None else "",
            builds=res.reading.engine_builds,
        )
    return caps


def plan_placement(node: NodeSurface, command: PlaceInstance, state: State | None = None) -> Instance:
    """An Instance for `command`, or a PlacementError that says why not (the master's own rule)."""
    view = DecisionView(
        master_id=node.node_id,
        now=datetime.now(UTC),
        capacities=capacities(node),
        resolve=lambda ref: resolve_card(node, ref),
        planner=next(iter(node.planners.values()), None),
    )
    return place(state or node.state, command, view)
