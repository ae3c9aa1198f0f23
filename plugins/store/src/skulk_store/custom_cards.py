"""Custom cards as TOML files in the node's data directory, so they outlive the cluster.

Custom cards are State (the master sequences `AddCustomModelCard`), and State lives only as long
as some node of the cluster does. Every node therefore mirrors the custom cards it applies into
`<home>/cards/<owner--name>.toml` (written atomically, removed on `CustomModelCardDeleted`), and on
start re-submits the cards it has on disk that the cluster lacks. After a restart of every node,
the first master to hear them brings them back; a card is the same whichever node re-adds it.

A card deleted while a node was down comes back when that node returns with its file: deleting is
a cluster-wide decision only the nodes that saw it can mirror.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard

from .cards import CardError, card_from_mapping, card_from_toml

log = logging.getLogger("skulk.store.cards")


def card_to_toml(card: ModelCard) -> str:
    """The card in the same TOML shape `cards.py` reads (top-level fields, sections as tables)."""
    import tomlkit

    data: dict[str, Any] = {}
    for name, value in card.model_dump(mode="json").items():
        if name == "sections" or value is None:
            continue
        data[name] = list(value) if isinstance(value, tuple) else value
    doc = tomlkit.document()
    for name, value in data.items():
        doc[name] = value
    for name, section in card.sections.items():
        doc[name] = section
    return tomlkit.dumps(doc)


class CustomCardFiles:
    """The `cards/` folder of one node."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, model_id: str) -> Path:
        return self.folder / (model_id.replace("/", "--") + ".toml")

    def write(self, card: ModelCard) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(card.model_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(card_to_toml(card))
        os.replace(tmp, path)

    def delete(self, model_id: str) -> None:
        self.path(model_id).unlink(missing_ok=True)

    def load(self) -> dict[str, ModelCard]:
        cards: dict[str, ModelCard] = {}
        for path in sorted(self.folder.glob("*.toml")) if self.folder.is_dir() else ():
            try:
                card = card_from_toml(path)
            except CardError as exc:
                log.warning("ignoring custom card %s", exc)
                continue
            cards[card.model_id] = card
        return cards

    def mirror(self, cards: dict[str, ModelCard]) -> None:
        """Write the cards of a synced snapshot. Files are removed only by a deletion event: a
        snapshot from a cluster that restarted lacks cards only because nobody re-added them yet."""
        on_disk = self.load()
        for model_id, card in cards.items():
            if on_disk.get(model_id) != card:
                self.write(card)


__all__ = ["CustomCardFiles", "card_from_mapping", "card_to_toml"]
