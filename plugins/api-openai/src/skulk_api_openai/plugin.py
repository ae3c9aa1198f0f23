"""Entry point of the OpenAI API plugin: only hookimpls; the routes live in `routes.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

PLUGIN = "api-openai"


class OpenAIConfig(BaseModel):
    """`[plugins.api-openai]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    keepalive_s: float = Field(
        default=10.0,
        gt=0,
        description="a stream whose first token has not come after this long starts with `: keep-alive` "
        "comments, one per interval, so clients' read timeouts do not fire",
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, OpenAIConfig)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_openai_routes

    config = node.plugin_config(PLUGIN) or OpenAIConfig()
    add_openai_routes(app, node, keepalive_s=config.keepalive_s)
