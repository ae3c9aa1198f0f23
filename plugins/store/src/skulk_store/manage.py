"""Model management for API adapters (Ollama's pull, create, copy, delete and blobs): the store's side.

Why here: the store owns the catalog's custom cards, the models directory and downloads; an adapter
(`skulk_api_ollama.manage_routes`) only speaks its wire format and calls these. Every card change
goes through the master (`AddCustomModelCard` / `DeleteCustomModelCard`) and answers from the
command's outcome, as `/models/add` does.

Names a pull accepts: a catalog name or alias (resolved as every API resolves it), or a hub
repository id, `owner/name`, optionally prefixed `hf.co/` (Ollama's spelling) and suffixed with a
tag: `:latest` (the store's preferred GGUF), a quantization (`:Q4_1` picks the GGUF whose name has
it) or a file name (`:model.Q8_0.gguf`). A hub model becomes a custom card named as the client wrote
it, then its files come from members or the hub like any other download.

A created or copied model is a new card over the same files: when this node holds them (a local
file, a download in the models directory, an uploaded blob), the card's `[source]` is that local
path (no second copy); otherwise it keeps the base's source, so any node can fetch it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skulk_kernel.api import (
    AddCustomModelCard,
    CommandId,
    DeleteCustomModelCard,
    ModelCard,
    ModelId,
    NodeSurface,
    Outcome,
    catalog,
    new_id,
    resolve_card,
)

from .plugin import STORE, STORE_SERVICE

DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")
POLL_S = 0.25
BLOB_CHECK_BYTES = 256 << 20


class ManageError(Exception):
    """A request the store cannot carry out; `status` is the HTTP status, the message says what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Progress:
    """One step of a pull: `completed` of `total` bytes of the file with `digest` (when known)."""

    status: str
    digest: str = ""
    total: int = 0
    completed: int = 0


def outcome_failure(outcome: Outcome) -> ManageError | None:
    if outcome.ok:
        return None
    status = 503 if outcome.retryable or outcome.status != "refused" else 400
    return ManageError(status, outcome.reason or f"the command was {outcome.status}")


