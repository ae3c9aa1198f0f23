"""Kernel chunks -> Ollama `/api/chat` and `/api/generate` records (NDJSON lines or one JSON body).

Wire rules (reference/api-wire-checklist.md 2.5 O1-O8):

* NDJSON: exactly one JSON object per line, `\\n`-terminated, nothing else (no blank lines, no
  keep-alive comments: the Python client parses every line);
* `created_at` is an RFC 3339 string;
* chat records always carry `message: {role, content}` (`content: ""` on thinking, tool-call and
  final records); generate records always carry `response`;
* tool calls are `{id, function: {index, name, arguments: {object}}}`;
* non-final records have `done: false`; the final one has `done: true`, `done_reason` and the
  counters and durations (nanosecond ints), generate's also `context` (the conversation so far,
  which continues it when sent back: see `context.py`);
* an error after the stream started is a `{"error": "text"}` line, then the stream ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from skulk_api_control import wire_common
from skulk_api_control.wire_common import GENERATION_FAILED, is_keepalive, token_counts, tool_arguments
from skulk_kernel.api import (
    Chunk,
    ErrorChunk,
    GenerationStats,
    PrefillProgressChunk,
    TokenChunk,
    ToolCall,
    ToolCallChunk,
    Usage,
)

from . import context


def _is_raw(turns: tuple[tuple[str, str], ...]) -> bool:
    return bool(turns) and turns[-1][0] == "raw"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def done_reason(reason: str | None) -> str:
    """Ollama says `length` for a max-tokens stop and `stop` for everything else (tool calls too)."""
    return "length" if reason == "length" else "stop"


def tool_call_entry(call: ToolCall, index: int) -> dict[str, Any]:
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": tool_arguments(call)}}


@dataclass
class Timing:
    """Clock readings for the final record's durations (nanoseconds, perf counter)."""

    start_ns: int = field(default_factory=time.perf_counter_ns)
    first_ns: int = 0
    end_ns: int = 0

    def first(self, chunk: Chunk) -> None:
        """The first chunk that carries output; keep-alives and a long prompt's progress are the wait."""
        if not self.first_ns and not is_keepalive(chunk) and not isinstance(chunk, PrefillProgressChunk):
            self.first_ns = time.perf_counter_ns()

    def end(self) -> None:
        self.end_ns = time.perf_counter_ns()


def counters(timing: Timing, usage: Usage | None, stats: GenerationStats | None, tokens: int) -> dict[str, int]:
    """The final record's counts and durations.

    total: request received -> last chunk. prompt_eval: the engine's time to first token when it
    reports one, else request -> first chunk. eval: the engine's generated tokens over its tokens/s
    when reported, else first chunk -> last chunk. load: what is left of the time before the first
    chunk (dispatch, queueing). Every duration is at least 1 ns (clients treat 0 as "missing").
    """
    end = timing.end_ns or time.perf_counter_ns()
    first = timing.first_ns or end
    total = end - timing.start_ns
    waited = first - timing.start_ns
    prompt_eval = int(stats.ttft_ms * 1e6) if stats and stats.ttft_ms > 0 else waited
    if stats and stats.generation_tps > 0 and stats.generation_tokens > 0:
        eval_ns = int(stats.generation_tokens / stats.generation_tps * 1e9)
    else:
        eval_ns = end - first
    load = waited - prompt_eval
    prompt_tokens, completion_tokens = token_counts(usage, tokens)
    return {
        "total_duration": max(total, 1),
        "load_duration": max(load, 1),
        "prompt_eval_count": prompt_tokens,
        "prompt_eval_duration": max(prompt_eval, 1),
        "eval_count": completion_tokens,
        "eval_duration": max(eval_ns, 1),
    }


@dataclass
class Collected(wire_common.Collected):
    content: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add_token(self, chunk: TokenChunk) -> None:
        if chunk.text:
            (self.thinking if chunk.reasoning else self.content).append(chunk.text)

    def add_calls(self, calls: tuple[ToolCall, ...]) -> None:
        self.tool_calls.extend(calls)


async def _timed(chunks: AsyncIterator[Chunk], timing: Timing) -> AsyncIterator[Chunk]:
    async for chunk in chunks:
        timing.first(chunk)
        yield chunk


