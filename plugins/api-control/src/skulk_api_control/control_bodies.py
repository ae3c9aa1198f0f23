"""The request bodies of the control routes, for the OpenAPI document (`openapi_body.body_schema`).

The routes read their JSON by hand (routes.py) and answer a bad body with the control API's own
error shape and `code`; these models say what they read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class PlaceInstanceBody(BaseModel):
    """POST /place_instance."""

    model_config = ConfigDict(extra="allow")
    model_id: str = Field(min_length=1, description="a catalog id or a unique suffix (GET /models)")
    sharding: Literal["Pipeline", "Tensor"] = "Pipeline"
    instance_meta: str = Field(default="MlxRing", description="MlxRing (the only kind)")
    min_nodes: int = Field(default=1, ge=1)
    replicas: int = Field(default=1, ge=1, le=16)
    excluded_nodes: list[str] = []
    context_tokens: int | None = Field(default=None, ge=1)
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16"


class CreateInstanceBody(BaseModel):
    """POST /instance: a tagged instance (`{"MlxRingInstance": {...}}`), or the same under `instance`."""

    model_config = ConfigDict(extra="allow")
    instance: dict[str, Any] = Field(description="the tagged instance, as GET /state shows instances")


class TracingBody(BaseModel):
    """PUT /v1/tracing."""

    enabled: bool
