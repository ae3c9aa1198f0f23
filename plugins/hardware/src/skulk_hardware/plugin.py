"""Entry point of the hardware plugin: node facts, derived backends, conflicts in health, the doctor.

Imports nothing heavy: NVML (nvidia-ml-py) is loaded inside the probe, system_profiler and the
engines' device lists run in subprocesses, once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface, Profile

PLUGIN = "hardware"
HEALTH_EVERY_S = 2.0


class HardwareConfig(BaseModel):
    """`[plugins.hardware]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    backends: list[str] | None = Field(
        default=None, description="operator override of the backend tags; a tag the hardware cannot serve is a conflict"
    )


@hookimpl
def add_hookspecs(pm: Any) -> None:
    from . import hookspecs  # plugin_fits: the composer of the `auto` profile asks it (compose.py)

    pm.add_hookspecs(hookspecs)


def compose_profile(profile: Profile) -> Profile:
    """The kernel calls this for a profile whose `composer` is this plugin (`auto`)."""
    from .compose import compose_profile as compose

    return compose(profile)


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, HardwareConfig)


@hookimpl(trylast=True)  # after the engines' own probes, whose builds it reads
def probe_node(facts: dict[str, Any]) -> None:
    from .derive import derive_backends, find_conflicts
    from .detect import probe_hardware

    hw = probe_hardware(dict(facts.get("engine_builds", {})))
    facts["hardware"] = hw.model_dump(mode="json")
    facts["gpus"] = [g.model_dump(mode="json") for g in hw.gpus]
    facts["derived_backends"] = derive_backends(hw)
    facts["hardware_conflicts"] = find_conflicts(hw)


def _sync_health(node: NodeSurface) -> None:
    from .derive import find_conflicts
    from .facts import NodeHardware

    raw = node.facts.get("hardware")
    if raw is None:
        return
    config = node.plugin_config(PLUGIN) or HardwareConfig()
    conflicts = find_conflicts(NodeHardware.model_validate(raw), tuple(config.backends) if config.backends else None)
    if conflicts:
        node.health_notes[PLUGIN] = conflicts
    else:
        node.health_notes.pop(PLUGIN, None)


async def _health_loop(node: NodeSurface) -> None:
    while not node.stopping:
        _sync_health(node)
        await asyncio.sleep(HEALTH_EVERY_S)


@hookimpl
def startup(node: NodeSurface) -> None:
    node.spawn(_health_loop(node), "hardware-health")


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    @app.get("/v1/diagnostics/hardware")
    async def hardware() -> dict[str, Any]:
        """This node's hardware facts, derived backends and conflicts (the doctor's view)."""
        return {
            "nodeId": node.node_id,
            "hardware": node.facts.get("hardware"),
            "derivedBackends": node.facts.get("derived_backends", []),
            "conflicts": node.health_notes.get(PLUGIN, {}),
        }

    @app.get("/v1/diagnostics/clock")
    async def clock() -> dict[str, float]:
        """This node's wall clock, for the doctor's skew check across members."""
        return {"unixTime": time.time()}


@hookimpl
def register_cli_commands(cli: Any) -> None:
    from .cli import add_doctor_command
    from .service_cli import add_service_command

    add_doctor_command(cli)
    add_service_command(cli)
