"""The request bodies of the store's routes, for the OpenAPI document only.

The routes read their JSON by hand (routes.py, peer.py) and answer a bad body with the control API's
error shape and `code`; these models say what they read (`skulk_api_control.openapi_body`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AddModelBody(BaseModel):
    """POST /models/add: a local `path`, or a hub repository (`repo_id`, or `model`)."""

    model_config = ConfigDict(extra="allow")
    path: str | None = Field(default=None, description="a .gguf file or a folder with config.json on this node")
    model_id: str | None = Field(default=None, description="the id to list it under")
    repo_id: str | None = Field(default=None, description="a hub repository")
    revision: str | None = None
    file: str | None = Field(default=None, description="the GGUF file in the repository")
    download: bool = Field(default=True, description="start the download now")


class AddCardBody(BaseModel):
    """POST /models/add-card."""

    card: dict[str, Any] = Field(description="{model_id, n_layers, hidden_size, ...}")


class GrantBody(BaseModel):
    """POST /store/peer/grant (node to node)."""

    model_id: str
    requester: str
    stream: str
