"""Entry point of the worker plugin: runs the shards State assigns to this node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from . import WORKER

PLUGIN = "worker"


class WorkerConfig(BaseModel):
    """`[plugins.worker]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    max_restarts: int = Field(default=3, ge=0, description="crashes within crash_window_s before giving up")
    crash_window_s: float = Field(default=120.0, gt=0)
    restart_backoff_s: float = Field(default=1.0, ge=0)
    memory_tolerance: float = Field(default=0.10, ge=0, le=1, description="pre-spawn guard slack")
    load_timeout_s: float = Field(
        default=600.0, gt=0, description="load deadline floor: seconds a runner may take from spawn to loaded"
    )
    load_s_per_gib: float = Field(
        default=30.0, ge=0, description="load deadline per GiB of the runner's weights, when over the floor"
    )
    load_retries: int = Field(
        default=1, ge=0, description="missed load deadlines in a row re-placed anywhere; then without this node"
    )


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, WorkerConfig)


@hookimpl
def register_cli_commands(cli: Any) -> None:
    from .engines_cli import add_engines_command

    add_engines_command(cli)


@hookimpl
async def startup(node: NodeSurface) -> None:
    if node.options.no_worker:
        return
    from .worker import Worker

    worker = Worker(node, node.plugin_config(PLUGIN) or WorkerConfig())
    node.services.publish(WORKER, worker)


@hookimpl
async def on_event_applied(node: NodeSurface, event: Any, before: Any, after: Any) -> None:
    worker = node.services.get(WORKER)
    if worker is not None:
        await worker.on_event(event, before, after)


@hookimpl
async def on_state_synced(node: NodeSurface, after: Any) -> None:
    worker = node.services.get(WORKER)
    if worker is not None:
        await worker.reconcile(after)


@hookimpl
async def shutdown(node: NodeSurface) -> None:
    worker = node.services.withdraw(WORKER)
    if worker is not None:
        await worker.stop()
