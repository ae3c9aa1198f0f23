"""The store host role and staging: canonical copies on one node, staged copies on the workers.

A **store host** (`[plugins.store] role = "host"`, the `store-host` profile) keeps the canonical
copy of every model it holds and publishes that registry into State as
`PluginDataSet(plugin="store", key="host/<node id>")`: its models directory, a random mark, and the
models with their sizes. The mark is also written into `<models_dir>/.skulk-store-host`, so a
worker that reads the same mark at that path shares the host's filesystem (no guessing from host
names or machine ids).

A **worker** that must run a model it lacks stages it from a store host before it tries peers or
the hub:

* same filesystem: every file is hard-linked into the worker's models directory (the same inode,
  no byte copied); where `os.link` fails (another device, a filesystem without links) the file
  is copied locally and its SHA-256 checked against the host's manifest;
* another machine: the peer copy (`peer.py`) from the store host only;
* the host lacks the model: the worker asks the host to fetch it (`POST
  /store/models/{id}/download` on the host), follows the host's progress, then stages it, so the
  model crosses the internet once, onto the host.

A staged copy's sidecar says so (`"staged": {...}`); its recency is the modification time of
`.skulk/last-used`, touched every time the worker stages the model for an instance. With a
staging budget (`staging_budget_bytes`), staging evicts the least recently used staged copies that
no instance on this node uses until the new one fits; a model in use is never evicted (the node
goes over budget and says so instead). Staged copies are published as `key="staged/<node id>"`,
so `/store/registry` on any node shows who staged what from where.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict
from skulk_kernel.api import ModelCard, NodeSurface, State

if TYPE_CHECKING:
    import asyncio

    from .peer import PeerFetcher
    from .store import LocalModelStore, Progress

log = logging.getLogger("skulk.store.staging")
PLUGIN_DATA = "store"
HOST_PREFIX = "host/"
STAGED_PREFIX = "staged/"
HOST_MARK = ".skulk-store-host"
REGISTRY_LIMIT = 512
#: how long a worker follows a host's download without any progress before it gives up on the host
HOST_STALL_S = 300.0
#: how long a worker waits for a store host that is still a member but out of reach (a session lost
#: for a moment on a loaded machine comes back within a second or two) before it goes to the hub
HOST_RETURN_S = 10.0


class HostEntry(BaseModel):
    """One store host's canonical registry, as replicated in State."""

    model_config = ConfigDict(extra="ignore")
    node_id: str
    models_dir: str
    mark: str
    models: dict[str, int]  # model id -> bytes


class StagedCopy(BaseModel):
    """A worker's staged copy of a model a store host holds (in the copy's sidecar)."""

    model_config = ConfigDict(extra="ignore")
    model_id: str = ""
    source: str  # the store host's node id
    how: Literal["hardlink", "copy", "peer"]
    bytes: int = 0
    staged_at: float = 0.0
    last_used: float = 0.0


# ====================================================================== registry


def host_mark(models_dir: Path) -> str:
    """This host's mark (created once): what a worker must read at the advertised path."""
    path = models_dir / HOST_MARK
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        models_dir.mkdir(parents=True, exist_ok=True)
        mark = secrets.token_hex(16)
        path.write_text(mark + "\n")
        return mark


def store_hosts(state: State) -> dict[str, HostEntry]:
    """Every store host's registry in State (reachable or not), by node id."""
    found = {}
    for key, value in state.plugin_data.get(PLUGIN_DATA, {}).items():
        if key.startswith(HOST_PREFIX) and isinstance(value, dict):
            try:
                entry = HostEntry.model_validate(value)
            except ValueError:
                continue
            found[entry.node_id] = entry
    return found


def staged_everywhere(state: State) -> dict[str, dict[str, Any]]:
    """node id -> {model id -> staged copy} as the workers published them."""
    return {
        key.removeprefix(STAGED_PREFIX): dict(value)
        for key, value in state.plugin_data.get(PLUGIN_DATA, {}).items()
        if key.startswith(STAGED_PREFIX) and isinstance(value, dict)
    }


def shares_filesystem(entry: HostEntry) -> bool:
    """True when this process sees the host's models directory with the host's own mark in it."""
    try:
        return (Path(entry.models_dir) / HOST_MARK).read_text().strip() == entry.mark
    except OSError:
        return False


# ====================================================================== eviction


def choose_evictions(staged: Iterable[StagedCopy], protect: set[str], budget: int, incoming: int) -> list[str]:
    """The staged copies to delete so that `incoming` more bytes fit in `budget`: least recently
    used first, never one in `protect` (models an instance on this node uses, the one arriving).

    Returns as many as it takes, or every unprotected copy when even that is not enough (the
    caller then goes over budget and says so).
    """
    copies = list(staged)
    used = sum(c.bytes for c in copies)
    evict = []
    for copy in sorted(copies, key=lambda c: (c.last_used, c.model_id)):
        if used + incoming <= budget:
            break
        if copy.model_id in protect:
            continue
        evict.append(copy.model_id)
        used -= copy.bytes
    return evict


