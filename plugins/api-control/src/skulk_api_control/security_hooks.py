"""The hookimpls of API keys and quotas (plugin.py re-exports them): light imports only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    from .auth import ApiControlConfig

    register("api-control", ApiControlConfig)


@hookimpl
def wrap_inference(node: NodeSurface) -> Any:
    """The quota meter counts each key's served tokens (InferenceMiddleware.observe)."""
    from .quota import meter_for

    return meter_for(node)


@hookimpl
def register_cli_commands(cli: Any) -> None:
    from .keys_cli import add_keys_commands

    add_keys_commands(cli)
