"""The plumbing the API adapters share (`requests_common`, `wire_common`, `adapter_routes.stream_body`).

The adapters' own tests check each wire format end to end; these pin the shared rules they rely on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import Field
from skulk_api_control.adapter_routes import stream_body
from skulk_api_control.dispatch import InferenceError
from skulk_api_control.requests_common import RequestError, StrictBody, invalid_field, parse_json_object, validate
from skulk_api_control.streaming import Dispatch
from skulk_api_control.wire_common import GENERATION_FAILED, Collected, collect, error_status
from skulk_kernel.api import Chunk, ErrorChunk, TokenChunk, ToolCall, ToolCallChunk, Usage

CMD = "cmd-1"


class _Coded(RequestError):
    empty_body = "no body"

    def __init__(self, message: str, *, status: int = 400, code: str = "x") -> None:
        super().__init__(message, status=status)
        self.code = code

    @classmethod
    def not_json(cls, message: str) -> _Coded:
        return cls(message, code="invalid_json")


class _Item(StrictBody):
    name: str = Field(min_length=1)


class _Body(StrictBody):
    items: list[_Item]
    n: int | None = None


async def _aiter(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def test_parse_json_object_raises_the_adapters_error_in_its_words() -> None:
    assert parse_json_object(b'{"a": 1}', _Coded) == {"a": 1}
    with pytest.raises(_Coded) as info:
        parse_json_object(b"  ", _Coded)
    assert info.value.message == "no body" and info.value.code == "invalid_json" and info.value.status == 400
    with pytest.raises(_Coded, match="not valid JSON"):
        parse_json_object(b"{", _Coded)
    with pytest.raises(_Coded, match="must be a JSON object, not list"):
        parse_json_object(b"[]", _Coded)
    assert _Coded.too_large("big").status == 413


def _message(data: dict[str, Any], *, brackets: bool) -> str:
    with pytest.raises(RequestError) as info:
        validate(_Body, data, lambda exc: RequestError(invalid_field(exc, brackets=brackets)[1]))
    return info.value.message


def test_invalid_field_spells_the_path_both_ways() -> None:
    assert _message({"items": [{"name": ""}], "extra": 1}, brackets=True).startswith("items[0].name: ")
    assert _message({"items": [{"name": ""}]}, brackets=False).startswith("items.0.name: ")
    assert _message({"items": [], "n": "1"}, brackets=False).startswith("n: ")  # strict: no coercion


def test_collect_counts_keeps_the_terminal_facts_and_turns_an_error_finish_into_an_error() -> None:
    class Texts(Collected):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []
            self.calls: list[ToolCall] = []

        def add_token(self, chunk: TokenChunk) -> None:
            self.texts.append(chunk.text)

        def add_calls(self, calls: tuple[ToolCall, ...]) -> None:
            self.calls.extend(calls)

    call = ToolCall(id="c", name="f", arguments="{}")
    chunks: list[Chunk] = [
        TokenChunk(command_id=CMD, seq=0, text="a"),
        TokenChunk(command_id=CMD, seq=1, text=""),
        ToolCallChunk(command_id=CMD, seq=2, calls=(call,)),
        TokenChunk(command_id=CMD, seq=3, text="b", finish_reason="length", usage=Usage(prompt_tokens=2)),
    ]
    got = asyncio.run(collect(Texts(), _aiter(chunks)))
    assert got.texts == ["a", "", "b"] and got.calls == [call] and got.tokens == 3
    assert got.finish_reason == "length" and got.usage is not None and got.error is None

    failed = asyncio.run(collect(Texts(), _aiter([TokenChunk(command_id=CMD, seq=0, text="", finish_reason="error")])))
    assert failed.error is not None and failed.error.message == GENERATION_FAILED
    assert error_status(failed.error) == 500
    assert error_status(ErrorChunk(command_id=CMD, seq=0, message="m", code="context_length_exceeded")) == 400


def _body(call: Any, **kwargs: Any) -> str:
    async def run() -> str:
        async def events(handle: Any) -> AsyncIterator[str]:
            yield "events"

        text = ""

        def failed(exc: InferenceError) -> str:
            return f"failed {exc.status} {exc.message}"

        async for piece in stream_body(Dispatch(call()), events, failed, **kwargs):
            text += piece
        return text

    return asyncio.run(run())


def test_stream_body_keepalives_then_a_late_error_as_the_formats_event() -> None:
    async def late() -> Any:
        await asyncio.sleep(0.05)
        raise InferenceError(400, "too long")

    text = _body(late, keepalive=": k\n", keepalive_s=0.01)
    assert text.startswith(": k\n: k\n") and text.endswith("failed 400 too long")
    assert _body(late, keepalive=": k\n", keepalive_s=0.01, head="head\n").startswith("head\n: k\n")


def test_stream_body_reports_an_unexpected_failure_as_a_500() -> None:
    async def broken() -> Any:
        raise RuntimeError("boom")

    assert _body(broken) == "failed 500 internal error: RuntimeError"


class _StartNode:
    """Just what `dispatch.start` touches: the real stream router and a post that records."""

    def __init__(self) -> None:
        from skulk_kernel.streams import StreamRouter

        self.streams = StreamRouter()
        self.posted: list[Any] = []

    async def post(self, command: Any) -> None:
        self.posted.append(command)


async def test_a_cancel_that_lands_with_the_first_chunk_cancels_the_start() -> None:
    """A client that leaves in the tick its first chunk arrives must cancel the task, not start a
    response nobody reads (Python 3.11's wait_for returned the chunk and dropped the cancel)."""
    from skulk_api_control.dispatch import start
    from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams
    from skulk_kernel.commands import CancelTask, TextGeneration

    node = _StartNode()
    params = TextGenerationParams(
        model_id="m", messages=(ChatMessage(role="user", content="hi"),), sampling=SamplingParams(max_tokens=4)
    )
    command = TextGeneration(command_id=CMD, owner_node_id="n1", params=params)  # type: ignore[arg-type]
    task = asyncio.ensure_future(start(node, command, observe=False))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)  # posted, waiting for the first chunk
    node.streams.deliver(TokenChunk(command_id=CMD, seq=0, text="a"))
    task.cancel()
    done, _ = await asyncio.wait((task,), timeout=2.0)
    assert done and task.cancelled(), "the cancel was lost: a response starts for a client that left"
    assert [type(c) for c in node.posted] == [TextGeneration, CancelTask]
    assert CMD not in node.streams.open_ids()
