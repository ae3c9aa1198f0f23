"""`/store/*` routes: what this node holds, fetching a model here, cancelling, deleting a copy.

* `GET /store/storage`: models held (size, files), downloads running, the models directory's disk.
* `POST /store/models/{id}/download`: fetch the model onto this node now (peers first, then hub).
* `DELETE /store/models/{id}/download`: cancel a running hub download (partial files stay, so a
  later request resumes).
* `DELETE /store/models/{id}`: delete this node's copy (refused while an instance here uses it).
* `GET /store/transfers`: the bytes each peer sent for the last copies, and bytes served to peers.
* `GET /store/registry`: every store host's canonical registry and every node's staged copies
  (from State, the same on every node).
* `POST /store/purge-staging`: delete this node's staged copies that no instance here uses.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from fastapi.responses import JSONResponse
from skulk_kernel.api import NodeSurface, catalog

from .plugin import STORE, STORE_SERVICE


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        status_code=status,
        headers={"x-should-retry": "false"},
    )


def add_store_admin_routes(app: Any, node: NodeSurface) -> None:
    def parts() -> tuple[Any, Any]:
        return node.services.get(STORE), node.services.get(STORE_SERVICE)

    @app.get("/store/storage")
    async def storage() -> Any:
        store, service = parts()
        if store is None:
            return _error(503, "this node has no model store", "no_store")
        held = {}
        staged = store.staged_copies()
        in_use = service.in_use() if service else set()
        for model_id, (card, path) in store.installed().items():
            manifest = store.manifest(model_id)
            held[model_id] = {
                "path": str(path),
                "bytes": card.storage_size,
                "files": sorted(manifest),
                "staged": model_id in staged,
                "in_use": model_id in in_use,
            }
        disk = shutil.disk_usage(store.models_dir) if store.models_dir.exists() else None
        used = sum(c.bytes for c in staged.values())
        budget = store.staging_budget
        return {
            "node_id": node.node_id,
            "role": store.role,
            "models_dir": str(store.models_dir),
            "models": held,
            "staging": {
                "budget_bytes": budget,
                "used_bytes": used,
                "over_budget": budget is not None and used > budget,
                "copies": {
                    mid: {**c.model_dump(exclude={"model_id"}), "in_use": mid in in_use} for mid, c in staged.items()
                },
            },
            "downloads": dict(store.downloads.active),
            "errors": dict(service.errors) if service else {},
            "disk": {
                "total_bytes": disk.total,
                "free_bytes": disk.free,
                "headroom_bytes": store.disk_headroom,
                "low_disk": node.health_notes.get("store", {}).get("low_disk"),
            }
            if disk
            else None,
        }

    @app.post("/store/models/{model_id:path}/download")
    async def download(model_id: str) -> Any:
        store, service = parts()
        if store is None or service is None:
            return _error(503, "this node has no model store", "no_store")
        card = catalog(node).get(model_id)
        if card is None:
            return _error(404, f"{model_id!r} is not in the catalog (GET /models lists it)", "model_not_found")
        if store.local_path(model_id) is not None:
            return {"message": f"{model_id} is already on this node", "status": "installed"}
        from .disk import InsufficientDisk

        running = service.background.get(model_id)
        try:
            if running is None or running.done():
                await asyncio.to_thread(store.check_room, card)
        except InsufficientDisk as exc:
            service.errors[model_id] = str(exc)
            return _error(507, str(exc), InsufficientDisk.code)
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
        elif model_id in service.cancelled:
            status = "cancelled"
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

    @app.get("/store/registry")
    async def registry() -> Any:
        from .staging import staged_everywhere, store_hosts

        reachable = set(node.reachable_nodes()) | {node.node_id}
        hosts = {
            nid: {"reachable": nid in reachable, **entry.model_dump(exclude={"mark", "node_id"})}
            for nid, entry in store_hosts(node.state).items()
        }
        return {"hosts": hosts, "staged": staged_everywhere(node.state)}

    @app.post("/store/purge-staging")
    async def purge_staging() -> Any:
        store, service = parts()
        if store is None:
            return _error(503, "this node has no model store", "no_store")
        if store.role == "host":
            return _error(
                400,
                "this node is a store host: its copies are canonical, not staging; "
                "delete one with DELETE /store/models/{model_id}",
                "store_host",
            )
        result = await asyncio.to_thread(store.purge_staging)
        if service is not None:
            service.publish_inventory()
        return result

    @app.get("/store/transfers")
    async def transfers() -> Any:
        _store, service = parts()
        if service is None:
            return _error(503, "this node has no model store", "no_store")
        return {"copied_from": service.fetcher.last_sources, "served_to": dict(service.peer_server.served)}
