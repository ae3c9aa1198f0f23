"""Entry point of the hello-world plugin. Light on purpose: the engine is imported on demand."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from skulk_kernel import hookimpl

PLUGIN = "hello-world"
STARTED = "hello-world.started"
STOPPED = "hello-world.stopped"


class HelloConfig(BaseModel):
    """`[plugins.hello-world]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    greeting: str = "Hello"


def _config(node: Any) -> HelloConfig:
    return node.plugin_config(PLUGIN) or HelloConfig()


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, HelloConfig)


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engine import HelloEngine

    register(HelloEngine())


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    facts.setdefault("engine_builds", {})["hello"] = "0.1.0"


@hookimpl
def register_api_routes(app: Any, node: Any) -> None:
    greeting = _config(node).greeting

    @app.get("/hello")
    async def hello() -> dict[str, Any]:
        return {"greeting": f"{greeting}, world", "nodeId": node.node_id, "engines": sorted(node.engines)}


@hookimpl
def startup(node: Any) -> None:
    marker = {
        "nodeId": node.node_id,
        "greeting": _config(node).greeting,
        "engines": sorted(node.engines),
        "plugins": node.plugin_names,
    }
    (node.home / STARTED).write_text(json.dumps(marker))


@hookimpl
def shutdown(node: Any) -> None:
    (node.home / STOPPED).write_text(node.node_id)
