"""Entry point of the video engines plugin: hookimpls only, light imports (engines load in runners)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import EngineInstaller, IndexedEvent, NodeSurface, State

from .config import PLUGIN, VideoConfig


def _config(node: NodeSurface | None) -> VideoConfig:
    return (node.plugin_config(PLUGIN) if node is not None else None) or VideoConfig()


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, VideoConfig)


@hookimpl
def register_engines(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    from .engines import engines

    for engine in engines(_config(node)):
        register(engine)


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    from .cards import VideoModelStore

    register(VideoModelStore(_config(node)))


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    builds = facts.setdefault("engine_builds", {})
    builds.setdefault("test_video", "builtin")


@hookimpl
def register_engine_installers(register: Callable[[EngineInstaller], None]) -> None:
    from .install import ComfyUIInstaller

    register(ComfyUIInstaller())


@hookimpl
def startup(node: NodeSurface) -> None:
    from skulk_api_media.inputs import shared_receiver

    config = _config(node)
    shared_receiver(
        node, config.max_input_bytes, config.input_timeout_s
    )  # one per node, shared by the media engine plugins


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    from skulk_api_media.inputs import forward_event

    forward_event(node, event.event)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    from skulk_api_media.inputs import close_receiver

    close_receiver(node)


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in where a ComfyUI checkout is installed ($SKULK_COMFY_ROOT or `engines install comfyui`)."""
    import os
    from pathlib import Path

    from .install import PINNED

    home = Path(os.environ.get("SKULK_HOME", "~/.skulk")).expanduser()
    root = Path(os.environ.get("SKULK_COMFY_ROOT") or home / "engines" / "comfyui" / PINNED)
    if (root / "main.py").is_file():
        return True, f"ComfyUI at {root}"
    return False, "ComfyUI is not installed (skulk-kernel engines install comfyui)"
