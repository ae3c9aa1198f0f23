"""Entry point of the Anthropic API plugin: only hookimpls; the routes live in `routes.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

PLUGIN = "api-anthropic"


class AnthropicConfig(BaseModel):
    """`[plugins.api-anthropic]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    keepalive_s: float = Field(
        default=10.0,
        gt=0,
        description="a stream whose first token has not come after this long starts with "
        "`message_start`, then sends a `ping` event every interval, so clients' read timeouts do not fire",
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, AnthropicConfig)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_anthropic_routes

    config = node.plugin_config(PLUGIN) or AnthropicConfig()
    add_anthropic_routes(app, node, keepalive_s=config.keepalive_s)
