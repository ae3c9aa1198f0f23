"""Kernel chunks -> Anthropic `message` bodies and Messages SSE events.

Wire rules (reference/api-wire-checklist.md 2.0 X2/X6 and 2.4 A1-A7):

* every SSE event is `event: <type>` + `data: {"type": "<type>", ...}` with the same name;
* `message_start` first, with `content: []` and a `usage` object; `ping` only while waiting for the
  first chunk, a `: keep-alive` comment for an engine's keep-alive after it (every client ignores it);
* content blocks get dense indices from 0 in start order; each block is started with its empty
  field (`text: ""`, `thinking: ""` + `signature: ""`, tool_use `input: {}` and `caller`), gets its
  deltas, and is
  stopped before the next one starts; a tool call is one block with its whole input as one
  `input_json_delta` (always a JSON object);
* `message_delta` carries `stop_reason`, `stop_sequence` and cumulative `usage` (input and output
  tokens, which the SDKs apply to the final message), then `message_stop` is last;
* an error after the stream started is `event: error` with `{"type": "error", "error": {...}}`.

A `tool_use` block always carries `caller: {"type": "direct"}` (the model called the tool itself):
the current specification requires the key and names that default, and the Vercel AI SDK accepts an
object there but refuses `"caller": null`. Fields the newest SDK types declare that nothing here can
fill are present as null: `diagnostics` (prompt-cache diagnostics) on the message, `speed` in usage.

Blocks are built in the order the chunks come (thinking, text and tool calls as the model produced
them), the same for streaming and non-streaming answers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from skulk_api_control import wire_common
from skulk_api_control.wire_common import (
    GENERATION_FAILED,
    SSE_KEEPALIVE,
    StopWatch,
    error_status,
    is_keepalive,
    token_counts,
    tool_arguments,
)
from skulk_kernel.api import Chunk, ErrorChunk, TokenChunk, ToolCall, ToolCallChunk, Usage

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type_for(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def stop_reason(reason: str | None, had_tool_calls: bool, stop_sequence: str | None = None) -> str:
    """The kernel's finish reason as Anthropic spells it (`stop_sequence` when the route's
    `StopWatch` matched one of the request's stop sequences)."""
    if stop_sequence is not None:
        return "stop_sequence"
    if had_tool_calls and reason in (None, "stop", "tool_calls"):
        return "tool_use"
    if reason == "length":
        return "max_tokens"
    if reason == "tool_calls":
        return "tool_use"
    if reason == "content_filter":
        return "refusal"
    return "end_turn"  # stop, and cancelled (only seen after POST /v1/cancel/{command_id})


#: who called a tool: always the model itself here (no server-side tools run code that calls tools)
DIRECT_CALLER = {"type": "direct"}


def tool_use_block(call: ToolCall, tool_input: dict[str, Any]) -> dict[str, Any]:
    """A `tool_use` content block (streamed ones start with `input: {}` and get it as one delta)."""
    return {
        "type": "tool_use",
        "id": tool_use_id(call.id),
        "name": call.name,
        "input": tool_input,
        "caller": dict(DIRECT_CALLER),
    }


def tool_use_id(call_id: str) -> str:
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def usage_counts(usage: Usage | None, input_estimate: int, counted: int) -> tuple[int, int]:
    """(input, output) tokens: the engine's, with the estimate for a prompt the engine did not count."""
    prompt, completion = token_counts(usage, counted)
    return prompt or input_estimate, completion


def usage_body(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": None,
        "server_tool_use": None,
        "service_tier": None,
        "inference_geo": None,
        "output_tokens_details": None,
        "speed": None,
    }


