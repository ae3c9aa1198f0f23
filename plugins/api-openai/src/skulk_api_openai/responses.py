"""Kernel chunks -> OpenAI Responses API objects (`response`) and SSE events (`response.*`).

Wire rules (reference/api-wire-checklist.md 2.0 and 2.3):

* Every SSE event is `event: <type>` + `data: {"type": <type>, ..., "sequence_number": n}` with `n`
  increasing from 0; there is no `data: [DONE]` (X1).
* Lifecycle: `response.created` first (R1) and `response.in_progress`, both with `output: []`; then
  per output item `response.output_item.added` (R3) before its content events, text items get
  `response.content_part.added` (R4) before their deltas, every content event carries `item_id`,
  `output_index` and `content_index` (R5); `*.done` events and `response.output_item.done` repeat
  the item's identity (R6); the final `response.completed` (or `response.incomplete` on truncation)
  carries the full `output` list with the same item ids (R7, R8) and the usage. The response id is
  the same in every lifecycle event (R2).
* Function calls are whole: `output_item.added` with `arguments: ""`, one
  `function_call_arguments.delta` with the complete JSON, `function_call_arguments.done`,
  `output_item.done`.
* Reasoning chunks become `reasoning` items with `reasoning_text` content
  (`response.reasoning_text.delta` / `.done`).
* An error after the stream started is an `error` event (flat `code`/`message`/`param` as the API
  reference documents, plus the nested `error` object the live API sends and the Python SDK raises
  `APIError` on), then `response.failed` with `response.error`.

The same state machine builds the non-streaming body (`emit=False` skips the event text), so both
answers have exactly the same items. The per-token path is one json.dumps of the token text.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from skulk_api_control.wire_common import GENERATION_FAILED, SSE_KEEPALIVE, failed_chunk, is_keepalive, token_counts
from skulk_kernel.api import Chunk, ErrorChunk, PrefillProgressChunk, TokenChunk, ToolCall, ToolCallChunk, Usage

from .chat import logprob_entry  # Responses logprobs have Chat's shape
from .responses_requests import ResponsesRequest

# codes the SDK's `ResponseError.code` accepts; any other code is reported as server_error there
_RESPONSE_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt"})


def sse(event_type: str, body: dict[str, Any]) -> str:
    """One SSE event; `body` already carries `type` and `sequence_number`."""
    return f"event: {event_type}\ndata: {json.dumps(body)}\n\n"


class ResponsesEncoder:
    """One response: consumes the kernel's chunks, keeps the output items, writes the SSE events.

    Drive it with `events()` (streaming) or `collect()` (non-streaming), then `response()` is the
    final object. Item ids derive from the command id, so they are stable across the lifecycle.
    """

    def __init__(
        self,
        req: ResponsesRequest,
        *,
        command_id: str,
        created_at: int,
        model: str,
        emit: bool = True,
    ) -> None:
        self.req = req
        self.response_id = f"resp_{command_id}"
        self._id_stem = command_id.replace("-", "")
        self.created_at = created_at
        self.model = model
        self.emit = emit
        self.seq = 0
        self.output: list[dict[str, Any] | None] = []  # None marks the item still open
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.completed_at: int | None = None
        self.usage: Usage | None = None
        self.tokens = 0
        self.reasoning_tokens = 0
        # the open text item (a message or a reasoning item)
        self._kind: str | None = None
        self._item_id = ""
        self._index = -1
        self._parts: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._delta_head = ""

    # --- the response object ---------------------------------------------------------------------

    def response(self, *, final: bool = True) -> dict[str, Any]:
        """The `response` object; `final=False` is the snapshot of created/in_progress (no output yet)."""
        req = self.req
        usage = None
        if final and self.status != "in_progress":
            usage = self.usage_dict()
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": False,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "model": self.model,
            "output": [item for item in self.output if item is not None] if final else [],
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": None,
            "prompt_cache_key": None,
            "reasoning": dict(req.reasoning),
            "safety_identifier": None,
            "service_tier": "default",
            "store": False,
            "temperature": req.temperature,
            "text": {"format": req.text_format or {"type": "text"}, "verbosity": "medium"},
            "tool_choice": req.tool_choice,
            "tools": [dict(t) for t in req.tools],
            "top_logprobs": req.top_logprobs,
            "top_p": req.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": dict(req.metadata),
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
        }

    def usage_dict(self) -> dict[str, Any]:
        prompt, completion = token_counts(self.usage, self.tokens)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(self.reasoning_tokens, completion)},
            "total_tokens": prompt + completion,
        }

    # --- events ----------------------------------------------------------------------------------

    def _event(self, event_type: str, body: dict[str, Any]) -> str:
        if not self.emit:
            return ""
        seq = self.seq
        self.seq += 1
        return sse(event_type, {"type": event_type, **body, "sequence_number": seq})

    def start(self) -> str:
        """`response.created` and `response.in_progress`."""
        snapshot = self.response(final=False)
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.in_progress", {"response": snapshot}
        )

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._id_stem}_{len(self.output)}"

    def _open(self, kind: str) -> str:
        self._kind = kind
        self._index = len(self.output)
        self._parts = []
        self._logprobs = []
        if kind == "message":
            self._item_id = self._new_id("msg")
            item: dict[str, Any] = {
                "type": "message",
                "id": self._item_id,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            delta_type = "response.output_text.delta"
        else:
            self._item_id = self._new_id("rs")
            item = {
                "type": "reasoning",
                "id": self._item_id,
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part = {"type": "reasoning_text", "text": ""}
            delta_type = "response.reasoning_text.delta"
        self.output.append(None)
        # the constant head of every delta event of this item; the delta and sequence follow
        self._delta_head = (
            f"event: {delta_type}\ndata: "
            + json.dumps(
                {
                    "type": delta_type,
                    "item_id": self._item_id,
                    "output_index": self._index,
                    "content_index": 0,
                }
            )[:-1]
        )
        return self._event("response.output_item.added", {"output_index": self._index, "item": item}) + self._event(
            "response.content_part.added",
            {"item_id": self._item_id, "output_index": self._index, "content_index": 0, "part": part},
        )

    def _close(self, status: str) -> str:
        """Finish the open text item (if any) with `status`; its final form goes into `output`."""
        kind = self._kind
        if kind is None:
            return ""
        self._kind = None
        text = "".join(self._parts)
        where = {"item_id": self._item_id, "output_index": self._index, "content_index": 0}
        if kind == "message":
            part: dict[str, Any] = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": self._logprobs,
            }
            item: dict[str, Any] = {
                "type": "message",
                "id": self._item_id,
                "status": status,
                "role": "assistant",
                "content": [part],
            }
            done = self._event("response.output_text.done", {**where, "text": text, "logprobs": self._logprobs})
        else:
            part = {"type": "reasoning_text", "text": text}
            item = {
                "type": "reasoning",
                "id": self._item_id,
                "summary": [],
                "content": [part],
                "status": status,
            }
            done = self._event("response.reasoning_text.done", {**where, "text": text})
        self.output[self._index] = item
        return (
            done
            + self._event("response.content_part.done", {**where, "part": part})
            + self._event("response.output_item.done", {"output_index": self._index, "item": item})
        )

    def token(self, chunk: TokenChunk) -> str:
        """The per-token path: one delta event (opening an item first when the kind changes)."""
        text = chunk.text
        if not text:
            return ""
        kind = "reasoning" if chunk.reasoning else "message"
        head = ""
        if kind != self._kind:
            head = self._close("completed") + self._open(kind)
        self._parts.append(text)
        self.tokens += 1
        logprobs = ""
        if chunk.reasoning:
            self.reasoning_tokens += 1
        elif self.req.logprobs and chunk.logprobs:
            entries = [logprob_entry(lp) for lp in chunk.logprobs]
            self._logprobs.extend(entries)
            logprobs = json.dumps(entries)
        if not self.emit:
            return ""
        seq = self.seq
        self.seq += 1
        if kind == "message":
            logprobs = ', "logprobs": ' + (logprobs or "[]")
        return (
            head
            + self._delta_head
            + ', "delta": '
            + json.dumps(text)
            + logprobs
            + ', "sequence_number": '
            + str(seq)
            + "}\n\n"
        )

    def tool_calls(self, calls: tuple[ToolCall, ...]) -> str:
        out = self._close("completed")
        for call in calls:
            index = len(self.output)
            item_id = self._new_id("fc")
            item: dict[str, Any] = {
                "type": "function_call",
                "id": item_id,
                "call_id": call.id,
                "name": call.name,
                "arguments": "",
                "status": "in_progress",
            }
            final = {**item, "arguments": call.arguments, "status": "completed"}
            self.output.append(final)
            self.tokens += 1
            out += (
                self._event("response.output_item.added", {"output_index": index, "item": item})
                + self._event(
                    "response.function_call_arguments.delta",
                    {"item_id": item_id, "output_index": index, "delta": call.arguments},
                )
                + self._event(
                    "response.function_call_arguments.done",
                    {
                        "item_id": item_id,
                        "output_index": index,
                        "name": call.name,
                        "arguments": call.arguments,
                    },
                )
                + self._event("response.output_item.done", {"output_index": index, "item": final})
            )
        return out

    def finish(self, reason: str | None, usage: Usage | None) -> str:
        """Close the open item and end with `response.completed` or `response.incomplete`."""
        self.usage = usage
        self.completed_at = int(time.time())
        if reason == "length":
            self.status = "incomplete"
            self.incomplete_details = {"reason": "max_output_tokens"}
        elif reason == "content_filter":
            self.status = "incomplete"
            self.incomplete_details = {"reason": "content_filter"}
        else:  # stop, tool_calls, and `cancelled` (POST /v1/cancel ends the stream normally, as Chat does)
            self.status = "completed"
        out = self._close(self.status)
        terminal = "response.completed" if self.status == "completed" else "response.incomplete"
        return out + self._event(terminal, {"response": self.response()})

    def fail(self, message: str, error_type: str = "server_error", code: str | None = None) -> str:
        """An error after the stream started: the open item ends incomplete; `error`, `response.failed`."""
        out = self._close("incomplete")
        self.status = "failed"
        self.error = {"code": code if code in _RESPONSE_ERROR_CODES else "server_error", "message": message}
        nested = {"type": error_type, "code": code, "message": message, "param": None}
        return (
            out
            + self._event("error", {"code": code, "message": message, "param": None, "error": nested})
            + self._event("response.failed", {"response": self.response()})
        )

    def chunk(self, chunk: Chunk) -> tuple[str, bool]:
        """The events for one chunk, and whether the response has ended."""
        if isinstance(chunk, TokenChunk):
            out = self.token(chunk) if chunk.text else SSE_KEEPALIVE if self.emit and is_keepalive(chunk) else ""
        elif isinstance(chunk, ToolCallChunk):
            out = self.tool_calls(chunk.calls)
        elif isinstance(chunk, ErrorChunk):
            return self.fail(chunk.message, chunk.error_type, chunk.code), True
        elif isinstance(chunk, PrefillProgressChunk):
            out = f": prefill_progress {chunk.processed}/{chunk.total}\n\n" if self.emit else ""
        else:
            out = ""
        if chunk.finish_reason is None:
            return out, False
        if chunk.finish_reason == "error":
            return out + self.fail(GENERATION_FAILED), True
        return out + self.finish(chunk.finish_reason, chunk.usage), True

    async def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[str]:
        """The whole SSE stream after `response.created`/`in_progress` (see `start`)."""
        async for chunk in chunks:
            out, ended = self.chunk(chunk)
            if out:
                yield out
            if ended:
                return
        # the chunk stream ended with no terminal chunk: never leave the client hanging
        yield self.fail("the stream ended without a final chunk")

    async def collect(self, chunks: AsyncIterator[Chunk]) -> ErrorChunk | None:
        """Consume the whole stream for a non-streaming answer; the error chunk if it failed."""
        async for chunk in chunks:
            if isinstance(chunk, ErrorChunk):
                self.chunk(chunk)
                return chunk
            self.chunk(chunk)
            if chunk.finish_reason is not None:
                return failed_chunk(chunk) if chunk.finish_reason == "error" else None
        return None
