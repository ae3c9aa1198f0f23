"""The store's per-node service: wires the local store to the node (catalog, telemetry, cards).

It gives the store the node's merged catalog (so a worker staging a custom card from the hub finds
its `[source]`), publishes download progress as `DownloadProgress` readings on the telemetry plane,
keeps the custom-card files in step with State, resumes downloads a kill interrupted, and starts
hub downloads for `/models/add` in the background.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from skulk_kernel.api import (
    AddCustomModelCard,
    CommandId,
    CustomModelCardAdded,
    CustomModelCardDeleted,
    DownloadProgress,
    IndexedEvent,
    ModelCard,
    NodeSurface,
    State,
    Topic,
    catalog,
    codec,
    new_id,
)

from .custom_cards import CustomCardFiles
from .store import LocalModelStore

log = logging.getLogger("skulk.store.service")
RESTORE_ATTEMPTS = 20


class StoreService:
    def __init__(self, node: NodeSurface, store: LocalModelStore) -> None:
        self.node = node
        self.store = store
        self.cards = CustomCardFiles(node.options.home / "cards")
        self.background: dict[str, asyncio.Future[Any]] = {}
        self.errors: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ wiring

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.card_lookup = lambda model_id: catalog(self.node).get(model_id)
        self.store.emit_progress = self._emit_progress
        from .peer import PeerFetcher, PeerServer

        self.peer_server = PeerServer(self.node, self.store)
        self.peer_server.start(self.node.options.api_host)
        self.node.extensions["store-peer"] = self.peer_server
        self.fetcher = PeerFetcher(self.node, self._loop)
        store = self.store
        store.fetchers.append(lambda card, staging, progress: self.fetcher(card, staging, progress, store))
        self.publish_inventory()
        self.node.spawn(self._inventory_loop(), "store-inventory")
        self.node.spawn(self._restore_cards(), "store-restore-cards")
        for card in self.store.downloads.pending():
            log.info("resuming the interrupted download of %s", card.model_id)
            self.download_in_background(card.model_id, card)

    def stop(self) -> None:
        self.peer_server.stop()

    def publish_inventory(self) -> None:
        """The models held here go out with the next `NodeResources` reading (`models_present`)."""
        from .peer import inventory

        self.node.facts["models_present"] = inventory(self.store)

    async def _inventory_loop(self) -> None:
        while not self.node.stopping:
            await asyncio.to_thread(self.publish_inventory)
            await asyncio.sleep(1.0)

    def _emit_progress(self, model_id: str, done: int, total: int, phase: str) -> None:
        """Called from download threads: hand the reading to the loop, which stores and publishes it."""
        reading = DownloadProgress(
            node_id=self.node.node_id, model_id=model_id, downloaded_bytes=done, total_bytes=total, phase=phase
        )
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def publish() -> None:
            self.node.readings.put(self.node.node_id, reading)
            self.node.spawn(self.node.publish(Topic.READINGS, codec.encode(reading)), "store-progress")

        loop.call_soon_threadsafe(publish)

    # ------------------------------------------------------------------ downloads

    def download_in_background(self, model_id: str, card: ModelCard | None = None) -> bool:
        """Fetch a model's files now (hub or peers); False when one is already running."""
        running = self.background.get(model_id)
        if running is not None and not running.done():
            return False
        self.errors.pop(model_id, None)

        def run() -> Any:
            if card is not None and self.store.card_lookup(model_id) is None:
                self.store.card_lookup = _with_card(self.store.card_lookup, card)
            return self.store.ensure_local(model_id)

        async def guarded() -> None:
            try:
                path = await asyncio.to_thread(run)
                if path is None:
                    self.errors[model_id] = "the card has no [source] this store can fetch"
            except Exception as exc:
                log.error("download of %s failed: %s", model_id, exc)
                self.errors[model_id] = str(exc)

        self.background[model_id] = self.node.spawn(guarded(), f"store-download-{model_id}")
        return True

    # ------------------------------------------------------------------ custom cards

    async def _restore_cards(self) -> None:
        """Re-add the cards on disk that the cluster lacks (a restart of every node lost them)."""
        saved = self.cards.load()
        if not saved:
            return
        for _attempt in range(RESTORE_ATTEMPTS):
            if self.node.stopping:
                return
            if self.node.master_id is None:
                await asyncio.sleep(0.5)
                continue
            present: dict[str, ModelCard] = dict(self.node.state.custom_model_cards.items())
            missing = [c for mid, c in saved.items() if present.get(mid) != c]
            if not missing:
                return
            for card in missing:
                await self.node.submit(AddCustomModelCard(command_id=CommandId(new_id()), card=card))
            try:
                await self.node.wait_for(functools.partial(_holds, cards=missing), 3)
                log.info("restored %d custom card(s) from %s", len(missing), self.cards.folder)
                return
            except TimeoutError:
                continue
        log.warning("could not restore custom cards %s: no master confirmed them", sorted(saved))

    def on_event(self, event: IndexedEvent) -> None:
        inner = event.event
        if isinstance(inner, CustomModelCardAdded):
            self.cards.write(inner.card)
        elif isinstance(inner, CustomModelCardDeleted):
            self.cards.delete(inner.model_id)

    def on_synced(self, after: State) -> None:
        self.cards.mirror(dict(after.custom_model_cards.items()))


def _holds(state: State, cards: list[ModelCard]) -> bool:
    present: dict[str, ModelCard] = dict(state.custom_model_cards.items())
    return all(present.get(c.model_id) == c for c in cards)


def _with_card(lookup: Any, card: ModelCard) -> Any:
    """A lookup that knows one more card (a resumed download whose card the cluster lost)."""

    def find(model_id: str) -> ModelCard | None:
        return lookup(model_id) or (card if model_id == card.model_id else None)

    return find
