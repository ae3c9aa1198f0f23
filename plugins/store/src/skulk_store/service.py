"""The store's per-node service: wires the local store to the node (catalog, telemetry, cards).

It gives the store the node's merged catalog (so a worker staging a custom card from the hub finds
its `[source]`), publishes download progress as `DownloadProgress` readings on the telemetry plane,
keeps the custom-card files in step with State, resumes downloads a kill interrupted, and starts
hub downloads for `/models/add` in the background.
"""

from __future__ import annotations

import asyncio
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
    PluginDataSet,
    State,
    Topic,
    catalog,
    codec,
    new_id,
)

from .custom_cards import CustomCardFiles
from .downloads import DownloadCancelled
from .plugin import STORE_PEER
from .store import LocalModelStore

log = logging.getLogger("skulk.store.service")
RESTORE_WAIT_S = 30.0  # a node restarted alone may wait for its election before the master exists
REPUBLISH_S = 3.0
DISK_PROBE_ROUNDS = 5  # the inventory loop's rounds (1 s each) between two free-space probes


class StoreService:
    def __init__(self, node: NodeSurface, store: LocalModelStore) -> None:
        self.node = node
        self.store = store
        self.cards = CustomCardFiles(node.options.home / "cards")
        self.background: dict[str, asyncio.Future[Any]] = {}
        self.errors: dict[str, str] = {}
        self.cancelled: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._published_at: dict[str, float] = {}
        self.mark = ""  # a store host's mark (staging.host_mark)

    # ------------------------------------------------------------------ wiring

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.card_lookup = lambda model_id: catalog(self.node).get(model_id)
        self.store.emit_progress = self._emit_progress
        from .peer import PeerFetcher, PeerServer

        self.peer_server = PeerServer(self.node, self.store)
        self.peer_server.start(self.node.options.api_host)
        self.node.services.publish(STORE_PEER, self.peer_server)
        self.fetcher = PeerFetcher(self.node, self._loop)
        store = self.store
        store.fetchers.append(lambda card, staging, progress: self.fetcher(card, staging, progress, store))
        store.in_use = self.in_use
        if store.role == "host":
            from .staging import host_mark

            self.mark = host_mark(store.models_dir)
            log.info("store host: canonical copies in %s", store.models_dir)
        else:
            from .staging import HostStager

            store.stagers.append(HostStager(self.node, store, self.fetcher, self._loop))
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

    def probe_disk(self) -> str | None:
        """Set (or clear) the `low_disk` health note from the models directory's free space."""
        from .disk import low_disk
        from .plugin import PLUGIN

        note = low_disk(self.store.models_dir, self.store.low_disk_bytes)
        notes = self.node.health_notes.get(PLUGIN, {})
        if note is not None:
            if "low_disk" not in notes:  # logged when it starts, not every probe
                log.warning("low disk: %s", note)
            self.node.health_notes[PLUGIN] = {**notes, "low_disk": note}
        elif "low_disk" in notes:
            log.info("disk space of %s recovered", self.store.models_dir)
            rest = {k: v for k, v in notes.items() if k != "low_disk"}
            if rest:
                self.node.health_notes[PLUGIN] = rest
            else:
                self.node.health_notes.pop(PLUGIN, None)
        return note

    async def _inventory_loop(self) -> None:
        rounds = 0
        while not self.node.stopping:
            await asyncio.to_thread(self.publish_inventory)
            if rounds % DISK_PROBE_ROUNDS == 0:  # one statvfs every few seconds
                await asyncio.to_thread(self.probe_disk)
            rounds += 1
            try:
                await self._publish_registry()
            except Exception as exc:  # a master change mid-emit: the next round repairs it
                log.info("store registry not published this round: %s", exc)
            await asyncio.sleep(1.0)

    def in_use(self) -> set[str]:
        """Models an instance on this node uses (never evicted or purged)."""
        me = self.node.node_id
        return {
            inst.shard_assignments.model_id
            for inst in self.node.state.instances.values()
            if me in inst.shard_assignments.node_to_runner
        }

    def registry_entry(self) -> tuple[str, dict[str, Any] | None]:
        """This node's record in State: its canonical registry (a host) or its staged copies."""
        from .peer import INVENTORY_LIMIT
        from .staging import HOST_PREFIX, STAGED_PREFIX, HostEntry

        if self.store.role == "host":
            held = sorted(self.store.installed().items())[:INVENTORY_LIMIT]
            entry = HostEntry(
                node_id=self.node.node_id,
                models_dir=str(self.store.models_dir),
                mark=self.mark,
                models={mid: card.storage_size for mid, (card, _path) in held},
            )
            return HOST_PREFIX + self.node.node_id, entry.model_dump()
        staged = sorted(self.store.staged_copies().items())[:INVENTORY_LIMIT]
        value = {mid: c.model_dump(include={"source", "how", "bytes", "staged_at"}) for mid, c in staged}
        return STAGED_PREFIX + self.node.node_id, value or None

    async def _publish_registry(self) -> None:
        """Keep this node's record in State equal to what is on disk (re-sent after a lost event)."""
        from .staging import PLUGIN_DATA

        if self.node.master_id is None:
            return
        key, value = await asyncio.to_thread(self.registry_entry)
        if self.node.state.plugin_data.get(PLUGIN_DATA, {}).get(key) == value:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._published_at.get(key, -REPUBLISH_S) < REPUBLISH_S:
            return
        self._published_at[key] = loop.time()
        await self.node.emit(PluginDataSet(plugin=PLUGIN_DATA, key=key, value=value))

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
        self.cancelled.discard(model_id)

        def run() -> Any:
            if card is not None and self.store.card_lookup(model_id) is None:
                self.store.card_lookup = _with_card(self.store.card_lookup, card)
            return self.store.ensure_local(model_id)

        async def guarded() -> None:
            try:
                path = await asyncio.to_thread(run)
                if path is None:
                    self.errors[model_id] = "the card has no [source] this store can fetch"
            except DownloadCancelled as exc:
                log.info("%s", exc)
                self.cancelled.add(model_id)
                self.errors[model_id] = f"{exc}; the partial files are kept: POST the download again to resume"
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
        present: dict[str, ModelCard] = dict(self.node.state.custom_model_cards.items())
        missing = [c for mid, c in saved.items() if present.get(mid) != c]
        outcomes = [
            await self.node.submit(AddCustomModelCard(command_id=CommandId(new_id()), card=card), RESTORE_WAIT_S)
            for card in missing
        ]
        if all(o.ok for o in outcomes):
            if missing:
                log.info("restored %d custom card(s) from %s", len(missing), self.cards.folder)
            return
        failed = [o.reason for o in outcomes if not o.ok]
        log.warning("could not restore custom cards %s: %s", sorted(saved), failed[0])

    def on_event(self, event: IndexedEvent) -> None:
        inner = event.event
        if isinstance(inner, CustomModelCardAdded):
            self.cards.write(inner.card)
        elif isinstance(inner, CustomModelCardDeleted):
            self.cards.delete(inner.model_id)

    def on_synced(self, after: State) -> None:
        self.cards.mirror(dict(after.custom_model_cards.items()))


def _with_card(lookup: Any, card: ModelCard) -> Any:
    """A lookup that knows one more card (a resumed download whose card the cluster lost)."""

    def find(model_id: str) -> ModelCard | None:
        return lookup(model_id) or (card if model_id == card.model_id else None)

    return find
