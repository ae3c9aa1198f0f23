"""The glue between State, live telemetry and the registered model stores and Planner.

The master places with it and the API dry-runs with it, so a caller of POST /place_instance gets
exactly the refusal the master would have produced; every node resolves a model reference through
the same catalog.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .commands import PlaceInstance
from .contracts import NodeCapacity
from .instances import Instance
from .models import ModelCard
from .state import State
from .telemetry import NodeMemory, NodeResources

if TYPE_CHECKING:
    from .contracts import NodeSurface


def catalog(node: NodeSurface) -> dict[str, ModelCard]:
    """Every card this node knows: model stores first, custom cards (in State) override."""
    cards: dict[str, ModelCard] = {}
    for store in node.model_stores.values():
        with contextlib.suppress(Exception):
            cards.update(store.catalog())
    cards |= dict(node.state.custom_model_cards.items())
    return cards


def resolve_card(node: NodeSurface, ref: str) -> ModelCard | None:
    cards = catalog(node)
    found = node.hooks.call("resolve_model", firstresult=True, ref=ref, catalog=cards)
    return found[0] if found else None


STALE_AFTER_S = 2.5 * 2.0  # readings go stale after two heartbeat intervals (plus jitter)


def capacities(node: NodeSurface) -> dict[str, NodeCapacity]:
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
            node_id=node_id,
            ram_available=mem.ram_available.in_bytes,
            ram_total=mem.ram_total.in_bytes,
            backends=tuple(res.reading.backends),
            splits=res.reading.splits,
            addresses=res.reading.addresses,
            models_present=frozenset(res.reading.models_present),
            vram_available=res.reading.vram_available,
        )
    return caps


def plan_placement(node: NodeSurface, command: PlaceInstance, state: State | None = None) -> Instance:
    """An Instance for `command`, or a PlacementError that says why not (the master's own rule)."""
    from .decide import DecisionView, place

    view = DecisionView(
        master_id=node.node_id,
        now=datetime.now(UTC),
        capacities=capacities(node),
        resolve=lambda ref: resolve_card(node, ref),
        planner=next(iter(node.planners.values()), None),
    )
    return place(state or node.state, command, view)
