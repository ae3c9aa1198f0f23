"""Entry point of the steward plugin: hookimpls only, light imports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from .config import PLUGIN, STEWARD, StewardConfig


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, StewardConfig)


@hookimpl
def startup(node: NodeSurface) -> None:
    from .service import StewardService

    service = StewardService(node, node.plugin_config(PLUGIN) or StewardConfig())
    node.services.publish(STEWARD, service)
    node.spawn(service.run(), "steward")
    from .routing import serve_steward

    serve_steward(node)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_steward_routes

    add_steward_routes(app, node)
