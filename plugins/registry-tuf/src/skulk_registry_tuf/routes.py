"""`GET /registry`: what the registry served last, when it was verified, and why it was refused."""

from __future__ import annotations

from typing import Any

from skulk_kernel.api import NodeSurface

from .plugin import PLUGIN, REGISTRY


def add_registry_routes(app: Any, node: NodeSurface) -> None:
    @app.get("/registry")
    async def registry_status() -> dict[str, Any]:
        store = node.services.get(REGISTRY)
        if store is None:
            notes = node.health_notes.get(PLUGIN, {})
            why = next(iter(notes.values()), "no [plugins.registry-tuf] url in this node's profile")
            return {"configured": False, "reason": why}
        return {"configured": True, **store.status()}
