"""The /api/chat wire format as a kernel `ApiAdapter` (`skulk_kernel.contracts`): the routes'
translation without HTTP, for tools and the skulk-testing conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from skulk_kernel.api import Chunk, TextGenerationParams

from . import wire
from .requests import RequestError, parse_chat


class OllamaChatAdapter:
    name = "ollama"

    def __init__(self, model: str = "") -> None:
        self.model = model

    def to_params(self, body: dict[str, Any]) -> TextGenerationParams:
        """An /api/chat body with messages -> params (RequestError for a caller mistake)."""
        req = parse_chat(body)
        if req.params is None:
            raise RequestError("messages: a chat with no messages is a load request, not a generation")
        return req.params

    async def stream(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Chunks -> the NDJSON bytes of a streamed chat, one record a line, ending with `done: true`."""
        encoder = wire.StreamEncoder(model=self.model, kind="chat", timing=wire.Timing())
        async for line in encoder.lines(chunks):
            yield line.encode()
