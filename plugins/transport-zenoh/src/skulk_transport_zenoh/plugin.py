"""Entry point of the transport-zenoh plugin. Imports no Zenoh: the transport imports it on start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from .config import ZenohConfig

PLUGIN = "transport-zenoh"


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, ZenohConfig)


@hookimpl
def register_transports(register: Callable[[Any], None], node: NodeSurface) -> None:
    """One ZenohTransport ("zenoh") per node object; the profile's [planes] picks the planes."""
    from .transport import ZenohTransport

    config = node.plugin_config(PLUGIN) if node is not None else None
    register(ZenohTransport(config or ZenohConfig(), node=node))


@hookimpl
def register_cli_commands(cli: Any) -> None:
    """`skulk-kernel cluster token`: print the join token of this node's cluster again."""
    from .cli import add_cluster_commands

    add_cluster_commands(cli)
