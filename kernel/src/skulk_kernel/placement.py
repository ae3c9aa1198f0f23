"""The glue between State, live telemetry and the registered Planner.

The master places with it and the API dry-runs with it, so a caller of POST /place_instance gets
exactly the refusal the master would have produced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .commands import PlaceInstance
from .contracts import NodeCapacity, PlacementError, PlacementRequest
from .inference import resolve_card
from .state import State
from .telemetry import NodeMemory, NodeResources

if TYPE_CHECKING:
    from .node import Node


STALE_AFTER_S = 2.5 * 2.0  # readings go stale after two heartbeat intervals (plus jitter)


def capacities(node: Node) -> dict[str, NodeCapacity]:
    """Fresh telemetry of every node that has reported both memory and backends.

    A node whose readings went stale, or whose transport session is gone (dead, frozen or cut off),
    is not a candidate even before the master prunes it: placing on it would only produce an
    instance that never becomes ready.
    """
    caps = {}
    resources = node.readings.latest(NodeResources)
    reachable = node.reachable_nodes()
    for node_id, received in node.readings.latest(NodeMemory).items():
        res = resources.get(node_id)
        if res is None or received.age_s > STALE_AFTER_S or node_id not in reachable:
            continue
        mem = received.reading
        caps[node_id] = NodeCapacity(
            node_id=node_id, ram_available=mem.ram_available.in_bytes, ram_total=mem.ram_total.in_bytes,
            backends=tuple(res.reading.backends),
        )
    return caps


def plan_placement(node: Node, command: PlaceInstance, state: State | None = None) -> Any:
    """An Instance for `command`, or a PlacementError that says why not."""
    state = state or node.state
    planner = next(iter(node.planners.values()), None)
    if planner is None:
        raise PlacementError("no_planner", "no placement planner is loaded (the master plugin provides one)")
    card = resolve_card(node, command.model_id)
    if card is None:
        raise PlacementError("unknown_model", f"model {command.model_id!r} is not in the catalog; add it "
                             "with POST /models/add or check GET /models")
    members = set(state.topology.nodes)
    live = {k: v for k, v in capacities(node).items() if not members or k in members}
    request = PlacementRequest(model=card, sharding=command.sharding, instance_meta=command.instance_meta,
                               min_nodes=command.min_nodes, excluded_nodes=command.excluded_nodes)
    return planner.place(request, state, live, command.command_id)
