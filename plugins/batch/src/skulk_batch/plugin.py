"""Entry point of the batch plugin: hookimpls only, light imports."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface, ServiceKey

from .config import PLUGIN, BatchConfig

if TYPE_CHECKING:
    from .service import BatchService

BATCHES: ServiceKey[BatchService] = ServiceKey(PLUGIN)  # the node's batch service (private to this plugin)
SWEEP_EVERY_S = 60.0


def _config(node: NodeSurface) -> BatchConfig:
    return node.plugin_config(PLUGIN) or BatchConfig()


def _service(node: NodeSurface) -> BatchService:
    """The node's service, made on first use (routes are registered before startup runs)."""
    service = node.services.get(BATCHES)
    if service is None:
        from .service import BatchService
        from .storage import Storage

        config = _config(node)
        root = Path(config.files_dir) if config.files_dir else Path(node.options.home) / PLUGIN
        service = BatchService(node, config, Storage(node, root, config.copies))
        node.services.publish(BATCHES, service)
    return service


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, BatchConfig)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_batch_routes

    service = _service(node)
    service.app = app
    add_batch_routes(app, node, service, _config(node))


async def _sweep_loop(node: NodeSurface) -> None:
    while not node.stopping:
        await asyncio.sleep(SWEEP_EVERY_S)
        service = node.services.get(BATCHES)
        if service is not None:
            service.sweep()


@hookimpl
def wrap_inference(node: NodeSurface) -> Any:
    """Marks the commands of batch lines, so the priority rule tells them from interactive ones."""
    from .service import BatchMarker

    return BatchMarker(_service(node))


@hookimpl
def startup(node: NodeSurface) -> None:
    service = _service(node)
    node.spawn(service.run(), "batch-keeper")
    node.spawn(_sweep_loop(node), "batch-sweep")


@hookimpl
def shutdown(node: NodeSurface) -> None:
    service = node.services.withdraw(BATCHES)
    if service is not None:
        for task in service.running.values():
            task.cancel()


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in with the OpenAI API (batch lines are OpenAI requests)."""
    if "api-openai" not in chosen:
        return False, "api-openai is not in (batch lines are OpenAI requests)"
    return True, "serves /v1/files and /v1/batches over the OpenAI routes"
