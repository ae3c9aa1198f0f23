"""Entry point of the Ollama API plugin: only hookimpls; the routes live in `routes.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

PLUGIN = "api-ollama"


class OllamaConfig(BaseModel):
    """`[plugins.api-ollama]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    version: str = Field(
        default="0.12.0",
        description="what GET /api/version reports: the Ollama API level this adapter follows "
        "(clients gate features such as `think` on it)",
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, OllamaConfig)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_ollama_routes

    config = node.plugin_config(PLUGIN) or OllamaConfig()
    add_ollama_routes(app, node, version=config.version)
    from .manage_routes import add_manage_routes  # pull, create, copy, delete: the store does the work

    add_manage_routes(app, node)
