"""The request bodies of the Ollama routes, for the OpenAPI document only (`openapi_extra`).

requests.py parses bodies by hand, because Ollama clients send loose JSON (`name` for `model`,
`format` as a string or a schema, options of any type) and must get `{"error": "..."}` back, never a
422. These models say what the routes read, so client generators and fuzzers see the fields.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class OllamaMessage(_Doc):
    role: str = Field(description="system, user, assistant or tool")
    content: str | None = None
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    images: list[str] | None = Field(default=None, description="base64-encoded images (vision models)")


class OllamaOptions(_Doc):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = Field(default=None, description="max tokens (-1: no limit)")
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | None = None


class _Generation(_Doc):
    model: str = Field(min_length=1)
    stream: bool | None = Field(default=None, description="NDJSON unless false")
    format: str | dict[str, Any] | None = Field(default=None, description='"json" or a JSON schema')
    options: OllamaOptions | None = None
    think: bool | str | None = None
    keep_alive: str | int | None = None
    tools: list[dict[str, Any]] | None = None


class OllamaChatIn(_Generation):
    """POST /api/chat."""

    messages: list[OllamaMessage] | None = Field(default=None, description="empty: load the model only")


class OllamaGenerateIn(_Generation):
    """POST /api/generate."""

    prompt: str | None = Field(default=None, description="empty: load the model only")
    system: str | None = None
    raw: bool | None = Field(default=None, description="send the prompt without the chat template")
    context: list[int] | None = Field(default=None, description="the previous answer's `context`")


class OllamaEmbedIn(_Doc):
    """POST /api/embed."""

    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool | None = None
    keep_alive: str | int | None = None


class OllamaEmbeddingsIn(_Doc):
    """POST /api/embeddings (legacy)."""

    model: str = Field(min_length=1)
    prompt: str


class OllamaShowIn(_Doc):
    """POST /api/show (`name` from older clients)."""

    model: str | None = None
    name: str | None = None
