"""The model catalog: every node resolves a model reference through the same cards.

(Placement from live telemetry, `capacities` and `plan_placement`, is the master plugin's:
`skulk_master.placement`.)
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .models import ModelCard

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
