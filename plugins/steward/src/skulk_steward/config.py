"""`[plugins.steward]` in a profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:  # the service imports the tools, which import this module
    from .service import StewardService

PLUGIN = "steward"
STEWARD: ServiceKey[StewardService] = ServiceKey(PLUGIN)  # the per-node service (private to this plugin)
ROLE = "steward"
MODEL_REF = "skulk/steward"


class StewardConfig(BaseModel):
    """Every field has a default, so the plugin works without a table."""

    model_config = ConfigDict(extra="forbid")
    models: list[str] = Field(
        default_factory=lambda: ["Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"],
        description="preference list of tool-capable cards: the first one that the cluster can place is the steward",
    )
    place: Literal["at_start", "on_first_use"] = Field(
        default="at_start",
        description="at_start: the master keeps a steward placed from the start; on_first_use: only after the "
        "first request for skulk/steward (profile auto: a first run downloads nothing it does not serve)",
    )
    keeper_interval_s: float = Field(default=1.0, gt=0, description="how often the master checks the invariant")
    canary_interval_s: float = Field(default=60.0, gt=0, description="how often the master runs the self-test")
    canary_timeout_s: float = Field(default=60.0, gt=0)
    canary_failures_to_replace: int = Field(default=3, ge=1)
    proposal_ttl_s: float = Field(default=600.0, gt=0, description="a proposal expires this long after it is made")
    max_pending: int = Field(default=32, ge=1)
    keep_outcomes: int = Field(default=128, ge=1)
    max_tool_calls: int = Field(default=8, ge=1, le=32)
    max_tokens: int = Field(default=384, ge=16, description="per model step of a turn")
    reconcile_after_s: float = Field(
        default=5.0,
        gt=0,
        description="a dispatched action whose effect is missing "
        "this long (or from an earlier master) is issued once more",
    )
    docs_dir: str | None = Field(
        default=None, description="the docs the search tool reads (default: the checkout's docs/)"
    )
