"""Reading the kernel's chunk stream the same way for every wire format (no format is written here).

Each adapter's encoder (api-openai's chat and responses, api-anthropic's messages, api-ollama's wire)
spells its own bodies and events. What they all need to *read* from the chunks is the same, and
lives here so it cannot drift between formats:

* `error_status`: the HTTP status for an error chunk that came before any byte was sent;
* `tool_arguments`: a tool call's JSON-string arguments as the object Anthropic's `input` and
  Ollama's `arguments` must be;
* `token_counts`: the engine's prompt/completion counts, or the adapter's own count of what it sent;
* `Collected` + `collect`: the non-streaming answer's pass over the chunks (stop at an error chunk,
  count tokens, keep the terminal chunk's finish reason, usage and stats, turn a `finish_reason:
  "error"` into an ErrorChunk); each adapter subclasses `Collected` to keep the text and calls its
  body needs;
* `collect_embeddings`: the vectors and prompt tokens of an embedding call;
* `StopWatch`: stop sequences matched on the API side, for formats that must say which one ended
  the answer (Anthropic's `stop_reason: "stop_sequence"` + `stop_sequence`), which the kernel's
  terminal chunk cannot say.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from skulk_kernel.api import (
    Chunk,
    EmbeddingChunk,
    ErrorChunk,
    GenerationStats,
    TokenChunk,
    ToolCall,
    ToolCallChunk,
    Usage,
)

__all__ = [
    "GENERATION_FAILED",
    "SSE_KEEPALIVE",
    "Collected",
    "CollectedEmbeddings",
    "StopWatch",
    "collect",
    "collect_embeddings",
    "error_status",
    "failed_chunk",
    "is_keepalive",
    "token_counts",
    "tool_arguments",
]

log = logging.getLogger(__name__)
GENERATION_FAILED = "the generation failed"  # a terminal chunk with `finish_reason: "error"`
C = TypeVar("C", bound="Collected")


def error_status(chunk: ErrorChunk) -> int:
    """The HTTP status for an error chunk that arrives before any byte of the response was sent."""
    if chunk.code in ("context_length_exceeded", "invalid_request") or chunk.error_type == "invalid_request_error":
        return 400
    if chunk.error_type == "timeout" or chunk.code == "idle_timeout":
        return 504
    return 500


def tool_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as a JSON object (`{"arguments": raw}` when the model wrote something else)."""
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    log.warning("tool call %s has arguments that are not a JSON object: %.200s", call.name, call.arguments)
    return {"arguments": call.arguments}


def token_counts(usage: Usage | None, counted: int) -> tuple[int, int]:
    """(prompt, completion) tokens: the engine's when it reported usage, else (0, what was counted)."""
    if usage is None:
        return 0, counted
    return usage.prompt_tokens, usage.completion_tokens


#: an SSE comment: every client ignores it (wire checklist X3), every proxy between sees bytes
SSE_KEEPALIVE = ": keep-alive\n\n"


def is_keepalive(chunk: Chunk) -> bool:
    """An engine's keep-alive: an empty TokenChunk sent while work goes on that shows nothing yet (a
    tool call being written, a request queued in the engine). SSE adapters pass it on as
    `SSE_KEEPALIVE`, so a proxy's or client's read timeout (nginx's default is 60 s) does not cut a
    stream the node knows is alive."""
    return (
        isinstance(chunk, TokenChunk)
        and not chunk.text
        and not chunk.logprobs
        and not chunk.token_ids
        and chunk.finish_reason is None
    )


def failed_chunk(chunk: Chunk) -> ErrorChunk:
    """The ErrorChunk standing for a terminal chunk whose finish reason is `error`."""
    return ErrorChunk(command_id=chunk.command_id, seq=chunk.seq, message=GENERATION_FAILED, error_type="server_error")


@dataclass
class Collected:
    """What a non-streaming answer learns from the whole chunk stream; subclasses keep the content.

    `add_token` sees every token chunk (text or not: logprobs may come without text) and
    `add_calls` every batch of tool calls; `tokens` is counted here either way.
    """

    tokens: int = 0
    finish_reason: str | None = None
    usage: Usage | None = None
    stats: GenerationStats | None = None
    error: ErrorChunk | None = None

    def add_token(self, chunk: TokenChunk) -> None:
        """Keep what the body needs of one token chunk."""

    def add_calls(self, calls: tuple[ToolCall, ...]) -> None:
        """Keep what the body needs of a batch of tool calls."""


async def collect(out: C, chunks: AsyncIterator[Chunk]) -> C:
    """Consume the chunks into `out`; stops at an error chunk (kept in `out.error`)."""
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            out.error = chunk
            break
        if isinstance(chunk, TokenChunk):
            if chunk.text:
                out.tokens += 1
            out.add_token(chunk)
        elif isinstance(chunk, ToolCallChunk):
            out.tokens += len(chunk.calls)
            out.add_calls(chunk.calls)
        if chunk.finish_reason is not None:
            if chunk.finish_reason == "error":
                out.error = failed_chunk(chunk)
            out.finish_reason = chunk.finish_reason
            out.usage = chunk.usage
            out.stats = chunk.stats
    return out


@dataclass
class CollectedEmbeddings:
    vectors: list[tuple[float, ...]] = field(default_factory=list)
    prompt_tokens: int = 0
    error: ErrorChunk | None = None


async def collect_embeddings(chunks: AsyncIterator[Chunk]) -> CollectedEmbeddings:
    """The vectors in input order and the prompt tokens; stops at an error chunk."""
    out = CollectedEmbeddings()
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            out.error = chunk
            break
        if isinstance(chunk, EmbeddingChunk):
            out.vectors.extend(chunk.embeddings)
        if chunk.usage is not None:
            out.prompt_tokens = chunk.usage.prompt_tokens
    return out


class StopWatch:
    """Stop sequences matched here instead of in the engine, so the answer can name the one that hit.

    The engine is sent no stop strings; `watch(chunks)` passes the text on, holding back a tail that
    could be the start of a stop string, and at the first match cuts the text before it, sets
    `matched`, and ends the stream with a terminal `finish_reason: "stop"` chunk of its own. The
    caller's handle then sees an unfinished task and cancels it when it closes (the engine stops
    within a token or two). Reasoning text is never matched (stop sequences apply to the answer).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.matched: str | None = None
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._tail = ""

    def _find(self, text: str) -> tuple[int, str] | None:
        hits = [(text.find(s), s) for s in self.stops if s in text]
        return min(hits) if hits else None

    async def watch(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        if not self.stops:
            async for chunk in chunks:
                yield chunk
            return
        async for chunk in chunks:
            if isinstance(chunk, TokenChunk) and not chunk.reasoning:
                text = self._tail + chunk.text
                hit = self._find(text)
                if hit is not None:
                    self.matched = hit[1]
                    if hit[0]:
                        yield chunk.model_copy(update={"text": text[: hit[0]], "finish_reason": None})
                    yield TokenChunk(command_id=chunk.command_id, seq=chunk.seq, text="", finish_reason="stop")
                    return
                keep = self._hold if chunk.finish_reason is None else 0
                self._tail = text[len(text) - keep :] if keep and len(text) > keep else (text if keep else "")
                out = text[: len(text) - len(self._tail)]
                if out or chunk.finish_reason is not None or chunk.logprobs or is_keepalive(chunk):
                    yield chunk.model_copy(update={"text": out})
                continue
            if self._tail and (chunk.finish_reason is not None or isinstance(chunk, ToolCallChunk)):
                yield TokenChunk(command_id=chunk.command_id, seq=chunk.seq, text=self._tail)
                self._tail = ""
            yield chunk
