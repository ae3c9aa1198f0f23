"""Entry point of the transport-libp2p plugin. Imports neither libp2p nor trio: the transport does, on start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from .config import Libp2pConfig

PLUGIN = "transport-libp2p"


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, Libp2pConfig)


@hookimpl
def register_transports(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """One Libp2pTransport ("libp2p") per node object; the profile's [planes] picks its planes."""
    from .transport import Libp2pTransport

    config = node.plugin_config(PLUGIN) if node is not None else None
    register(Libp2pTransport(config or Libp2pConfig(), node=node))


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: out; its planes are on Zenoh (profile cpu-llamacpp-libp2p puts control on libp2p)."""
    return False, "an alternative control transport; auto's planes are on Zenoh (profile cpu-llamacpp-libp2p)"
