"""Entry point of the TUF registry plugin: signed card files from a registry join the catalog.

Loaded but inert without `[plugins.registry-tuf] url`: it then registers no model store and
starts nothing, so it is safe in every profile; its CLI (`skulk-kernel registry ...`) works anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface, ServiceKey

if TYPE_CHECKING:  # imported when the profile configures a registry, as configure() does
    from .service import RegistryStore

PLUGIN = "registry-tuf"
REGISTRY: ServiceKey[RegistryStore] = ServiceKey(PLUGIN)  # the node's verified catalog (private to this plugin)


class RegistryConfig(BaseModel):
    """`[plugins.registry-tuf]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(
        default_factory=lambda: os.environ.get("SKULK_REGISTRY_URL") or None,
        description="the registry's base URL (it serves metadata/ and targets/); default $SKULK_REGISTRY_URL",
    )
    root: str | None = Field(
        default_factory=lambda: os.environ.get("SKULK_REGISTRY_ROOT") or None,
        description="path of the trusted root.json (`registry init` printed it); default $SKULK_REGISTRY_ROOT",
    )
    refresh_interval_s: float = Field(default=60.0, ge=1, description="at most one refresh per this many seconds")
    max_age_days: float = Field(default=30.0, gt=0, description="how long a last good catalog is served")
    cache_dir: str | None = Field(default=None, description="default: <home>/registry-tuf")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https:// (got {url!r})")
        return url

    @model_validator(mode="after")
    def _root_with_url(self) -> RegistryConfig:
        if self.url and not self.root:
            raise ValueError("url is set but root is not: set root to the registry's trusted root.json")
        return self


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, RegistryConfig)


@hookimpl
def configure(node: NodeSurface) -> None:
    import logging
    from pathlib import Path

    from .service import RegistryStore

    config = node.plugin_config(PLUGIN) or RegistryConfig()
    if not config.url or not config.root:
        return  # inert: no registry configured
    root_path = Path(config.root).expanduser()
    try:
        root = root_path.read_bytes()
    except OSError as exc:
        message = f"cannot read the trusted root {root_path} ({exc.strerror}): the registry is not used"
        logging.getLogger("skulk.registry").error(message)
        node.health_notes[PLUGIN] = {"registry_root": message}
        return

    def health(notes: dict[str, str]) -> None:
        if notes:
            node.health_notes[PLUGIN] = notes
        else:
            node.health_notes.pop(PLUGIN, None)

    store = RegistryStore(
        config.url,
        root,
        Path(config.cache_dir).expanduser() if config.cache_dir else node.options.home / PLUGIN,
        refresh_interval_s=config.refresh_interval_s,
        max_age_s=config.max_age_days * 86400,
        offline=node.options.offline,
        health=health,
    )
    store.load_saved()
    node.services.publish(REGISTRY, store)


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    store = node.services.get(REGISTRY) if node is not None else None
    if store is not None:
        register(store)


@hookimpl
def startup(node: NodeSurface) -> None:
    store = node.services.get(REGISTRY)
    if store is not None:
        from .loop import refresh_loop

        node.spawn(refresh_loop(node, store), "registry-tuf-refresh")


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_registry_routes

    add_registry_routes(app, node)


@hookimpl
def register_cli_commands(cli: Any) -> None:
    from .cli import add_registry_commands

    add_registry_commands(cli)