# ====================================================================== files


def link_or_copy(
    source: Path, target: Path, files: Iterable[str], room: Callable[[int], None] | None = None
) -> dict[str, str]:
    """Hard-link each file of `source` into `target`; copy it where linking fails.

    Returns file -> "hardlink" or "copy". A copy is a new inode, so the caller verifies it. At the
    first copy, `room(bytes)` is called with the size of that file and every one after it (what
    copying the rest could take) and may refuse (`disk.InsufficientDisk`) before a byte is copied.
    """
    how: dict[str, str] = {}
    names = list(files)
    for i, name in enumerate(names):
        src, dst = source / name, target / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
            how[name] = "hardlink"
        except FileNotFoundError:
            raise
        except OSError as exc:  # EXDEV (another device), EPERM, EMLINK: a local copy instead
            log.info("cannot hard-link %s (%s); copying it", src, exc.strerror or exc)
            if room is not None and "copy" not in how.values():
                room(sum((source / n).stat().st_size for n in names[i:] if (source / n).is_file()))
            shutil.copyfile(src, dst)
            how[name] = "copy"
    return how


# ====================================================================== the worker's stager


class HostStager:
    """Called by the store (in a worker thread) before peers and the hub, on non-host nodes."""

    def __init__(
        self, node: NodeSurface, store: LocalModelStore, fetcher: PeerFetcher, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.node = node
        self.store = store
        self.fetcher = fetcher
        self.loop = loop

    def hosts(self) -> list[HostEntry]:
        """The store hosts this node can reach now, waiting (bounded) for one that is a member of the
        cluster but momentarily out of reach: falling through to the hub then would fetch from the
        internet what the host exists to hold. A host the cluster has dropped is not waited for."""
        known = {nid: h for nid, h in store_hosts(self.node.state).items() if nid != self.node.node_id}
        deadline = time.monotonic() + HOST_RETURN_S
        while True:
            reachable = self.node.reachable_nodes()
            found = [h for nid, h in sorted(known.items()) if nid in reachable]
            members = set(self.node.state.topology.nodes)
            if found or not (set(known) & members) or self.node.stopping or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if known and not found:
            log.warning(
                "no store host is reachable (%s): fetching from the peers or the hub instead",
                ", ".join(nid[:8] for nid in sorted(known)),
            )
        return found

    def __call__(self, card: ModelCard, progress: Progress) -> Path | None:
        hosts = self.hosts()
        if not hosts:
            return None
        holding = [h for h in hosts if card.model_id in h.models]
        if not holding:
            host = next((h for h in hosts if shares_filesystem(h)), hosts[0])
            if not self._ask_host_to_fetch(host, card.model_id, progress):
                return None
            holding = [host]
            if not shares_filesystem(host):
                self._wait_listed(host, card.model_id)
        for host in holding:
            if shares_filesystem(host):
                path = self._stage_locally(card, host)
                if path is not None:
                    return path
        path = self._stage_by_peer_copy(card, holding, progress)
        if path is None:
            log.warning("could not stage %s from a store host: fetching from the peers or the hub", card.model_id)
        return path

    def _wait_listed(self, host: HostEntry, model_id: str, timeout: float = 15.0) -> None:
        """The host has the model; a peer copy finds holders by their telemetry, which lists the new
        model a heartbeat or two later: wait for it (bounded) rather than fall through to the hub."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.node.stopping:
            if any(node_id == host.node_id for node_id, _ in self.fetcher.holders(model_id)):
                return
            time.sleep(0.2)
        log.info("store host %s fetched %s but its telemetry does not list it yet", host.node_id[:8], model_id)

    # ------------------------------------------------------------------ same filesystem

    def _stage_locally(self, card: ModelCard, host: HostEntry) -> Path | None:
        from .store import SIDECAR, folder_name, sha256_file

        source = Path(host.models_dir) / folder_name(card.model_id)
        try:
            installed = json.loads((source / SIDECAR).read_text())
            host_card = ModelCard.model_validate(installed["card"])
            manifest: dict[str, str] = dict(installed["manifest"])
        except (OSError, ValueError, KeyError) as exc:
            log.info("store host %s: no readable copy of %s (%s)", host.node_id[:8], card.model_id, exc)
            return None
        size = sum((source / name).stat().st_size for name in manifest if (source / name).is_file())
        self.store.evict_for(size, protect={card.model_id})
        self.store.models_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.store.models_dir / f".staging-{uuid.uuid4().hex[:12]}"
        began = time.monotonic()
        from .disk import InsufficientDisk

        def room(need: int) -> None:
            self.store.ensure_room(need, f"copying {card.model_id} from the store host")

        try:
            how = link_or_copy(source, tmp, manifest, room)
            bad = [n for n, h in how.items() if h == "copy" and sha256_file(tmp / n) != manifest[n]]
            if bad:
                raise OSError(f"the local copies of {bad} do not match the host's manifest")
        except InsufficientDisk:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("staging %s from store host %s failed: %s", card.model_id, host.node_id[:8], exc)
            return None
        kind: Literal["hardlink", "copy"] = "hardlink" if all(h == "hardlink" for h in how.values()) else "copy"
        staged = StagedCopy(model_id=card.model_id, source=host.node_id, how=kind, bytes=size)
        path = self.store.adopt_staged(host_card, tmp, str(installed.get("main_file", "")), manifest, staged)
        log.info(
            "staged %s from store host %s by %s (%.1f MB, %.2f s)",
            card.model_id,
            host.node_id[:8],
            kind,
            size / 1e6,
            time.monotonic() - began,
        )
        return path

    # ------------------------------------------------------------------ another machine

    def _stage_by_peer_copy(self, card: ModelCard, holding: list[HostEntry], progress: Progress) -> Path | None:
        from .store import folder_name

        size = max((h.models.get(card.model_id, 0) for h in holding), default=card.storage_size)
        self.store.evict_for(size, protect={card.model_id})
        staging = self.store.downloads.folder(folder_name(card.model_id))
        only = {h.node_id for h in holding}
        folder = self.fetcher(card, staging, progress, self.store, only=only)
        if folder is None:
            return None
        sent = self.fetcher.last_sources.get(card.model_id, {})
        source = max(sent, key=lambda n: sent[n]) if sent else holding[0].node_id
        staged = StagedCopy(model_id=card.model_id, source=source, how="peer", bytes=sum(sent.values()) or size)
        return self.store.adopt(card, folder, staged=staged)

    # ------------------------------------------------------------------ the host fetches first

    def _ask_host_to_fetch(self, host: HostEntry, model_id: str, progress: Progress) -> bool:
        """The host downloads the model (peers, then the hub); the worker follows its progress."""
        import httpx

        path = f"/store/models/{model_id}/download"
        deadline = time.monotonic() + HOST_RETURN_S
        urls: list[str] = []
        while not self.node.stopping:
            urls = self.fetcher.api_urls(host.node_id)  # read again each pass: its telemetry may be late
            for url in urls:
                try:
                    answer = httpx.post(
                        url + path, headers=_as_member(self.node, "POST", path), timeout=httpx.Timeout(10, connect=2)
                    )
                except httpx.HTTPError as exc:
                    log.info("store host %s at %s: %s", host.node_id[:8], url, exc or type(exc).__name__)
                    continue
                if answer.status_code != 200:
                    log.info("store host %s will not fetch %s: %s", host.node_id[:8], model_id, answer.text[:200])
                    return False
                log.info("asked store host %s to fetch %s", host.node_id[:8], model_id)
                return self._follow(url, model_id, progress)
            if time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        log.warning("could not ask store host %s to fetch %s (no answer at %s)", host.node_id[:8], model_id, urls)
        return False

    def _follow(self, url: str, model_id: str, progress: Progress) -> bool:
        import httpx

        last, last_change = -1, time.monotonic()
        answered = time.monotonic()
        path = f"/store/models/{model_id}/download"
        while not self.node.stopping:
            try:
                status = httpx.get(url + path, headers=_as_member(self.node, "GET", path), timeout=10).json()
                answered = time.monotonic()
            except (httpx.HTTPError, ValueError) as exc:
                if time.monotonic() - answered > HOST_RETURN_S:  # one missed answer is not a lost host
                    log.info("lost the store host while it fetched %s: %s", model_id, exc)
                    return False
                time.sleep(1.0)
                continue
            if status.get("status") == "installed":
                return True
            if status.get("status") in ("failed", "cancelled", "absent"):
                log.info("the store host did not fetch %s: %s", model_id, status.get("error") or status["status"])
                return False
            moved = status.get("progress") or {}
            done = int(moved.get("downloaded_bytes") or 0)
            if done != last:
                last, last_change = done, time.monotonic()
                progress(done, int(moved.get("total_bytes") or 0), "the store host is fetching it")
            elif time.monotonic() - last_change > HOST_STALL_S:
                log.warning("the store host's fetch of %s made no progress for %.0f s", model_id, HOST_STALL_S)
                return False
            time.sleep(1.0)
        return False


def _as_member(node: NodeSurface, method: str, path: str) -> dict[str, str]:
    """The member token a call to the store host's operator routes carries (never a user's key)."""
    try:
        from skulk_api_control.member_auth import member_headers
    except ImportError:
        return {}
    return member_headers(node, method, path)
