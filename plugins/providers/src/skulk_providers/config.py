"""`[plugins.providers]` in a profile, and the plugin's service key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:
    from .service import ProviderService

PLUGIN = "providers"
NAMESPACE = "skulk.extensions"  # the entry-point group extensions are found in (pluggy's is skulk.plugins)
DISABLE_ENV = "SKULK_EXTENSIONS_DISABLE"
PROVIDERS: ServiceKey[ProviderService] = ServiceKey(PLUGIN)


class ProvidersConfig(BaseModel):
    """Every field has a default: with no table, every installed extension is loaded."""

    model_config = ConfigDict(extra="forbid")
    extensions: list[str] | Literal["all"] = Field(
        default="all", description='entry-point names in skulk.extensions to load, or "all" installed ones'
    )
    first_party: bool = Field(
        default=True,
        description="offer tts, stt, stt.realtime and vad @1.0.0 over the speech plugin where this node loads it",
    )
    call_timeout_s: float = Field(default=30.0, gt=0, description="a call's deadline when the caller names none")
    max_timeout_s: float = Field(default=600.0, gt=0, description="the longest deadline a caller may ask for")
    max_payload_bytes: int = Field(default=1 << 20, ge=1024, description="cap on one input or output message")
    max_concurrent_calls: int = Field(default=16, ge=1, description="calls served at once on this node; then 429")
    discovery_timeout_s: float = Field(default=3.0, gt=0, description="how long a node's descriptors are awaited")