class ModelManager:
    """The store's model management, for one node (built per request: it holds no state of its own)."""

    def __init__(self, node: NodeSurface) -> None:
        self.node = node
        store = node.services.get(STORE)
        if store is None:
            raise ManageError(503, "this node has no model store (add the store plugin to its profile)")
        self.store = store
        self.service = node.services.get(STORE_SERVICE)

    # ------------------------------------------------------------------ names and cards

    def card(self, name: str) -> ModelCard | None:
        """The card a client's name means (catalog id, alias or short name), None when unknown."""
        try:
            return resolve_card(self.node, name)
        except Exception:  # an ambiguous short name is as good as unknown here
            return None

    async def add_card(self, card: ModelCard) -> ModelCard:
        outcome = await self.node.submit(AddCustomModelCard(command_id=CommandId(new_id()), card=card), 15)
        if (failure := outcome_failure(outcome)) is not None:
            raise failure
        return card

    def local_source(self, card: ModelCard) -> dict[str, Any] | None:
        """`[source]` naming the file this node holds for `card`, None when it holds none."""
        source = card.sections.get("source", {})
        if source.get("kind") == "local":
            return dict(source)
        path = self.store.local_path(card.model_id)
        return {"kind": "local", "path": str(path)} if path is not None else None

    def derived(self, base: ModelCard, model_id: str, sections: dict[str, dict[str, Any]]) -> ModelCard:
        """A new card over `base`'s files, named `model_id`, with `sections` merged in."""
        merged = {**base.sections, **sections}
        if (local := self.local_source(base)) is not None:
            merged["source"] = local
        return base.model_copy(update={"model_id": ModelId(model_id), "sections": merged})

    def card_for_file(self, path: Path, model_id: str) -> ModelCard:
        """A card for a GGUF file on this node (a blob, or a path under the model directories)."""
        from .cards import CardError, card_from_gguf

        try:
            card = card_from_gguf(path, model_id)
        except CardError as exc:
            raise ManageError(400, str(exc)) from None
        except OSError as exc:
            raise ManageError(400, f"cannot read {path}: {exc}") from None
        return card.model_copy(update={"sections": {**card.sections, "source": {"kind": "local", "path": str(path)}}})

    def local_file(self, path: str, model_id: str) -> ModelCard:
        """`store.add_local`'s card for a path the client named, with its refusals as 400s."""
        from .store import PathOutsideModelDirs

        target = Path(path).expanduser()
        if not target.exists():
            raise ManageError(404, f"{path} does not exist on node {self.node.options.node_name}")
        try:
            card: ModelCard = self.store.add_local(target, model_id)
        except PathOutsideModelDirs as exc:
            raise ManageError(400, str(exc)) from None
        except Exception as exc:
            raise ManageError(400, f"cannot read a model from {path}: {exc}") from None
        return card

    # ------------------------------------------------------------------ pull

    async def pull_card(self, name: str) -> ModelCard:
        """The card to fetch for `name`: the catalog's, or a hub repository's (added as a custom card)."""
        if (card := self.card(name)) is not None:
            return card
        if name.endswith(":latest") and (card := self.card(name.removesuffix(":latest"))) is not None:
            return card
        repo, file = hub_reference(name)
        if repo is None:
            known = ", ".join(sorted(catalog(self.node))[:12]) or "none"
            raise ManageError(
                404,
                f"model {name!r} is neither in the catalog (e.g. {known}) nor a hub repository id (owner/name, "
                "optionally hf.co/owner/name:QUANT)",
            )
        if self.node.options.offline:
            raise ManageError(400, f"this node is offline (--offline): it cannot reach the hub to pull {repo}")
        from . import hub

        try:
            if file is not None and not file.endswith(".gguf"):
                file = await asyncio.to_thread(_file_for_tag, repo, file)
            model = await asyncio.to_thread(hub.resolve, repo, None, file)
            card = await asyncio.to_thread(hub.card_for, model, name)
        except hub.HubError as exc:
            raise ManageError(404 if "no such repository" in str(exc) else 400, str(exc)) from None
        return await self.add_card(card)

    async def fetch(self, card: ModelCard) -> AsyncIterator[Progress]:
        """Progress of this node's copy of `card` until it is complete (raises ManageError on failure)."""
        model_id = card.model_id
        source = card.sections.get("source", {})
        files = source.get("files") or {}
        main = str(source.get("main_file") or "")
        sha = str((files.get(main) or {}).get("sha256") or "") if isinstance(files, dict) else ""
        digest = f"sha256:{sha}" if sha else f"sha256:{hashlib.sha256(model_id.encode()).hexdigest()}"
        if source.get("kind") == "local" or self.store.local_path(model_id) is not None:
            yield Progress(
                "pulling " + digest.removeprefix("sha256:")[:12], digest, card.storage_size, card.storage_size
            )
            return
        if self.service is None:
            raise ManageError(503, "this node's store service is not running")
        from .disk import InsufficientDisk

        try:
            await asyncio.to_thread(self.store.check_room, card)
        except InsufficientDisk as exc:
            raise ManageError(507, str(exc)) from None
        self.service.download_in_background(model_id)
        task = self.service.background.get(model_id)
        label = "pulling " + digest.removeprefix("sha256:")[:12]
        total = card.storage_size
        while task is not None and not task.done():
            active = self.store.downloads.active.get(model_id) or {}
            total = int(active.get("total_bytes") or total)
            yield Progress(label, digest, total, int(active.get("downloaded_bytes") or 0))
            await asyncio.wait({task}, timeout=POLL_S)  # at once when the download ends
        if self.store.local_path(model_id) is None:
            error = self.service.errors.get(model_id) or "the download ended without the model's files"
            raise ManageError(502, f"pulling {model_id} failed: {error}")
        yield Progress(label, digest, total, total)

    # ------------------------------------------------------------------ delete

    async def delete(self, name: str) -> str:
        """Remove a model: its custom card, and this node's copy of its files. The model id removed."""
        card = self.card(name) or (self.card(name.removesuffix(":latest")) if name.endswith(":latest") else None)
        if card is None:
            raise ManageError(404, f"model '{name}' not found")
        model_id = card.model_id
        for instance in list(self.node.state.instances.values()):
            if instance.shard_assignments.model_id == model_id:
                raise ManageError(
                    409,
                    f"instance {instance.instance_id} serves {model_id}; delete it first "
                    f"(DELETE /instance/{instance.instance_id}) or let its keep_alive end",
                )
        custom = model_id in self.node.state.custom_model_cards
        held = model_id in self.store.installed()
        if not custom and not held:
            raise ManageError(404, f"model '{name}' is a catalog entry with no copy on this node: nothing to delete")
        if held and (users := self.sharing(model_id)):
            raise ManageError(
                409,
                f"{', '.join(sorted(users))} (created or copied from {model_id}) read its files on this node; "
                "delete them first",
            )
        if held:
            await asyncio.to_thread(self.store.remove, model_id)
            if self.service is not None:
                self.service.publish_inventory()
        if custom:
            command = DeleteCustomModelCard(command_id=CommandId(new_id()), model_id=ModelId(model_id))
            if (failure := outcome_failure(await self.node.submit(command))) is not None:
                raise failure
        return model_id

    def sharing(self, model_id: str) -> list[str]:
        """Other models whose `[source]` is a local path inside this model's folder (created or copied)."""
        folder = Path(self.store.folder(model_id)).resolve()
        users: list[str] = []
        for card in catalog(self.node).values():
            source = card.sections.get("source", {})
            if card.model_id != model_id and source.get("kind") == "local" and source.get("path"):
                if Path(str(source["path"])).resolve().is_relative_to(folder):
                    users.append(card.model_id)
        return users

    # ------------------------------------------------------------------ blobs

    def blob_path(self, digest: str) -> Path:
        match = DIGEST.match(digest)
        if match is None:
            raise ManageError(400, f"{digest!r} is not a digest: write sha256:<64 hex digits>")
        return Path(self.store.models_dir) / "blobs" / f"sha256-{match.group(1)}"

    async def save_blob(self, digest: str, chunks: AsyncIterator[bytes], size: int | None) -> bool:
        """Write an upload to the blob store, checked against `digest`; False when it was there already."""
        path = self.blob_path(digest)
        if path.is_file():
            async for _ in chunks:  # drain: the client sends the body whatever we answer
                pass
            return False
        from .disk import InsufficientDisk

        async def room(need: int) -> None:
            try:
                await asyncio.to_thread(self.store.ensure_room, need, f"storing blob {digest}")
            except InsufficientDisk as exc:
                raise ManageError(507, str(exc)) from None

        await room(size or 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.{new_id()[:8]}.partial")
        sha = hashlib.sha256()
        written = checked = 0
        try:
            with partial.open("wb") as out:
                async for chunk in chunks:
                    sha.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
                    if size is None and written - checked > BLOB_CHECK_BYTES:  # no length announced: the
                        await room(BLOB_CHECK_BYTES)  # disk is checked as the upload grows, not filled
                        checked = written
            if f"sha256:{sha.hexdigest()}" != f"sha256:{path.name.removeprefix('sha256-')}":
                raise ManageError(400, f"the upload's sha256 is {sha.hexdigest()}, not the {digest} it was sent as")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return True


def hub_reference(name: str) -> tuple[str | None, str | None]:
    """(repository id, tag) for a hub name, (None, None) when `name` is not one."""
    from .hub import REPO_ID

    ref = name
    for prefix in HUB_PREFIXES:
        if ref.startswith(prefix):
            ref = ref.removeprefix(prefix)
    repo, _, tag = ref.partition(":")
    if not REPO_ID.match(repo):
        return None, None
    return repo, (tag if tag and tag != "latest" else None)


def _file_for_tag(repo: str, tag: str) -> str:
    """The repository's GGUF whose name carries the quantization `tag` (`Q4_1`), as Ollama's hub names pick it."""
    from huggingface_hub import HfApi

    from .hub import HubError, endpoint

    try:
        names = HfApi(endpoint=endpoint()).list_repo_files(repo)
    except Exception as exc:
        raise HubError(f"{repo}: the hub at {endpoint()} answered {type(exc).__name__}: {exc}") from None
    hits = sorted(n for n in names if n.endswith(".gguf") and tag.lower() in n.lower())
    if not hits:
        ggufs = sorted(n for n in names if n.endswith(".gguf"))
        raise HubError(f"{repo} has no GGUF file for the tag {tag!r} (its GGUF files: {ggufs[:12]})")
    return hits[0]
