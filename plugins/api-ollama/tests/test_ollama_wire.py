"""Request parsing and NDJSON encoding, without a node (fast); records are checked with the client's types."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from ollama import ChatResponse, GenerateResponse
from skulk_api_ollama import context, wire
from skulk_api_ollama.requests import (
    RequestError,
    parse_chat,
    parse_embed,
    parse_embeddings,
    parse_generate,
    parse_json_object,
)
from skulk_kernel.api import Chunk, ErrorChunk, GenerationStats, TokenChunk, ToolCall, ToolCallChunk, Usage

CMD = "cmd-1"


def chat(**kwargs: Any) -> dict[str, Any]:
    return {"model": "echo:latest", "messages": [{"role": "user", "content": "hi"}], **kwargs}


def test_entry_point_loads_without_heavy_imports() -> None:
    (ep,) = [e for e in entry_points(group="skulk.plugins") if e.name == "api-ollama"]
    assert ep.value == "skulk_api_ollama.plugin"
    code = (
        "import sys; import skulk_api_ollama.plugin as p; "
        "assert hasattr(p, 'register_api_routes') and hasattr(p, 'register_config'); "
        "heavy = [m for m in ('fastapi', 'starlette', 'skulk_api_ollama.routes') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- parsing -------------------------------------------------------------------------------------


def test_chat_streams_by_default_and_maps_options() -> None:
    req = parse_chat(
        chat(
            options={
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 0,
                "min_p": 0.05,
                "seed": 7,
                "num_predict": 12,
                "stop": "END",
                "repeat_penalty": 1.1,
                "presence_penalty": 0.5,
                "frequency_penalty": 0.25,
                "num_ctx": 8192,
                "mirostat": 0,
            },
            think="high",
            keep_alive="5m",
            format="json",
            tools=[],
        )
    )
    assert req.stream is True and req.model == "echo:latest" and req.params is not None
    s = req.params.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.max_tokens, s.stop) == (
        0.2,
        0.9,
        None,
        0.05,
        7,
        12,
        ("END",),
    )
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.1, 0.5, 0.25)
    assert req.params.enable_thinking is True
    assert req.params.tools == ()  # O13: the Python client always sends "tools": []
    assert parse_chat(chat(stream=False)).stream is False
    assert parse_chat(chat(options={"num_predict": -1})).params.sampling.max_tokens is None  # type: ignore[union-attr]
    assert parse_chat(chat(think=False)).params.enable_thinking is False  # type: ignore[union-attr]


def test_chat_tool_history_gets_ids_and_names() -> None:
    req = parse_chat(
        chat(
            messages=[
                {"role": "system", "content": "s"},
                {"role": "user", "content": "weather in Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": "",
                    "thinking": "two calls",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
                    ],
                },
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
                {"role": "tool", "content": "rainy"},
            ],
            tools=[
                {
                    "type": "function",
                    "function": {"name": "get_weather", "description": "w", "parameters": {"type": "object"}},
                }
            ],
        )
    )
    assert req.params is not None
    msgs = req.params.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
    calls = msgs[2].tool_calls
    assert [c.id for c in calls] == ["call_2_0", "call_2_1"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert msgs[2].content is None and msgs[2].reasoning_content == "two calls"
    assert (msgs[3].tool_call_id, msgs[3].name) == ("call_2_0", "get_weather")
    assert (msgs[4].tool_call_id, msgs[4].name) == ("call_2_1", "get_weather")
    assert req.params.tools[0].name == "get_weather"


def test_load_requests_and_generate() -> None:
    assert parse_chat({"model": "m"}).params is None
    assert parse_chat({"model": "m", "messages": []}).params is None
    assert parse_generate({"model": "m"}).params is None
    gen = parse_generate({"model": "m", "prompt": "p", "system": "s", "stream": False})
    assert gen.stream is False and gen.params is not None
    assert [(m.role, m.content) for m in gen.params.messages] == [("system", "s"), ("user", "p")]
    assert gen.params.raw_prompt is None
    raw = parse_generate({"model": "m", "prompt": "<|im_start|>p", "system": "ignored", "raw": True})
    assert raw.params is not None and raw.params.raw_prompt == "<|im_start|>p"


def test_embedding_bodies() -> None:
    model, params = parse_embed({"model": "e", "input": "one"})
    assert model == "e" and params.inputs == ("one",)
    assert parse_embed({"model": "e", "input": ["a", "b"]})[1].inputs == ("a", "b")
    assert parse_embeddings({"model": "e", "prompt": "x"}) == ("e", "x")
    assert parse_embeddings({"model": "e"}) == ("e", "")


@pytest.mark.parametrize(
    "fn, data, needle",
    [
        (parse_chat, {"messages": []}, "model is required"),
        (parse_chat, chat(model=5), "model"),
        (parse_chat, chat(messages="hi"), "messages"),
        (parse_chat, chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (parse_chat, chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (parse_chat, chat(messages=[{"role": "assistant", "content": "x", "images": ["aGk="]}]), "images"),
        (parse_chat, chat(messages=[{"role": "user", "content": "x", "images": [5]}]), "images"),
        (parse_chat, chat(options={"temperature": "hot"}), "options.temperature"),
        (parse_chat, chat(options={"temperature": -1}), "options.temperature"),
        (parse_chat, chat(options={"num_predict": 1.5}), "options.num_predict"),
        (parse_chat, chat(options={"stop": [1]}), "options.stop"),
        (parse_chat, chat(options=[1]), "options"),
        (parse_chat, chat(stream="yes"), "stream"),
        (parse_chat, chat(think="very"), "think"),
        (parse_chat, chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
        (parse_generate, {"model": "m", "prompt": 5}, "prompt"),
        (parse_embed, {"model": "e"}, "input"),
        (parse_embed, {"model": "e", "input": [1, 2]}, "input"),
        (parse_embed, {"model": "e", "input": ""}, "input"),
    ],
)
def test_parse_errors(fn: Any, data: dict[str, Any], needle: str) -> None:
    with pytest.raises(RequestError) as info:
        fn(data)
    assert info.value.status == 400 and needle in info.value.message


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b"\xff"])
def test_bad_json(body: bytes) -> None:
    with pytest.raises(RequestError):
        parse_json_object(body)


# --- encoding ------------------------------------------------------------------------------------


async def _aiter(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


FINAL = TokenChunk(
    command_id=CMD,
    seq=9,
    text="",
    finish_reason="stop",
    usage=Usage(prompt_tokens=7, completion_tokens=4),
    stats=GenerationStats(generation_tokens=4, generation_tps=100.0, ttft_ms=3.0),
)
MIXED: list[Chunk] = [
    TokenChunk(command_id=CMD, seq=0, text="hmm", reasoning=True),
    TokenChunk(command_id=CMD, seq=1, text="Hello"),
    TokenChunk(command_id=CMD, seq=2, text=" there"),
    ToolCallChunk(command_id=CMD, seq=3, calls=(ToolCall(id="call_a", name="f", arguments='{"x": 1}'),)),
    FINAL,
]


def _lines(kind: str, chunks: list[Chunk]) -> list[str]:
    enc = wire.StreamEncoder(model="echo:latest", kind=kind, timing=wire.Timing())

    async def run() -> list[str]:
        return [t async for t in enc.lines(_aiter(chunks))]

    return asyncio.run(run())


def test_chat_ndjson_records() -> None:
    lines = _lines("chat", MIXED)
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)  # O1
    records = [json.loads(line) for line in lines]
    parsed = [ChatResponse.model_validate(r) for r in records]
    assert all("content" in r["message"] for r in records)  # O3
    assert [p.done for p in parsed] == [False, False, False, False, True]
    assert parsed[0].message.thinking == "hmm" and parsed[0].message.content == ""
    assert "".join(p.message.content or "" for p in parsed) == "Hello there"
    call = parsed[3].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "f" and call.function.arguments == {"x": 1}  # O4
    final = records[-1]
    assert final["done_reason"] == "stop" and final["prompt_eval_count"] == 7 and final["eval_count"] == 4
    assert final["prompt_eval_duration"] == 3_000_000 and final["eval_duration"] == 40_000_000
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(final[key], int) and final[key] > 0  # O6
    assert parsed[0].created_at and parsed[0].created_at.endswith("Z")  # O5


def test_generate_ndjson_records() -> None:
    chunks: list[Chunk] = [
        TokenChunk(command_id=CMD, seq=0, text="a"),
        TokenChunk(command_id=CMD, seq=1, text=" b"),
        TokenChunk(
            command_id=CMD,
            seq=2,
            text="",
            finish_reason="length",
            usage=Usage(prompt_tokens=2, completion_tokens=2),
        ),
    ]
    records = [json.loads(line) for line in _lines("generate", chunks)]
    parsed = [GenerateResponse.model_validate(r) for r in records]
    assert "".join(p.response for p in parsed) == "a b"  # type: ignore[misc]
    assert records[-1]["response"] == "" and records[-1]["done_reason"] == "length"
    assert records[-1]["context"] and all(isinstance(t, int) for t in records[-1]["context"])


def test_the_wait_ends_at_the_first_chunk_with_output() -> None:
    """Keep-alives (work that shows nothing yet) are part of the wait, not of generation: without
    engine timings, prompt_eval runs to the first token and eval from it."""
    timing = wire.Timing()

    async def chunks() -> AsyncIterator[Chunk]:
        yield TokenChunk(command_id=CMD, seq=0, text="")  # a keep-alive at once
        await asyncio.sleep(0.2)
        yield TokenChunk(command_id=CMD, seq=1, text="Hi")
        yield TokenChunk(command_id=CMD, seq=2, text="", finish_reason="stop")

    got = asyncio.run(wire.collect(chunks(), timing))
    body = wire.chat_body(got, model="m", timing=timing)
    assert body["prompt_eval_duration"] >= 200_000_000 > body["eval_duration"], body


def test_error_mid_stream_is_an_error_line() -> None:
    lines = _lines(
        "chat",
        [TokenChunk(command_id=CMD, seq=0, text="a"), ErrorChunk(command_id=CMD, seq=1, message="boom")],
    )
    assert json.loads(lines[-1]) == {"error": "boom"}
    lines = _lines("chat", [TokenChunk(command_id=CMD, seq=0, text="", finish_reason="error")])
    assert "error" in json.loads(lines[-1])


def test_non_stream_bodies() -> None:
    timing = wire.Timing()
    got = asyncio.run(wire.collect(_aiter(MIXED), timing))
    body = ChatResponse.model_validate(wire.chat_body(got, model="m", timing=timing))
    assert body.done and body.message.content == "Hello there" and body.message.thinking == "hmm"
    assert body.message.tool_calls[0].function.arguments == {"x": 1}  # type: ignore[index]
    gen = GenerateResponse.model_validate(wire.generate_body(got, model="m", timing=timing))
    assert gen.response == "Hello there"
    assert context.decode(gen.context) == [("assistant", "Hello there")]
    assert ChatResponse.model_validate(wire.load_body("m", "chat")).done_reason == "load"
    assert GenerateResponse.model_validate(wire.load_body("m", "generate")).response == ""


def test_bad_tool_arguments_are_still_an_object() -> None:
    assert wire.tool_arguments(ToolCall(id="c", name="f", arguments="nope")) == {"arguments": "nope"}
    assert wire.tool_arguments(ToolCall(id="c", name="f", arguments="")) == {}


# --- the `/` liveness middleware -----------------------------------------------------------------


def test_root_liveness_leaves_a_dashboard_its_browsers() -> None:
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse
    from fastapi.testclient import TestClient
    from skulk_api_ollama.routes import RUNNING, OllamaRoot

    bare = FastAPI()
    bare.add_middleware(OllamaRoot)
    with TestClient(bare) as c:
        assert c.get("/", headers={"accept": "text/html"}).text == RUNNING  # no dashboard: still alive
        assert c.head("/").status_code == 200
        assert c.get("/ollama").text == RUNNING

    app = FastAPI()

    @app.get("/")
    async def dashboard() -> HTMLResponse:
        return HTMLResponse("<html>dashboard</html>")

    app.add_middleware(OllamaRoot)
    with TestClient(app) as c:
        assert "dashboard" in c.get("/", headers={"accept": "text/html,application/xhtml+xml"}).text
        assert c.get("/", headers={"accept": "*/*"}).text == RUNNING
        assert c.get("/ollama/", headers={"accept": "text/html"}).text == RUNNING