async def collect(chunks: AsyncIterator[Chunk], timing: Timing) -> Collected:
    out = await wire_common.collect(Collected(), _timed(chunks, timing))
    timing.end()
    return out


def chat_body(c: Collected, *, model: str, timing: Timing) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(c.content)}
    if c.thinking:
        message["thinking"] = "".join(c.thinking)
    if c.tool_calls:
        message["tool_calls"] = [tool_call_entry(call, i) for i, call in enumerate(c.tool_calls)]
    return {
        "model": model,
        "created_at": now_rfc3339(),
        "message": message,
        "done": True,
        "done_reason": done_reason(c.finish_reason),
        **counters(timing, c.usage, c.stats, c.tokens),
    }


def generate_body(
    c: Collected, *, model: str, timing: Timing, turns: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "created_at": now_rfc3339(), "response": "".join(c.content)}
    if c.thinking:
        body["thinking"] = "".join(c.thinking)
    return {
        **body,
        "done": True,
        "done_reason": done_reason(c.finish_reason),
        "context": context.encode([*turns, ("raw" if _is_raw(turns) else "assistant", "".join(c.content))]),
        **counters(timing, c.usage, c.stats, c.tokens),
    }


def load_body(model: str, kind: str) -> dict[str, Any]:
    """The answer to a chat with no messages / a generate with no prompt: Ollama's "load" reply."""
    head: dict[str, Any] = {"model": model, "created_at": now_rfc3339()}
    if kind == "chat":
        head["message"] = {"role": "assistant", "content": ""}
    else:
        head["response"] = ""
    return {**head, "done": True, "done_reason": "load"}


class StreamEncoder:
    """Chunks -> NDJSON lines for `/api/chat` (kind "chat") or `/api/generate` (kind "generate")."""

    def __init__(self, *, model: str, kind: str, timing: Timing, turns: tuple[tuple[str, str], ...] = ()) -> None:
        self.turns = turns
        self.answer: list[str] = []
        self.model = model
        self.chat = kind == "chat"
        self.timing = timing
        self.tokens = 0
        self.tool_index = 0

    def _record(
        self, content: str = "", thinking: str | None = None, tool_calls: list[dict[str, Any]] | None = None
    ) -> str:
        obj: dict[str, Any] = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking is not None:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            obj["message"] = message
        else:
            obj["response"] = content
            if thinking is not None:
                obj["thinking"] = thinking
        obj["done"] = False
        return line(obj)

    def token(self, chunk: TokenChunk) -> str:
        if not chunk.text:
            return ""
        self.tokens += 1
        if chunk.reasoning:
            return self._record(thinking=chunk.text)
        if not self.chat:
            self.answer.append(chunk.text)
        return self._record(chunk.text)

    def tool_calls(self, chunk: ToolCallChunk) -> str:
        if not chunk.calls or not self.chat:  # /api/generate sends no tools, so gets no calls
            return ""
        entries = []
        for call in chunk.calls:
            entries.append(tool_call_entry(call, self.tool_index))
            self.tool_index += 1
        self.tokens += len(chunk.calls)
        return self._record(tool_calls=entries)

    def final(self, chunk: Chunk) -> str:
        self.timing.end()
        obj: dict[str, Any] = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            obj["message"] = {"role": "assistant", "content": ""}
        else:
            obj["response"] = ""
        obj["done"] = True
        obj["done_reason"] = done_reason(chunk.finish_reason)
        if not self.chat:
            obj["context"] = context.encode(
                [*self.turns, ("raw" if _is_raw(self.turns) else "assistant", "".join(self.answer))]
            )
        obj.update(counters(self.timing, chunk.usage, chunk.stats, self.tokens))
        return line(obj)

    async def lines(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[str]:
        async for chunk in chunks:
            self.timing.first(chunk)
            if isinstance(chunk, ErrorChunk):
                yield line({"error": chunk.message})
                return
            if isinstance(chunk, TokenChunk):
                text = self.token(chunk)
                if text:
                    yield text
            elif isinstance(chunk, ToolCallChunk):
                text = self.tool_calls(chunk)
                if text:
                    yield text
            if chunk.finish_reason is not None:
                if chunk.finish_reason == "error":
                    yield line({"error": GENERATION_FAILED})
                    return
                yield self.final(chunk)
                return
