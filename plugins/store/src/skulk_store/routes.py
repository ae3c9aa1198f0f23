"""Model routes: GET /models, GET /models/search, POST /models/add, POST /models/add-card,
DELETE /models/custom/{model_id}.

Cards added here become custom cards in State (replicated to every node, the last override). A
local path must lie under the model directories and its files stay where they are; a repository
id is pinned to a commit, its card is built from the repository's metadata and the files are
downloaded in the background (progress in `/state` `downloadProgress`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.outcomes import outcome_error
from skulk_kernel.api import (
    AddCustomModelCard,
    CommandId,
    DeleteCustomModelCard,
    ModelCard,
    ModelId,
    NodeSurface,
    catalog,
    new_id,
)

from .bodies import AddCardBody, AddModelBody
from .plugin import STORE, STORE_SERVICE


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        status_code=status,
        headers={"x-should-retry": "false"},
    )


def model_entry(node: NodeSurface, card: Any) -> dict[str, Any]:
    store = node.services.get(STORE)
    placed = [i.instance_id for i in node.state.instances.values() if i.shard_assignments.model_id == card.model_id]
    installed = (
        bool(store and store.local_path(card.model_id)) or card.sections.get("source", {}).get("kind") == "local"
    )
    caps = set(card.capabilities) | {"text"} if "TextGeneration" in card.tasks else set(card.capabilities)
    if "TextEmbedding" in card.tasks:
        caps.add("embedding")
    if "TextRerank" in card.tasks:
        caps.add("rerank")
    return {
        "id": card.model_id,
        "model_id": card.model_id,
        "name": card.model_id.split("/")[-1],
        "object": "model",
        "created": 0,
        "owned_by": "skulk",
        "tasks": list(card.tasks),
        "family": card.family,
        "capabilities": list(card.capabilities),
        "resolved_capabilities": sorted(caps),
        "quantization": card.quantization,
        "context_length": card.context_length,
        "storage_size": card.storage_size,
        "n_layers": card.n_layers,
        "hidden_size": card.hidden_size,
        "embedding_dimensions": card.embedding_dimensions,
        "custom": card.model_id in node.state.custom_model_cards,
        "installed": installed,
        "instances": placed,
    }


def add_store_routes(app: Any, node: NodeSurface) -> None:
    @app.get("/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(node, card) for card in catalog(node).values()]}

    async def confirm(card: ModelCard) -> JSONResponse | None:
        """Add the card through the master: None once indexed, else the error that says why not."""
        return outcome_error(await node.submit(AddCustomModelCard(command_id=CommandId(new_id()), card=card), 15))

    @app.post("/models/add", openapi_extra=body_schema(AddModelBody))
    async def add_model(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_json")
        store = node.services.get(STORE)
        if store is None:
            return _error(400, "this node has no model store plugin")
        model_id = body.get("model_id")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            return _error(400, "model_id must be a non-empty string")
        repo_id = body.get("repo_id") or body.get("model")
        if repo_id is not None:
            return await add_from_hub(body, repo_id, model_id)
        path = body.get("path")
        if not isinstance(path, str) or not path:
            return _error(
                400,
                'body must be {"repo_id": "owner/name", "revision"?, "file"?} or '
                '{"path": "a .gguf file or model folder under the model directories", "model_id"?}',
                "missing_path",
            )
        if not Path(path).expanduser().exists():
            return _error(400, f"{path} does not exist on node {node.options.node_name}", "path_not_found")
        from .store import PathOutsideModelDirs

        try:
            card = await asyncio.to_thread(store.add_local, Path(path), model_id)
        except PathOutsideModelDirs as exc:
            return _error(400, str(exc), "path_outside_model_dirs")
        except Exception as exc:  # a bad file is the caller's mistake, said plainly
            return _error(400, f"cannot read a model from {path}: {exc}", "unreadable_model")
        if (refused := await confirm(card)) is not None:
            return refused
        return {"message": f"added {card.model_id}", "model_card": model_entry(node, card)}

    async def add_from_hub(body: dict[str, Any], repo_id: Any, model_id: str | None) -> Any:
        from . import hub

        revision, file = body.get("revision"), body.get("file")
        for name, value in (("repo_id", repo_id), ("revision", revision), ("file", file)):
            if value is not None and (not isinstance(value, str) or not value):
                return _error(400, f"{name} must be a non-empty string")
        if node.options.offline:
            return _error(
                400,
                f"this node is offline (--offline): it cannot reach the hub to add {repo_id}; add it on an online "
                "node, or add a local path",
                "offline",
            )
        try:
            model = await asyncio.to_thread(hub.resolve, repo_id, revision, file)
            card = await asyncio.to_thread(hub.card_for, model, model_id or repo_id)
        except hub.HubError as exc:
            return _error(400, str(exc), "hub_refused")
        service, store = node.services.get(STORE_SERVICE), node.services.get(STORE)
        started = bool(body.get("download", True)) and service is not None
        if started and store is not None:  # refused before the card is added and before any byte is written
            from .disk import InsufficientDisk

            try:
                await asyncio.to_thread(store.check_room, card)
            except InsufficientDisk as exc:
                return _error(
                    507, f'{exc} (nothing was added; "download": false adds the card alone)', InsufficientDisk.code
                )
        if (refused := await confirm(card)) is not None:
            return refused
        if started and service is not None:
            service.download_in_background(card.model_id)
        return {
            "message": f"added {card.model_id} ({repo_id}@{model.commit})",
            "model_card": model_entry(node, card),
            "revision": model.commit,
            "files": [f.model_dump() for f in model.files],
            "download": "started" if started else "not requested",
        }

    @app.post("/models/add-card", openapi_extra=body_schema(AddCardBody))
    async def add_card(request: Request) -> Any:
        from .cards import CardError, card_from_mapping

        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("card"), dict):
            return _error(400, 'body must be {"card": {model_id, n_layers, hidden_size, ...}}', "invalid_json")
        try:
            card = card_from_mapping(body["card"], "card")
        except CardError as exc:
            return _error(400, str(exc), "invalid_card")
        source = card.sections.get("source", {})
        if source.get("kind") == "hub":
            from .hub import COMMIT, REPO_ID

            if not REPO_ID.match(str(source.get("repo_id", ""))) or not COMMIT.match(str(source.get("revision", ""))):
                return _error(
                    400,
                    "a [source] kind = hub card needs repo_id (owner/name) and revision pinned to a full 40-character "
                    "commit id",
                    "unpinned_revision",
                )
        if (refused := await confirm(card)) is not None:
            return refused
        return {"message": f"added {card.model_id}", "model_card": model_entry(node, card)}

    @app.get("/models/search")
    async def search_models(q: str = "", limit: int = 20) -> Any:
        if not q.strip():
            return _error(400, "give a query: /models/search?q=smollm", "missing_query")
        limit = max(1, min(limit, 100))
        needle = q.strip().lower()
        found = [
            {**model_entry(node, card), "source": "catalog"}
            for card in catalog(node).values()
            if needle in card.model_id.lower()
        ][:limit]
        hub_note: dict[str, Any] = {}
        if node.options.offline:
            hub_note = {"hub": "skipped: this node is offline"}
        else:
            from . import hub

            known = {entry["id"] for entry in found}
            try:
                for item in await asyncio.to_thread(hub.search, q.strip(), limit):
                    if item["id"] not in known:
                        found.append({"id": item["id"], "source": "hub", "downloads": item["downloads"]})
            except hub.HubError as exc:
                hub_note = {"hub": f"unavailable: {exc}"}
        return {"object": "list", "data": found[: 2 * limit], **hub_note}

    @app.delete("/models/custom/{model_id:path}")
    async def delete_custom(model_id: str) -> Any:
        if model_id not in node.state.custom_model_cards:
            return _error(404, f"{model_id!r} is not a custom model card (GET /models lists them)", "model_not_found")
        outcome = await node.submit(DeleteCustomModelCard(command_id=CommandId(new_id()), model_id=ModelId(model_id)))
        if (failure := outcome_error(outcome)) is not None:
            return failure
        return {"message": f"deleted custom card {model_id}"}
