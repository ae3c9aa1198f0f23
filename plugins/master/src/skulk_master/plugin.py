"""Entry point of the master plugin: every node runs it, only the elected master acts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import IndexedEvent, NodeSurface, NodeTimedOut, State

from . import MASTER

PLUGIN = "master"


class MasterConfig(BaseModel):
    """`[plugins.master]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    default_models: list[str] = Field(default_factory=list, description="placed when none is running")
    node_timeout_s: float = Field(default=30.0, gt=0, description="prune a node silent this long")
    departed_after_s: float = Field(
        default=3.0,
        gt=0,
        description="prune a node this long after its last heartbeat once the transport has closed its "
        "session (a kill, a crash): its instances are re-placed within seconds, not after node_timeout_s",
    )
    dispatch_wait_s: float = Field(
        default=90.0,
        gt=0,
        description="how long a request waits for a loading instance "
        "(keep it under the API's 120 s stream idle timeout)",
    )
    replace_retry_s: float = Field(
        default=600.0, gt=0, description="how long a lost instance waits for room to be re-placed"
    )
    memory_overhead: float | None = Field(
        default=None,
        ge=1.0,
        description="weights multiplier for every engine in placement admission; unset: each engine's "
        "measured multiplier and runtime bytes (docs/models.md), 1.25 for engines not measured",
    )
    memory_floor_mb: int = Field(default=256, ge=0)
    place_on_request: bool = Field(
        default=True,
        description="a request (any API) for a catalog model with no instance places it and waits for it "
        "(skulk_api_control.on_demand); false: a 404 saying to place it first",
    )
    keep_alive_s: float = Field(
        default=300.0,
        description="an instance placed because a request asked for it is removed after this long idle "
        "(Ollama's keep_alive; a request's own keep_alive wins; negative: never); default models and "
        "explicit placements stay until deleted",
    )


@hookimpl
def add_hookspecs(pm: Any) -> None:
    from . import hookspecs  # check_command: the master's veto, asked before it sequences a command

    pm.add_hookspecs(hookspecs)


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, MasterConfig)


@hookimpl
def register_planners(register: Callable[[Any], None]) -> None:
    from .planner import MemoryPlanner

    register(MemoryPlanner())


@hookimpl
async def startup(node: NodeSurface) -> None:
    from .sequencer import Master

    master = Master(node, node.plugin_config(PLUGIN) or MasterConfig())
    node.services.publish(MASTER, master)
    await master.attach()
    master.relay.attach()


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    """Every node drops a pruned node's readings, not only the master: otherwise each dead
    incarnation of a crash-looping node stays in every follower's telemetry (and `nodeHealth`)."""
    gone = event.event
    if isinstance(gone, NodeTimedOut) and gone.node_id != node.node_id:
        node.readings.forget(gone.node_id)
    master = node.services.get(MASTER)
    if master is not None:
        master.idle.note(event, before)  # every node: a new master knows when each instance was used


@hookimpl
async def on_master_changed(node: NodeSurface, master_node_id: str | None) -> None:
    master = node.services.get(MASTER)
    if master is not None:
        await master.on_master_changed(master_node_id)


@hookimpl
async def shutdown(node: NodeSurface) -> None:
    master = node.services.withdraw(MASTER)
    if master is not None:
        await master.stop()
        master.close()
