"""Entry point of the diffusers image engine: hookimpls only, light imports (torch loads in runners)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import EngineInstaller, IndexedEvent, NodeSurface, State

from .config import PLUGIN, DiffusersConfig


def _config(node: NodeSurface | None) -> DiffusersConfig:
    return (node.plugin_config(PLUGIN) if node is not None else None) or DiffusersConfig()


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, DiffusersConfig)


@hookimpl
def register_engine_installers(register: Callable[[EngineInstaller], None]) -> None:
    from .environment import DiffusersInstaller

    register(DiffusersInstaller())


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engine import DiffusersEngine

    register(DiffusersEngine())


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    from .cards import DiffusersModelStore

    register(DiffusersModelStore(_config(node).model_dirs))


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    from .engine import DiffusersEngine

    probe = DiffusersEngine().probe()
    if probe.available:
        facts.setdefault("engine_builds", {})["diffusers"] = probe.version


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .files import ImageFiles
    from .routes import add_image_routes

    config = _config(node)
    add_image_routes(app, node, config, ImageFiles(config.url_ttl_s, config.url_store_bytes))


@hookimpl
def startup(node: NodeSurface) -> None:
    from skulk_api_media.inputs import shared_receiver

    config = _config(node)
    shared_receiver(node, config.max_upload_bytes, config.upload_timeout_s)  # one per node, shared


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
    """auto: in where torch and diffusers import (native or the installed overlay)."""
    build = (facts.get("engine_builds") or {}).get("diffusers")
    if build is None:
        return False, "torch and diffusers are not installed (skulk-kernel engines install diffusers)"
    return True, f"{build}"
