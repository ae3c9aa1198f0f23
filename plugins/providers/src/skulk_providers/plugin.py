"""Entry point of the providers plugin: hookimpls only, light imports (stevedore loads at start-up)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from .config import PLUGIN, PROVIDERS, ProvidersConfig


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, ProvidersConfig)


@hookimpl
def register_cli_commands(cli: Any) -> None:
    from .cli import add_extensions_command

    add_extensions_command(cli)


@hookimpl
def startup(node: NodeSurface) -> None:
    from .extensions import load
    from .service import ProviderService

    config = node.plugin_config(PLUGIN) or ProvidersConfig()
    loaded = load(config.extensions)
    if config.first_party:
        from .speech import speech_capabilities

        for cap in speech_capabilities(node):  # first-party: composed by the profile, not found by stevedore
            loaded.capabilities.setdefault(cap.descriptor.ref, cap)
    service = ProviderService(node, config, loaded)
    node.services.publish(PROVIDERS, service)
    service.start()


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_routes

    add_routes(app, node)


@hookimpl
async def shutdown(node: NodeSurface) -> None:
    service = node.services.withdraw(PROVIDERS)
    if service is not None:
        await service.stop()
