"""The Messages wire format as a kernel `ApiAdapter` (`skulk_kernel.contracts`): the routes' translation
without HTTP, for tools and the skulk-testing conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from skulk_kernel.api import Chunk, TextGenerationParams, new_id

from .messages import MessageStreamEncoder
from .requests import estimate_tokens, parse_messages_request


class AnthropicAdapter:
    name = "anthropic"

    def __init__(self, model: str = "") -> None:
        self.model = model

    def to_params(self, body: dict[str, Any]) -> TextGenerationParams:
        """A /v1/messages body -> params (RequestError for a caller mistake)."""
        return parse_messages_request(body).params

    async def stream(
        self, chunks: AsyncIterator[Chunk], params: TextGenerationParams | None = None
    ) -> AsyncIterator[bytes]:
        """Chunks -> the SSE bytes of a streamed message, message_start to message_stop."""
        encoder = MessageStreamEncoder(
            message_id=f"msg_{new_id()}",
            model=self.model,
            input_estimate=estimate_tokens(params) if params is not None else 1,
        )
        yield encoder.message_start().encode()
        async for text in encoder.events(chunks):
            yield text.encode()