def error_body(error_type: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def sse(event_type: str, data: dict[str, Any]) -> str:
    return f"event: {event_type}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_event(error_type: str, message: str) -> str:
    return sse("error", error_body(error_type, message))


PING = sse("ping", {"type": "ping"})


# --- non-streaming -------------------------------------------------------------------------------


@dataclass
class Collected(wire_common.Collected):
    """The content blocks in the order the chunks came."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    had_tool_calls: bool = False

    def add_token(self, chunk: TokenChunk) -> None:
        if chunk.text:
            self.add_text("thinking" if chunk.reasoning else "text", chunk.text)

    def add_calls(self, calls: tuple[ToolCall, ...]) -> None:
        for call in calls:
            self.blocks.append(tool_use_block(call, tool_arguments(call)))
        self.had_tool_calls = self.had_tool_calls or bool(calls)

    def add_text(self, kind: str, text: str) -> None:
        key = "thinking" if kind == "thinking" else "text"
        if self.blocks and self.blocks[-1]["type"] == kind:
            self.blocks[-1][key] += text
        elif kind == "thinking":
            self.blocks.append({"type": "thinking", "thinking": text, "signature": ""})
        else:
            self.blocks.append({"type": "text", "text": text, "citations": None})


async def collect(chunks: AsyncIterator[Chunk]) -> Collected:
    return await wire_common.collect(Collected(), chunks)


def message_body(
    c: Collected, *, message_id: str, model: str, input_estimate: int, stop_sequence: str | None = None
) -> dict[str, Any]:
    input_tokens, output_tokens = usage_counts(c.usage, input_estimate, c.tokens)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": c.blocks,
        "stop_reason": stop_reason(c.finish_reason, c.had_tool_calls, stop_sequence),
        "stop_sequence": stop_sequence,
        "stop_details": None,
        "container": None,
        "diagnostics": None,
        "usage": usage_body(input_tokens, output_tokens),
    }


# --- streaming -----------------------------------------------------------------------------------


class MessageStreamEncoder:
    """Turns chunks into Anthropic SSE text; one instance per response."""

    def __init__(self, *, message_id: str, model: str, input_estimate: int, stops: StopWatch | None = None) -> None:
        self.message_id = message_id
        self.stops = stops or StopWatch(())
        self.model = model
        self.input_estimate = input_estimate
        self.index = -1
        self.open: str | None = None  # the type of the block now open
        self.tokens = 0
        self.had_tool_calls = False

    def message_start(self) -> str:
        return sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "stop_details": None,
                    "container": None,
                    "diagnostics": None,
                    # The prompt is counted by the engine, which reports it at the end: this is an
                    # estimate; message_delta carries the engine's count and the SDKs keep that one.
                    "usage": usage_body(self.input_estimate, 0),
                },
            },
        )

    def _close_block(self) -> str:
        if self.open is None:
            return ""
        self.open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _start_block(self, block: dict[str, Any]) -> str:
        out = self._close_block()
        self.index += 1
        self.open = block["type"]
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def token(self, chunk: TokenChunk) -> str:
        if not chunk.text:
            return ""
        self.tokens += 1
        out = ""
        if chunk.reasoning:
            if self.open != "thinking":
                out = self._start_block({"type": "thinking", "thinking": "", "signature": ""})
            delta: dict[str, Any] = {"type": "thinking_delta", "thinking": chunk.text}
        else:
            if self.open != "text":
                out = self._start_block({"type": "text", "text": "", "citations": None})
            delta = {"type": "text_delta", "text": chunk.text}
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def tool_calls(self, chunk: ToolCallChunk) -> str:
        out = []
        for call in chunk.calls:
            self.had_tool_calls = True
            self.tokens += 1
            out.append(self._start_block(tool_use_block(call, {})))
            out.append(
                sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool_arguments(call))},
                    },
                )
            )
            out.append(self._close_block())
        return "".join(out)

    def finish(self, reason: str | None, usage: Usage | None) -> str:
        input_tokens, output_tokens = usage_counts(usage, self.input_estimate, self.tokens)
        matched = self.stops.matched
        return (
            self._close_block()
            + sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(reason, self.had_tool_calls, matched),
                        "stop_sequence": matched,
                        "stop_details": None,
                    },
                    "usage": {
                        "input_tokens": input_tokens,
                        "output_tokens": output_tokens,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            )
            + sse("message_stop", {"type": "message_stop"})
        )

    async def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[str]:
        """Everything after message_start, ending with message_stop (or an error event)."""
        async for chunk in self.stops.watch(chunks):
            if isinstance(chunk, ErrorChunk):
                yield self._close_block() + error_event(
                    "invalid_request_error" if error_status(chunk) == 400 else "api_error", chunk.message
                )
                return
            if isinstance(chunk, TokenChunk):
                text = self.token(chunk)
                if text:
                    yield text
                elif is_keepalive(chunk):  # work that shows nothing yet: bytes for proxies, ignored by SDKs
                    yield SSE_KEEPALIVE
            elif isinstance(chunk, ToolCallChunk):
                yield self.tool_calls(chunk)
            if chunk.finish_reason is not None:
                if chunk.finish_reason == "error":
                    yield self._close_block() + error_event("api_error", GENERATION_FAILED)
                    return
                yield self.finish(chunk.finish_reason, chunk.usage)
                return
