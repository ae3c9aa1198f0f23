"""Request parsing and wire encoding, without a node (fast); encodings are checked with the SDK's types."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter
from skulk_api_anthropic import messages
from skulk_api_anthropic.requests import RequestError, estimate_tokens, parse_messages_request
from skulk_kernel.api import Chunk, ErrorChunk, TokenChunk, ToolCall, ToolCallChunk, Usage

CMD = "cmd-1"
EVENT = TypeAdapter(RawMessageStreamEvent)


def body(**kwargs: Any) -> dict[str, Any]:
    return {
        "model": "skulk/echo",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        **kwargs,
    }


def test_entry_point_loads_without_heavy_imports() -> None:
    (ep,) = [e for e in entry_points(group="skulk.plugins") if e.name == "api-anthropic"]
    assert ep.value == "skulk_api_anthropic.plugin"
    code = (
        "import sys; import skulk_api_anthropic.plugin as p; "
        "assert hasattr(p, 'register_api_routes') and hasattr(p, 'register_config'); "
        "heavy = [m for m in ('fastapi', 'starlette', 'skulk_api_anthropic.routes') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- parsing -------------------------------------------------------------------------------------


def test_parse_maps_every_block_kind() -> None:
    req = parse_messages_request(
        body(
            system=[
                {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "be kind"},
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "call the tool", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "and tomorrow?"},
                    ],
                },
            ],
            tools=[{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            tool_choice={"type": "any"},
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END", ""],
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata={"user_id": "u"},
            stream=True,
        )
    )
    p = req.params
    assert req.stream is True and req.model == "skulk/echo"
    roles = [m.role for m in p.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert p.messages[0].content == "be brief\nbe kind"
    assistant = p.messages[2]
    assert assistant.content == "Let me look." and assistant.reasoning_content == "call the tool"
    assert assistant.tool_calls[0].id == "toolu_1"
    assert json.loads(assistant.tool_calls[0].arguments) == {"city": "Paris"}
    tool = p.messages[3]
    assert (tool.content, tool.tool_call_id, tool.name) == ("sunny", "toolu_1", "get_weather")
    assert p.messages[4].content == "and tomorrow?"
    assert p.tools[0].name == "get_weather" and p.tools[0].parameters == {"type": "object"}
    assert p.tool_choice == "required"
    s = p.sampling
    # stop sequences are matched by the route (so the answer can name the one that hit), not the engine
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop) == (0.5, 0.9, 40, 64, ())
    assert req.stop_sequences == ("END",)
    assert p.enable_thinking is True


def test_parse_small_mappings() -> None:
    assert parse_messages_request(body(thinking={"type": "disabled"})).params.enable_thinking is False
    assert parse_messages_request(body()).params.enable_thinking is None
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    assert (
        parse_messages_request(body(tools=tools, tool_choice={"type": "tool", "name": "f"})).params.tool_choice == "f"
    )
    assert parse_messages_request(body(tools=tools, tool_choice={"type": "none"})).params.tool_choice == "none"
    assert parse_messages_request(body(temperature=1)).params.sampling.temperature == 1.0
    only_tool_use = parse_messages_request(
        body(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            ]
        )
    ).params.messages[1]
    assert only_tool_use.content is None and only_tool_use.tool_calls[0].arguments == "{}"
    # count_tokens bodies have no max_tokens
    assert (
        parse_messages_request(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]}, require_max_tokens=False
        ).params.sampling.max_tokens
        is None
    )


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (body(messages=[]), "messages"),
        (body(max_tokens=0), "max_tokens"),
        (body(max_tokens="10"), "max_tokens"),
        (body(temperature="hot"), "temperature"),
        (body(messages=[{"role": "system", "content": "x"}]), "messages.0.role"),
        (
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages.0.content.0.source",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "messages.0.content.0.type",
        ),
        (body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages.0.content.0.text"),
        (body(system=[{"type": "image"}]), "system.0"),
        (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools.0.type"),
        (body(tools=[{"name": "f"}]), "tools.0.input_schema"),
        (body(tool_choice={"type": "tool", "name": "missing"}), "tool_choice.name"),
        (body(tool_choice={"type": "sometimes"}), "tool_choice.type"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_parse_errors_name_the_field(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_messages_request(data)
    assert info.value.status == 400 and info.value.error_type == "invalid_request_error"
    assert needle in info.value.message


def test_estimate_is_positive_and_grows() -> None:
    short = parse_messages_request(body()).params
    long = parse_messages_request(body(messages=[{"role": "user", "content": "word " * 400}])).params
    assert 1 <= estimate_tokens(short) < estimate_tokens(long)


# --- encoding ------------------------------------------------------------------------------------


async def _aiter(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


MIXED: list[Chunk] = [
    TokenChunk(command_id=CMD, seq=0, text="hmm", reasoning=True),
    TokenChunk(command_id=CMD, seq=1, text=" ok", reasoning=True),
    TokenChunk(command_id=CMD, seq=2, text="Hello"),
    TokenChunk(command_id=CMD, seq=3, text=" there"),
    ToolCallChunk(
        command_id=CMD,
        seq=4,
        calls=(
            ToolCall(id="call_a", name="f", arguments='{"x": 1}'),
            ToolCall(id="call_b", name="g", arguments="not json"),
        ),
    ),
    TokenChunk(
        command_id=CMD,
        seq=5,
        text="",
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=11, completion_tokens=6),
    ),
]


def _parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, block
        events.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return events


def _stream_text(chunks: list[Chunk]) -> str:
    enc = messages.MessageStreamEncoder(message_id="msg_1", model="skulk/echo", input_estimate=3)

    async def run() -> str:
        return enc.message_start() + "".join([t async for t in enc.events(_aiter(chunks))])

    return _run(run())


def test_stream_events_follow_the_checklist_and_accumulate_in_the_sdk() -> None:
    events = _parse_sse(_stream_text(MIXED))
    for name, data in events:
        assert name == data["type"]  # A1
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"  # A2, A6
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 3
    # dense indices from 0, each block started before its deltas and stopped before the next (A3, A4)
    open_index = None
    starts = []
    for name, data in events:
        if name == "content_block_start":
            assert open_index is None
            open_index = data["index"]
            starts.append((data["index"], data["content_block"]["type"]))
        elif name == "content_block_delta":
            assert data["index"] == open_index and "type" in data["delta"]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert starts == [(0, "thinking"), (1, "text"), (2, "tool_use"), (3, "tool_use")]
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] == 6 and delta["usage"]["input_tokens"] == 11  # A5, A7

    snapshot = None
    bufs: dict[int, bytes] = {}
    for _, data in events:
        snapshot = accumulate_event(event=EVENT.validate_python(data), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    final = Message.model_validate(snapshot.model_dump())
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].thinking == "hmm ok"  # type: ignore[union-attr]
    assert final.content[1].text == "Hello there"  # type: ignore[union-attr]
    assert final.content[2].input == {"x": 1} and final.content[2].id == "toolu_a"  # type: ignore[union-attr]
    assert final.content[3].input == {"arguments": "not json"}  # type: ignore[union-attr]
    assert final.usage.input_tokens == 11 and final.usage.output_tokens == 6
    assert final.stop_reason == "tool_use"


def test_non_stream_body_matches_the_stream() -> None:
    got = _run(messages.collect(_aiter(MIXED)))
    out = Message.model_validate(messages.message_body(got, message_id="msg_1", model="m", input_estimate=3))
    assert [b.type for b in out.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert out.content[0].signature == ""  # type: ignore[union-attr]
    assert out.stop_reason == "tool_use" and out.stop_sequence is None
    assert out.usage.input_tokens == 11 and out.usage.output_tokens == 6
    assert out.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize(
    "reason, tools, expected",
    [
        ("stop", False, "end_turn"),
        ("length", False, "max_tokens"),
        ("tool_calls", True, "tool_use"),
        ("stop", True, "tool_use"),
        ("cancelled", False, "end_turn"),
        ("content_filter", False, "refusal"),
    ],
)
def test_stop_reasons(reason: str, tools: bool, expected: str) -> None:
    assert messages.stop_reason(reason, tools) == expected


def test_empty_answer_and_usage_fallbacks() -> None:
    chunks: list[Chunk] = [TokenChunk(command_id=CMD, seq=0, text="", finish_reason="stop")]
    events = _parse_sse(_stream_text(chunks))
    assert [n for n, _ in events] == ["message_start", "message_delta", "message_stop"]
    got = _run(messages.collect(_aiter(chunks)))
    body = messages.message_body(got, message_id="msg_1", model="m", input_estimate=7)
    assert body["content"] == [] and body["usage"]["input_tokens"] == 7 and body["usage"]["output_tokens"] == 0


def test_errors_mid_stream_are_error_events() -> None:
    chunks: list[Chunk] = [
        TokenChunk(command_id=CMD, seq=0, text="a"),
        ErrorChunk(command_id=CMD, seq=1, message="runner died"),
    ]
    events = _parse_sse(_stream_text(chunks))
    assert [n for n, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "error",
    ]
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "runner died"}}
    failed: list[Chunk] = [TokenChunk(command_id=CMD, seq=0, text="", finish_reason="error")]
    assert _parse_sse(_stream_text(failed))[-1][0] == "error"
    assert _run(messages.collect(_aiter(failed))).error is not None


def test_error_types_by_status() -> None:
    assert messages.error_type_for(400) == "invalid_request_error"
    assert messages.error_type_for(404) == "not_found_error"
    assert messages.error_type_for(413) == "request_too_large"
    assert messages.error_type_for(418) == "invalid_request_error"
    assert messages.error_type_for(500) == "api_error"
    assert messages.error_type_for(504) == "timeout_error"
    assert messages.PING == 'event: ping\ndata: {"type":"ping"}\n\n'


# --- the /v1/models dispatch middleware ----------------------------------------------------------


def test_models_dispatch_only_moves_anthropic_clients() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from skulk_api_anthropic.routes import AnthropicModelsDispatch

    app = FastAPI()

    @app.get("/v1/models")
    async def openai_models() -> dict[str, str]:
        return {"owner": "openai"}

    @app.get("/v1/models/{model_id:path}")
    async def openai_model(model_id: str) -> dict[str, str]:
        return {"owner": "openai", "id": model_id}

    @app.get("/anthropic/v1/models")
    async def anthropic_models() -> dict[str, str]:
        return {"owner": "anthropic"}

    @app.get("/anthropic/v1/models/{model_id:path}")
    async def anthropic_model(model_id: str) -> dict[str, str]:
        return {"owner": "anthropic", "id": model_id}

    @app.post("/v1/models")
    async def post_models() -> dict[str, str]:
        return {"owner": "post"}

    app.add_middleware(AnthropicModelsDispatch)
    with TestClient(app) as c:
        assert c.get("/v1/models").json() == {"owner": "openai"}
        assert c.get("/v1/models", headers={"authorization": "Bearer x"}).json() == {"owner": "openai"}
        assert c.get("/v1/models", headers={"anthropic-version": "2023-06-01"}).json() == {"owner": "anthropic"}
        assert c.get("/v1/models?limit=5", headers={"x-api-key": "k"}).json() == {"owner": "anthropic"}
        assert c.get("/v1/models/a/b", headers={"x-api-key": "k"}).json() == {"owner": "anthropic", "id": "a/b"}
        assert c.get("/v1/models/a/b").json() == {"owner": "openai", "id": "a/b"}
        assert c.post("/v1/models", headers={"x-api-key": "k"}).json() == {"owner": "post"}
        assert c.get("/v1/modelsx", headers={"x-api-key": "k"}).status_code == 404
