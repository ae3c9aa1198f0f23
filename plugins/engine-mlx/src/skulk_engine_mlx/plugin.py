"""Entry point of the MLX engine plugin. Imports neither mlx nor mlx_lm at module level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import Engine, IndexedEvent, NodeSurface, State

PLUGIN = "engine-mlx"


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    from .options import MlxConfig

    register(PLUGIN, MlxConfig)


@hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    from .engine import MlxEngine

    register(MlxEngine())


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    from .engine import mlx_usable, mlx_version

    version = mlx_version()
    if version is not None:
        reason = mlx_usable()
        facts.setdefault("engine_builds", {})["mlx"] = f"mlx {version}" if reason is None else f"unusable: {reason}"


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in on Apple silicon with mlx; out on Linux, where MLX's CPU build decodes slower than
    llama.cpp (profile cpu-mlx loads it on purpose, for its pipeline and tensor placements)."""
    hw = facts.get("hardware") or {}
    build = (facts.get("engine_builds") or {}).get("mlx")
    if (hw.get("os"), hw.get("arch")) != ("Darwin", "arm64"):
        return False, "not Apple silicon: MLX's CPU build is slower than llama.cpp here (profile cpu-mlx loads it)"
    if build is None or build.startswith("unusable"):
        return False, f"Apple silicon, but mlx is not usable ({build or 'not installed'}): pip install mlx mlx-lm"
    return True, f"{build} on Metal"


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    """Images of chat tasks whose runner is on this node arrive on the data plane (vision cards, vlm.py)."""
    from skulk_api_control.vision_wire import follow

    follow(node, event.event)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    from skulk_api_control.vision_wire import unfollow

    unfollow(node)
