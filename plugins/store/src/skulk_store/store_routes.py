"""`/store/*` routes: what this node holds, fetching a model here, cancelling, deleting a copy.

* `GET /store/storage`: models held (size, files), downloads running, the models directory's disk.
* `POST /store/models/{id}/download`: fetch the model onto this node now (peers first, then hub).
* `DELETE /store/models/{id}/download`: cancel a running hub download (partial files stay, so a
  later request resumes).
* `DELETE /store/models/{id}`: delete this node's copy (refused while an instance here uses it).
* `GET /store/transfers`: the bytes each peer sent for the last copies, and bytes served to peers.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from fastapi.responses import JSONResponse
from skulk_kernel.api import NodeSurface, catalog


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        status_code=status,
        headers={"x-should-retry": "false"},
    )


def add_store_admin_routes(app: Any, node: NodeSurface) -> None:
    def parts() -> tuple[Any, Any]:
        return node.extensions.get("store"), node.extensions.get("store-service")

    @app.get("/store/storage")
    async def storage() -> Any:
        store, service = parts()
        if store is None:
            return _error(503, "this node has no model store", "no_store")
        held = {}
        for model_id, (card, path) in store.installed().items():
            manifest = store.manifest(model_id)
            held[model_id] = {"path": str(path), "bytes": card.storage_size, "files": sorted(manifest)}
        disk = shutil.disk_usage(store.models_dir) if store.models_dir.exists() else None
        return {
            "node_id": node.node_id,
            "models_dir": str(store.models_dir),
            "models": held,
            "downloads": dict(store.downloads.active),
            "errors": dict(service.errors) if service else {},
            "disk": {"total_bytes": disk.total, "free_bytes": disk.free} if disk else None,
        }

    @app.post("/store/models/{model_id:path}/download")
    async def download(model_id: str) -> Any:
        store, service = parts()
        if store is None or service is None:
            return _error(503, "this node has no model store", "no_store")
        if catalog(node).get(model_id) is None:
            return _error(404, f"{model_id!r} is not in the catalog (GET /models lists it)", "model_not_found")
        if store.local_path(model_id) is not None:
            return {"message": f"{model_id} is already on this node", "status": "installed"}
        started = service.download_in_background(model_id)
        return {"message": f"fetching {model_id}", "status": "started" if started else "running"}

    @app.get("/store/models/{model_id:path}/download")
    async def download_status(model_id: str) -> Any:
        store, service = parts()
        if store is None or service is None:
            return _error(503, "this node has no model store", "no_store")
        task = service.background.get(model_id)
        if store.local_path(model_id) is not None:
            status = "installed"
        elif task is not None and not task.done():
            status = "running"
        elif model_id in service.errors:
            status = "failed"
        else:
            status = "absent"
        return {
            "model_id": model_id,
            "status": status,
            "error": service.errors.get(model_id),
            "progress": store.downloads.active.get(model_id),
            "sources": service.fetcher.last_sources.get(model_id, {}),
        }

    @app.delete("/store/models/{model_id:path}/download")
    async def cancel(model_id: str) -> Any:
        store, _service = parts()
        if store is None or not store.downloads.cancel(model_id):
            return _error(404, f"no download of {model_id!r} is running on this node", "no_download")
        return {"message": f"cancelling the download of {model_id}; partial files are kept for a resume"}

    @app.delete("/store/models/{model_id:path}")
    async def delete(model_id: str) -> Any:
        store, service = parts()
        if store is None:
            return _error(503, "this node has no model store", "no_store")
        if model_id not in store.installed():
            return _error(404, f"this node holds no copy of {model_id!r}", "not_held")
        for instance in node.state.instances.values():
            if (
                instance.shard_assignments.model_id == model_id
                and node.node_id in instance.shard_assignments.node_to_runner
            ):
                return _error(
                    409, f"instance {instance.instance_id} on this node uses {model_id}; delete it first", "in_use"
                )
        await asyncio.to_thread(store.remove, model_id)
        if service is not None:
            service.publish_inventory()
        return {"message": f"deleted this node's copy of {model_id}"}

    @app.get("/store/transfers")
    async def transfers() -> Any:
        _store, service = parts()
        if service is None:
            return _error(503, "this node has no model store", "no_store")
        return {"copied_from": service.fetcher.last_sources, "served_to": dict(service.peer_server.served)}
