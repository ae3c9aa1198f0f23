"""Request parsing and wire encoding, without a node (fast)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from skulk_api_openai import chat, embeddings
from skulk_api_openai.requests import RequestError, parse_chat_request, parse_embeddings_request
from skulk_kernel.api import (
    Chunk,
    ErrorChunk,
    GenerationStats,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)

CMD = "cmd-1"


def body(**kwargs: Any) -> dict[str, Any]:
    return {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}], **kwargs}


# --- the plugin ----------------------------------------------------------------------------------


def test_entry_point_loads_without_heavy_imports() -> None:
    (ep,) = [e for e in entry_points(group="skulk.plugins") if e.name == "api-openai"]
    assert ep.value == "skulk_api_openai.plugin"
    code = (
        "import sys; import skulk_api_openai.plugin as p; "
        "assert hasattr(p, 'register_api_routes') and hasattr(p, 'register_config'); "
        "heavy = [m for m in ('fastapi', 'starlette', 'skulk_api_openai.routes') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- parsing -------------------------------------------------------------------------------------


def test_parse_normalizes_everything() -> None:
    req = parse_chat_request(
        body(
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"x": 1}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "r"},
            ],
            temperature=0,
            top_p=1,
            top_k=-1,
            min_p=0.1,
            seed=3,
            repetition_penalty=1.1,
            stop="END",
            max_tokens=10,
            max_completion_tokens=5,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
            enable_thinking=True,
            reasoning_effort="none",
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            tool_choice={"type": "function", "function": {"name": "f"}},
            user="u",
            metadata={"a": "b"},
        )
    )
    p = req.params
    assert p.messages[0].content == "a\nb"
    assert p.messages[2].content is None and p.messages[2].tool_calls[0].arguments == '{"x": 1}'
    assert p.messages[3].name == "f" and p.messages[3].tool_call_id == "c1"
    assert p.sampling.temperature == 0 and p.sampling.top_k is None and p.sampling.stop == ("END",)
    assert p.sampling.max_tokens == 5  # max_completion_tokens wins
    assert p.logprobs and p.top_logprobs == 2
    assert p.enable_thinking is True  # the explicit flag wins over reasoning_effort
    assert p.tools[0].name == "f" and p.tool_choice == "f"
    assert req.stream and req.include_usage and req.logprobs


def test_reasoning_effort_maps_to_thinking() -> None:
    assert parse_chat_request(body(reasoning_effort="none")).params.enable_thinking is False
    assert parse_chat_request(body(reasoning_effort="high")).params.enable_thinking is True
    assert parse_chat_request(body(chat_template_kwargs={"enable_thinking": False})).params.enable_thinking is False
    assert parse_chat_request(body()).params.enable_thinking is None


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stream": "true"}, "stream"),
        ({"stop": 3}, "stop"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
        ({"model": ""}, "model"),
    ],
)
def test_parse_rejects(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_chat_request(body(**patch))
    assert info.value.status == 400
    assert info.value.param == param


def test_parse_embeddings() -> None:
    req = parse_embeddings_request({"model": "m", "input": ["a", "b"]})
    assert req.params.inputs == ("a", "b") and req.encoding_format == "float"
    assert (
        parse_embeddings_request({"model": "m", "input": "a", "encoding_format": "base64"}).encoding_format == "base64"
    )
    for bad in ([1, 2], [[1, 2]], [], "", None, {"a": 1}):
        with pytest.raises(RequestError):
            parse_embeddings_request({"model": "m", "input": bad})
    with pytest.raises(RequestError):
        parse_embeddings_request({"model": "m", "input": "a", "encoding_format": "int8"})


# --- encoding ------------------------------------------------------------------------------------


async def _aiter(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for c in chunks:
        yield c


def _lp(token: str) -> tuple[TokenLogprob, ...]:
    return (TokenLogprob(token=token, logprob=-0.5, top_logprobs=(TopLogprob(token=token, logprob=-0.5),)),)


TEXT_CHUNKS: list[Chunk] = [
    TokenChunk(command_id=CMD, seq=0, text="think", reasoning=True),
    TokenChunk(command_id=CMD, seq=1, text="Hello", logprobs=_lp("Hello")),
    TokenChunk(command_id=CMD, seq=2, text=" world", logprobs=_lp(" world")),
    TokenChunk(
        command_id=CMD,
        seq=3,
        text="",
        finish_reason="length",
        usage=Usage(prompt_tokens=4, completion_tokens=3),
        stats=GenerationStats(prompt_tokens=4, generation_tokens=3, backend="x"),
    ),
]


def _encoder(**kwargs: Any) -> chat.ChatStreamEncoder:
    defaults: dict[str, Any] = dict(
        completion_id="chatcmpl-1",
        created=1,
        model="m",
        fingerprint="fp",
        want_logprobs=True,
        include_usage=True,
    )
    return chat.ChatStreamEncoder(**{**defaults, **kwargs})


async def _events(chunks: list[Chunk], **kwargs: Any) -> list[str]:
    return [e async for e in _encoder(**kwargs).events(_aiter(chunks))]


def test_stream_events_validate_as_sdk_chunks() -> None:
    events = asyncio.run(_events(TEXT_CHUNKS))
    assert events[-1] == chat.DONE
    assert events[-2].startswith(": generation_stats ")
    assert json.loads(events[-2][len(": generation_stats ") :])["generation_tokens"] == 3
    parsed = [ChatCompletionChunk.model_validate(json.loads(e[6:])) for e in events[:-2]]
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[0].choices[0].delta.content == ""
    assert json.loads(events[1][6:])["choices"][0]["delta"] == {"reasoning_content": "think"}
    assert "".join(c.choices[0].delta.content or "" for c in parsed if c.choices) == "Hello world"
    assert parsed[-2].choices[0].finish_reason == "length"
    assert json.loads(events[-4][6:])["choices"][0]["delta"] == {}
    assert parsed[-1].choices == [] and parsed[-1].usage is not None and parsed[-1].usage.total_tokens == 7
    assert {(c.id, c.created, c.model, c.system_fingerprint) for c in parsed} == {("chatcmpl-1", 1, "m", "fp")}
    lp = [
        t.token
        for c in parsed
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for t in c.choices[0].logprobs.content
    ]
    assert lp == ["Hello", " world"]


def test_stream_without_usage_and_with_tool_calls() -> None:
    calls = (
        ToolCall(id="call_a", name="f", arguments='{"a": 1}'),
        ToolCall(id="call_b", name="g", arguments="{}"),
    )
    events = asyncio.run(
        _events(
            [ToolCallChunk(command_id=CMD, seq=0, calls=calls, finish_reason="stop")],
            include_usage=False,
            want_logprobs=False,
        )
    )
    payloads = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert [p["choices"] for p in payloads if not p["choices"]] == []  # no usage chunk
    tool_delta = payloads[1]["choices"][0]["delta"]["tool_calls"]
    assert [t["index"] for t in tool_delta] == [0, 1]
    assert tool_delta[0] == {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }
    assert payloads[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_stream_error_chunk_ends_with_error_event() -> None:
    events = asyncio.run(
        _events(
            [
                TokenChunk(command_id=CMD, seq=0, text="partial"),
                ErrorChunk(command_id=CMD, seq=1, message="runner died", code="runner_failed"),
            ]
        )
    )
    assert events[-1].startswith("data: {")
    error = json.loads(events[-1][6:])["error"]
    assert error["message"] == "runner died" and error["code"] == "runner_failed"
    assert chat.DONE not in events


def test_completion_body_validates_as_sdk_type() -> None:
    got = asyncio.run(chat.collect(_aiter(TEXT_CHUNKS), True))
    out = chat.completion_body(
        got,
        completion_id="chatcmpl-1",
        created=1,
        model="m",
        fingerprint="fp",
        want_logprobs=True,
        with_stats=True,
    )
    parsed = ChatCompletion.model_validate(out)
    assert parsed.choices[0].message.content == "Hello world"
    assert parsed.choices[0].finish_reason == "length"
    assert out["choices"][0]["message"]["reasoning_content"] == "think"
    assert out["choices"][0]["message"]["refusal"] is None
    assert parsed.choices[0].logprobs is not None
    assert [t.token for t in parsed.choices[0].logprobs.content or []] == ["Hello", " world"]
    assert out["choices"][0]["logprobs"]["content"][0]["bytes"] == list(b"Hello")
    assert parsed.usage is not None and parsed.usage.total_tokens == 7
    assert out["generation_stats"]["backend"] == "x"


def test_completion_body_with_tool_calls() -> None:
    call = ToolCall(id="call_a", name="f", arguments='{"a": 1}')
    got = asyncio.run(
        chat.collect(_aiter([ToolCallChunk(command_id=CMD, seq=0, calls=(call,), finish_reason="tool_calls")]), False)
    )
    out = chat.completion_body(got, completion_id="c", created=1, model="m", fingerprint="fp", want_logprobs=False)
    msg = ChatCompletion.model_validate(out).choices[0].message
    assert msg.content is None and msg.tool_calls is not None
    assert msg.tool_calls[0].function.arguments == '{"a": 1}'
    assert out["choices"][0]["finish_reason"] == "tool_calls" and out["choices"][0]["logprobs"] is None
    assert out["usage"]["completion_tokens"] == 1  # no usage on the chunk: counted


def test_finish_reason_mapping() -> None:
    assert chat.finish_reason("cancelled", False) == "stop"
    assert chat.finish_reason("stop", True) == "tool_calls"
    assert chat.finish_reason("length", True) == "length"
    assert chat.finish_reason("content_filter", False) == "content_filter"


def test_error_status() -> None:
    assert chat.error_status(ErrorChunk(command_id=CMD, seq=0, message="x", code="context_length_exceeded")) == 400
    assert chat.error_status(ErrorChunk(command_id=CMD, seq=0, message="x", error_type="timeout")) == 504
    assert chat.error_status(ErrorChunk(command_id=CMD, seq=0, message="x", code="instance_not_ready")) == 503
    assert chat.error_status(ErrorChunk(command_id=CMD, seq=0, message="x")) == 500


def test_embeddings_base64_is_little_endian_float32() -> None:
    vectors = [(0.5, -1.0, 0.25), (1.0, 0.0, 0.0)]
    out = embeddings.embeddings_body(vectors, model="m", encoding_format="base64", prompt_tokens=2)
    raw = base64.b64decode(out["data"][0]["embedding"])
    assert struct.unpack("<3f", raw) == (0.5, -1.0, 0.25)
    parsed = CreateEmbeddingResponse.model_validate(
        embeddings.embeddings_body(vectors, model="m", encoding_format="float", prompt_tokens=2)
    )
    assert [d.index for d in parsed.data] == [0, 1] and parsed.usage.total_tokens == 2
