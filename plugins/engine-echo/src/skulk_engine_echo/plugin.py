"""Entry point of the echo engine plugin.

This module is what the node imports. It stays light: the engine itself lives in `engine.py` and
is only imported when a hook asks for it (the same rule keeps mlx, torch or llama_cpp out of
`skulk-kernel plugins`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import IndexedEvent, NodeSurface, State

PLUGIN = "engine-echo"


class EchoConfig(BaseModel):
    """`[plugins.engine-echo]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    token_delay_s: float = Field(default=0.0, ge=0, description="pause between tokens (tests)")
    context_length: int = Field(default=4096, ge=8, description="context length of the echo cards")
    hang_model: bool = Field(
        default=False, description="offer skulk/echo-hang, whose load never finishes (load deadline tests)"
    )
    vision_model: bool = Field(
        default=False, description="offer skulk/echo-vision, which takes images and answers with their digests"
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, EchoConfig)


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engine import EchoEngine

    register(EchoEngine())


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface) -> None:
    from .engine import EchoModelStore

    config = (node.plugin_config(PLUGIN) if node is not None else None) or EchoConfig()
    register(EchoModelStore(config.context_length, hang_model=config.hang_model, vision_model=config.vision_model))


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    facts.setdefault("engine_builds", {})["echo"] = "builtin"


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: out; the deterministic echo engine is for tests and demos (profile dev)."""
    return False, "the deterministic test engine, for tests and demos (profile dev)"


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    """Images of chat tasks whose runner is on this node arrive on the data plane (vision cards)."""
    config = node.plugin_config(PLUGIN) or EchoConfig()
    if config.vision_model:
        from skulk_api_control.vision_wire import follow

        follow(node, event.event)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    if (node.plugin_config(PLUGIN) or EchoConfig()).vision_model:
        from skulk_api_control.vision_wire import unfollow

        unfollow(node)
