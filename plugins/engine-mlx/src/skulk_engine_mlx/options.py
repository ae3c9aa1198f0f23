"""Engine options: the profile's ``[plugins.engine-mlx]`` table, overridden per model by the card.

Why two sources: the profile sets node-wide defaults (pinning, prefill chunk), while a card's
``[runtime]`` section may ask for a quantized KV cache for that one model (``kv_bits = 8``) so an
operator can trade accuracy for memory per instance without a new profile.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import ModelCard


class MlxConfig(BaseModel):
    """`[plugins.engine-mlx]` in a profile; `[runtime]` of a card overrides the KV fields."""

    model_config = ConfigDict(extra="forbid")
    pin_ranks: bool = Field(
        default=True,
        description="pin ranks that share a host to distinct cores (the ring backend busy-waits)",
    )
    kv_bits: int | None = Field(default=None, description="quantize the KV cache to 4 or 8 bits")
    kv_group_size: int = Field(default=64, ge=16, description="group size of the quantized KV cache")
    max_kv_size: int | None = Field(default=None, ge=64, description="rotating KV cache of this many tokens")
    prefill_step: int = Field(default=512, ge=16, description="prompt tokens per forward pass")
    dtype: str | None = Field(default=None, description="cast float weights (float32, bfloat16, float16)")


_RUNTIME_KEYS = ("kv_bits", "kv_group_size", "max_kv_size", "dtype")


def resolve_options(options: dict[str, Any], card: ModelCard) -> MlxConfig:
    """The profile's table plus the card's ``[runtime]`` overrides, validated."""
    merged = {k: v for k, v in options.items() if k in MlxConfig.model_fields}
    runtime = card.sections.get("runtime", {})
    merged.update({k: runtime[k] for k in _RUNTIME_KEYS if k in runtime})
    config = MlxConfig.model_validate(merged)
    if config.kv_bits is not None and config.kv_bits not in (2, 3, 4, 6, 8):
        raise ValueError(f"kv_bits must be one of 2, 3, 4, 6, 8 (got {config.kv_bits})")
    return config
