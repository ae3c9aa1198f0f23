"""Model routes: GET /models, POST /models/add, DELETE /models/custom/{model_id}.

Cards added here become custom cards in State (replicated to every node, the last override); the
files stay where the operator put them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from skulk_kernel.api import AddCustomModelCard, CommandId, DeleteCustomModelCard, ModelId, NodeSurface, catalog, new_id


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        status_code=status,
        headers={"x-should-retry": "false"},
    )


def model_entry(node: NodeSurface, card: Any) -> dict[str, Any]:
    store = node.extensions.get("store")
    placed = [i.instance_id for i in node.state.instances.values() if i.shard_assignments.model_id == card.model_id]
    installed = (
        bool(store and store.local_path(card.model_id)) or card.sections.get("source", {}).get("kind") == "local"
    )
    caps = set(card.capabilities) | {"text"} if "TextGeneration" in card.tasks else set(card.capabilities)
    if "TextEmbedding" in card.tasks:
        caps.add("embedding")
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

    @app.post("/models/add")
    async def add_model(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_json")
        store = node.extensions.get("store")
        path = body.get("path")
        if not isinstance(path, str) or not path:
            return _error(
                400,
                'body must be {"path": "/abs/path/model.gguf or a model folder", "model_id": optional}',
                "missing_path",
            )
        model_id = body.get("model_id")
        if model_id is not None and not isinstance(model_id, str):
            return _error(400, "model_id must be a string")
        if store is None:
            return _error(400, "this node has no model store plugin")
        if not Path(path).expanduser().exists():
            return _error(400, f"{path} does not exist on node {node.options.node_name}", "path_not_found")
        try:
            card = await asyncio.to_thread(store.add_local, Path(path), model_id)
        except Exception as exc:  # a bad file is the caller's mistake, said plainly
            return _error(400, f"cannot read a model from {path}: {exc}", "unreadable_model")
        await node.submit(AddCustomModelCard(command_id=CommandId(new_id()), card=card))
        try:
            await node.wait_for(lambda s: card.model_id in s.custom_model_cards, 10)
        except TimeoutError:
            return _error(503, "the master did not confirm the card in time; retry", "not_confirmed")
        return {"message": f"added {card.model_id}", "model_card": model_entry(node, card)}

    @app.delete("/models/custom/{model_id:path}")
    async def delete_custom(model_id: str) -> Any:
        if model_id not in node.state.custom_model_cards:
            return _error(404, f"{model_id!r} is not a custom model card (GET /models lists them)", "model_not_found")
        await node.submit(DeleteCustomModelCard(command_id=CommandId(new_id()), model_id=ModelId(model_id)))
        await node.wait_for(lambda s: model_id not in s.custom_model_cards, 10)
        return {"message": f"deleted custom card {model_id}"}
