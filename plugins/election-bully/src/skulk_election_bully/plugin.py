"""Entry point of the bully election plugin.

This module is what the node imports; it stays light. The election itself lives in `election.py`
and is imported only when a node registers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from . import ELECTION

PLUGIN = "election-bully"


class BullyConfig(BaseModel):
    """`[plugins.election-bully]` in a profile. Every node of a cluster should use the same values."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    campaign_timeout_s: float = Field(
        default=1.0, gt=0, le=60, description="how long a round collects candidates before each node picks the best one"
    )
    heartbeat_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="how often every node speaks on ELECTION (master: announce; others: status)",
    )
    master_timeout_s: float = Field(
        default=3.0, gt=0, le=600, description="a master silent this long is presumed gone and a new round starts"
    )

    @model_validator(mode="after")
    def _timeouts_fit(self) -> BullyConfig:
        if self.master_timeout_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"master_timeout_s ({self.master_timeout_s}) must be at least twice heartbeat_s "
                f"({self.heartbeat_s}), or one late heartbeat deposes a healthy master"
            )
        return self


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, BullyConfig)


@hookimpl
def register_elections(register: Callable[[Any], None], node: NodeSurface) -> None:
    if node is None:  # inside a runner subprocess: no election
        return
    from .election import BullyElection

    election = BullyElection(node.plugin_config(PLUGIN) or BullyConfig())
    node.services.publish(ELECTION, election)  # diagnostics() for whoever wants to show it
    register(election)
