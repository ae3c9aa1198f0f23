"""Entry point of the speech plugin: hookimpls only, light imports (the engines load in runners)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_api_control.uploads import close_receiver, forward_event, shared_receiver
from skulk_kernel import hookimpl
from skulk_kernel.api import IndexedEvent, ModelCard, NodeSurface, State

from .config import PLUGIN, SpeechConfig
from .uploads import AUDIO


def _config(node: NodeSurface | None) -> SpeechConfig:
    return (node.plugin_config(PLUGIN) if node is not None else None) or SpeechConfig()


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, SpeechConfig)


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engines import engines

    for engine in engines():
        register(engine)


@hookimpl
def register_model_stores(register: Callable[[Any], None]) -> None:
    from .cards import SpeechModelStore

    register(SpeechModelStore())


@hookimpl
def resolve_model(ref: str, catalog: dict[str, ModelCard]) -> ModelCard | None:
    """OpenAI's speech model names (tts-1, whisper-1, ...) resolve to the speech models here."""
    from .cards import ALIASES

    target = ALIASES.get(ref)
    return catalog.get(target) if target else None


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    from .engines import engines

    builds = facts.setdefault("engine_builds", {})
    for engine in engines():
        probe = engine.probe()
        if probe.available:
            builds[engine.name] = probe.version


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .realtime import add_realtime_route
    from .routes import add_speech_routes

    add_speech_routes(app, node, _config(node))
    add_realtime_route(app, node, _config(node))


@hookimpl
def startup(node: NodeSurface) -> None:
    config = _config(node)
    shared_receiver(AUDIO, node, config.max_upload_bytes, config.upload_timeout_s)


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    forward_event(AUDIO, node, event.event)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    close_receiver(AUDIO, node)


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in where a speech engine's library imports; its models are not placed at start."""
    from .engines import engines

    found = [f"{engine.name} {probe.version}" for engine in engines() if (probe := engine.probe()).available]
    if not found:
        return False, "no speech engine imports (pip install piper-tts faster-whisper)"
    return True, f"{', '.join(found)}; models are not placed at start"
