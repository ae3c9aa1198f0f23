"""Kernel chunks -> OpenAI `chat.completion` bodies and `chat.completion.chunk` SSE events.

Wire rules (see reference/api-wire-checklist.md 2.1-2.2): every stream chunk carries the same id,
created, model and system_fingerprint and `object: "chat.completion.chunk"`; the first delta is
`{role: "assistant", content: ""}`; a tool call is sent whole in one delta (index, id, type, name,
complete JSON-string arguments); the finish chunk has `delta: {}`; the usage chunk (only with
`stream_options.include_usage`) has `choices: []`; `: generation_stats {...}` comes before
`data: [DONE]`. The per-token path builds one small dict and one json.dumps per event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from skulk_api_control import wire_common
from skulk_api_control.wire_common import GENERATION_FAILED, SSE_KEEPALIVE, is_keepalive, token_counts
from skulk_kernel.api import (
    Chunk,
    ErrorChunk,
    GenerationStats,
    PrefillProgressChunk,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    Usage,
)

DONE = "data: [DONE]\n\n"
KEEPALIVE = SSE_KEEPALIVE
WIRE_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter"})


def finish_reason(reason: str | None, had_tool_calls: bool) -> str:
    """The kernel's finish reason as OpenAI spells it (`cancelled` only reaches a departed client)."""
    if had_tool_calls and reason in (None, "stop"):
        return "tool_calls"
    if reason in WIRE_FINISH:
        return reason  # type: ignore[return-value]
    return "stop"


def usage_dict(usage: Usage | None, fallback_completion: int) -> dict[str, int]:
    prompt, completion = token_counts(usage, fallback_completion)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stats_dict(stats: GenerationStats | None) -> dict[str, Any]:
    return stats.model_dump(mode="json") if stats is not None else {}


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": list(lp.bytes) if lp.bytes else list(lp.token.encode()),
        "top_logprobs": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.bytes) if t.bytes else list(t.token.encode()),
            }
            for t in lp.top_logprobs
        ],
    }


def tool_call_entry(call: ToolCall, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def error_body(
    message: str, error_type: str = "server_error", code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_status(chunk: ErrorChunk) -> int:
    """The HTTP status for an error that arrives before any byte of the response was sent (the shared
    rules, and 503 for an instance that is not ready, which OpenAI clients retry)."""
    status = wire_common.error_status(chunk)
    return 503 if status == 500 and chunk.code == "instance_not_ready" else status


# --- non-streaming -------------------------------------------------------------------------------


@dataclass
class Collected(wire_common.Collected):
    """Everything a non-streaming answer needs, gathered from the whole chunk stream."""

    want_logprobs: bool = False
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def add_token(self, chunk: TokenChunk) -> None:
        if chunk.text:
            (self.reasoning if chunk.reasoning else self.content).append(chunk.text)
        if self.want_logprobs and not chunk.reasoning:
            self.logprobs.extend(logprob_entry(lp) for lp in chunk.logprobs)

    def add_calls(self, calls: tuple[ToolCall, ...]) -> None:
        self.tool_calls.extend(calls)


async def collect(chunks: AsyncIterator[Chunk], want_logprobs: bool) -> Collected:
    return await wire_common.collect(Collected(want_logprobs=want_logprobs), chunks)


def completion_body(
    c: Collected,
    *,
    completion_id: str,
    created: int,
    model: str,
    fingerprint: str,
    want_logprobs: bool,
    with_stats: bool = False,
) -> dict[str, Any]:
    text = "".join(c.content)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if (text or not c.tool_calls) else None,
        "refusal": None,
        "annotations": [],
    }
    if c.reasoning:
        message["reasoning_content"] = "".join(c.reasoning)
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls
        ]
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": c.logprobs, "refusal": None} if want_logprobs else None,
                "finish_reason": finish_reason(c.finish_reason, bool(c.tool_calls)),
            }
        ],
        "usage": usage_dict(c.usage, c.tokens),
    }
    if with_stats:
        body["generation_stats"] = stats_dict(c.stats)
    return body


# --- streaming -----------------------------------------------------------------------------------


class ChatStreamEncoder:
    """Turns chunks into SSE text. One instance per response; `events()` drives a whole stream."""

    def __init__(
        self,
        *,
        completion_id: str,
        created: int,
        model: str,
        fingerprint: str,
        want_logprobs: bool,
        include_usage: bool,
    ) -> None:
        # Every chunk shares this prefix; only `choices` (and `usage`) differ per event.
        self._head = (
            "data: "
            + json.dumps(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": fingerprint,
                }
            )[:-1]
            + ', "choices": '
        )
        self.want_logprobs = want_logprobs
        self.include_usage = include_usage
        self.tool_index = 0
        self.tokens = 0

    def _choice(self, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> str:
        return (
            self._head
            + json.dumps([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])
            + "}\n\n"
        )

    def role(self) -> str:
        return self._choice({"role": "assistant", "content": ""})

    def token(self, chunk: TokenChunk) -> str:
        if not chunk.text:
            return ""
        self.tokens += 1
        if chunk.reasoning:
            return self._choice({"reasoning_content": chunk.text})
        logprobs = None
        if self.want_logprobs:
            logprobs = {"content": [logprob_entry(lp) for lp in chunk.logprobs], "refusal": None}
        return self._choice({"content": chunk.text}, logprobs)

    def tool_calls(self, chunk: ToolCallChunk) -> str:
        entries = []
        for call in chunk.calls:
            entries.append(tool_call_entry(call, self.tool_index))
            self.tool_index += 1
        self.tokens += len(chunk.calls)
        return self._choice({"tool_calls": entries}) if entries else ""

    def finish(self, reason: str | None) -> str:
        return self._choice({}, None, finish_reason(reason, self.tool_index > 0))

    def usage(self, usage: Usage | None) -> str:
        return self._head + '[], "usage": ' + json.dumps(usage_dict(usage, self.tokens)) + "}\n\n"

    @staticmethod
    def stats(stats: GenerationStats | None) -> str:
        return ": generation_stats " + json.dumps(stats_dict(stats)) + "\n\n"

    @staticmethod
    def error(message: str, error_type: str = "server_error", code: str | None = None) -> str:
        return "data: " + json.dumps(error_body(message, error_type, code)) + "\n\n"

    async def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[str]:
        """The role chunk, one event per content/tool chunk, then finish, usage, stats and [DONE].

        An error chunk ends the stream with a `data: {"error": ...}` event and no [DONE].
        """
        yield self.role()
        async for chunk in chunks:
            if isinstance(chunk, TokenChunk):
                if chunk.text:
                    yield self.token(chunk)
                elif is_keepalive(chunk):
                    yield KEEPALIVE
            elif isinstance(chunk, ToolCallChunk):
                line = self.tool_calls(chunk)
                if line:
                    yield line
            elif isinstance(chunk, ErrorChunk):
                yield self.error(chunk.message, chunk.error_type, chunk.code)
                return
            elif isinstance(chunk, PrefillProgressChunk):
                yield f": prefill_progress {chunk.processed}/{chunk.total}\n\n"
            if chunk.finish_reason is not None:
                if chunk.finish_reason == "error":
                    yield self.error(GENERATION_FAILED)
                    return
                yield self.finish(chunk.finish_reason)
                if self.include_usage:
                    yield self.usage(chunk.usage)
                yield self.stats(chunk.stats)
                yield DONE
                return
