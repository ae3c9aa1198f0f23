"""Downloads that survive a kill: an intent file per model, resumed on the next start.

A download lives in `<models_dir>/.downloads/<folder>/` until every file is there and verified;
`intent.json` (the card, whose `[source]` pins the repository, commit and files) is written first,
so a node killed mid-download finds it on restart and continues where the partial files end.
Only when each file's SHA-256 matches the hub's LFS hash is the folder moved into the models
directory and its sidecar written: a half-downloaded model is never mistaken for a whole one.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard

from . import hub
from .progress import ProgressReporter

log = logging.getLogger("skulk.store.downloads")
INTENT = "intent.json"


class DownloadCancelled(RuntimeError):
    """An operator cancelled the download; the partial files stay, so a later request resumes."""


def verify_files(folder: Path, files: tuple[hub.HubFile, ...]) -> list[str]:
    """Names whose size or SHA-256 does not match what the source pinned (empty: all good)."""
    from .store import sha256_file

    bad = []
    for f in files:
        path = folder / f.name
        if not path.is_file() or (f.size and path.stat().st_size != f.size):
            bad.append(f.name)
        elif f.sha256 and sha256_file(path) != f.sha256:
            bad.append(f.name)
    return bad


class Downloads:
    """Hub downloads of this node, one at a time per model."""

    def __init__(self, root: Path, reporter_factory: Callable[[str, dict[str, int]], ProgressReporter]) -> None:
        self.root = root
        self._reporter = reporter_factory
        self._locks: dict[str, threading.Lock] = {}
        self._cancel: dict[str, threading.Event] = {}
        self.active: dict[str, dict[str, Any]] = {}
        #: (bytes, what) -> raises `disk.InsufficientDisk` when they do not fit (set by the store)
        self.ensure_room: Callable[[int, str], None] = lambda _need, _what: None

    def folder(self, folder_name: str) -> Path:
        return self.root / folder_name

    def pending(self) -> list[ModelCard]:
        """Cards of downloads a previous run left unfinished."""
        found = []
        for intent in sorted(self.root.glob(f"*/{INTENT}")) if self.root.is_dir() else ():
            try:
                data = json.loads(intent.read_text())
                if data.get("cancelled"):  # an operator stopped it: resumed only when asked again
                    continue
                found.append(ModelCard.model_validate(data["card"]))
            except (ValueError, KeyError) as exc:
                log.warning("ignoring %s: %s", intent, exc)
        return found

    def cancel(self, model_id: str) -> bool:
        event = self._cancel.get(model_id)
        if event is None or model_id not in self.active:
            return False
        event.set()
        return True

    def forget(self, folder_name: str) -> None:
        shutil.rmtree(self.folder(folder_name), ignore_errors=True)

    def fetch(self, card: ModelCard, folder_name: str, extra: Callable[..., None] | None = None) -> Path:
        """Download the card's files into the staging folder; returns it, complete and verified."""
        model = hub.model_from_source(card.sections["source"])
        with self._locks.setdefault(card.model_id, threading.Lock()):
            cancel = self._cancel.setdefault(card.model_id, threading.Event())
            cancel.clear()
            folder = self.folder(folder_name)
            # before the first byte (the intent file included): what is left to fetch must fit
            need = sum(max(0, f.size - hub.bytes_on_disk(folder, f)) for f in model.files)
            self.ensure_room(need, f"downloading {card.model_id}")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / INTENT).write_text(json.dumps({"card": card.wire()}))
            reporter = self._reporter(card.model_id, {f.name: f.size for f in model.files})
            self.active[card.model_id] = {"model_id": card.model_id, "total_bytes": model.total_bytes}
            stop = threading.Event()

            def watch() -> None:
                while not stop.wait(0.5):
                    per_file = {f.name: hub.bytes_on_disk(folder, f) for f in model.files}
                    self.active[card.model_id]["downloaded_bytes"] = sum(per_file.values())
                    reporter.update(per_file, extra)

            watcher = threading.Thread(target=watch, name=f"download-progress-{folder_name}", daemon=True)
            watcher.start()
            try:
                for attempt in (1, 2):
                    for f in model.files:
                        if cancel.is_set():
                            raise DownloadCancelled(f"download of {card.model_id} cancelled")
                        try:
                            hub.download_file(model, f.name, folder, cancel.is_set)
                        except hub.Interrupted:
                            raise DownloadCancelled(f"download of {card.model_id} cancelled") from None
                    bad = verify_files(folder, model.files)
                    if not bad:
                        break
                    log.warning("%s: %s failed verification (attempt %d); fetching again", card.model_id, bad, attempt)
                    for name in bad:
                        (folder / name).unlink(missing_ok=True)
                else:
                    raise RuntimeError(f"{card.model_id}: {bad} do not match the SHA-256 the hub published")
            except DownloadCancelled:
                (folder / INTENT).write_text(json.dumps({"card": card.wire(), "cancelled": True}))
                raise
            finally:
                stop.set()
                watcher.join()
                self.active.pop(card.model_id, None)
            reporter.update({f.name: f.size for f in model.files}, extra, done=True)
            shutil.rmtree(folder / hub.PARTIAL, ignore_errors=True)
            (folder / INTENT).unlink(missing_ok=True)
            return folder
