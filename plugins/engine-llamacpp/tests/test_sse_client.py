"""The server client's SSE -> event mapping, against canned llama.cpp responses (no model).

The canned chunks copy the shapes llama.cpp's server produced on this machine (xllamacpp
2026.10.11549), including native tool_calls deltas and the mid-stream error it sends when a
model's output does not match the template's tool-call format.
"""

from __future__ import annotations

import json

import httpcore
import httpx
import pytest
from skulk_engine_llamacpp.events import (
    BackendError,
    ContextLengthExceeded,
    Finish,
    TextDelta,
    ToolCallDelta,
    Working,
)
from skulk_engine_llamacpp.server_backend import LlamaServer


def sse(*chunks: dict | str) -> bytes:
    lines = []
    for c in chunks:
        lines.append("data: " + (c if isinstance(c, str) else json.dumps(c)) + "\n\n")
    return "".join(lines).encode()


def delta(**d) -> dict:
    return {"choices": [{"index": 0, "finish_reason": None, "delta": d}]}


class RecStream(httpcore.MockStream):
    """A mock socket that records what the client wrote."""

    def __init__(self, buffer: list[bytes], sink: list[bytes]) -> None:
        super().__init__(buffer)
        self.sink = sink

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.sink.append(buffer)


class RecBackend(httpcore.MockBackend):
    def __init__(self, buffer: list[bytes], sink: list[bytes]) -> None:
        super().__init__(buffer)
        self.sink = sink

    def connect_tcp(self, *args, **kwargs) -> RecStream:
        return RecStream(list(self._buffer), self.sink)


def fake_server(status: int, body: bytes, tool_mode="native", json_handler=None):
    """A LlamaServer whose stream replies with the raw HTTP (status, body); requests recorded."""
    server = LlamaServer("/nonexistent.gguf")
    server.tool_mode = tool_mode
    server.base_url = "http://127.0.0.1:9"
    server._http = httpx.Client(
        transport=httpx.MockTransport(json_handler or (lambda r: httpx.Response(404))), base_url=server.base_url
    )
    head = (f"HTTP/1.1 {status} X\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sent: list[bytes] = []
    server.network_backend_factory = lambda: RecBackend([head + body], sent)
    server.sent = sent  # type: ignore[attr-defined]
    return server


def request_json(server) -> dict:
    raw = b"".join(server.sent)
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def events_of(server, **kw):
    return list(server.chat([{"role": "user", "content": "hi"}], **kw))


def test_native_tool_call_deltas_are_assembled_into_whole_calls():
    body = sse(
        delta(role="assistant", content=None),
        delta(content="Checking."),
        delta(
            tool_calls=[
                {"index": 0, "id": "abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]),
        delta(
            tool_calls=[
                {"index": 1, "id": "def", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            ]
        ),
        {"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]},
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 9}},
        "[DONE]",
    )
    server = fake_server(200, body)
    evs = events_of(
        server,
        tools=[
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "function", "function": {"name": "search"}},
        ],
    )
    seen = request_json(server)
    assert seen["tools"] and seen["stream"] is True and "messages" in seen
    assert evs.count(Working()) == 3  # each line of a call's tokens shows nothing yet: the engine's keep-alive
    evs = [e for e in evs if not isinstance(e, Working)]
    assert evs[0] == TextDelta("Checking.", None)
    assert evs[1] == ToolCallDelta("abc", "get_weather", '{"city": "Paris"}')
    assert evs[2] == ToolCallDelta("def", "search", "{}")
    assert evs[3] == Finish("tool_calls", 11, 9)


def test_a_long_tool_call_keeps_the_stream_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine turns the backend's Working events into an empty chunk at most every
    QUEUE_KEEPALIVE_S: without them a tool call written for two minutes reads as a dead runner."""
    from skulk_engine_llamacpp import engine
    from skulk_kernel.api import ChatMessage, TextGenerationParams, TokenChunk, ToolCallChunk

    clock = iter(range(0, 1000, 2))  # every read of the clock is two seconds on
    monkeypatch.setattr(engine.time, "perf_counter", lambda: float(next(clock)))

    class Backend:
        def chat(self, *args, **kwargs):
            yield from [Working()] * 10
            yield ToolCallDelta("c1", "search", "{}")
            yield Finish("tool_calls", 3, 40)

    params = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="x"),))
    session = engine.LlamaSession(Backend(), None, "llama_server-cpu")  # type: ignore[arg-type]
    chunks = list(session._generate("c1", params, lambda: False))
    alive = [c for c in chunks if isinstance(c, TokenChunk)]
    assert len(alive) == 3 and all(c.text == "" and c.finish_reason is None for c in alive)  # 20 s: one per 5 s
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert isinstance(chunks[-1], ToolCallChunk) and chunks[-1].calls[0].name == "search"


def test_prompt_mode_uses_apply_template_and_completions():
    paths = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, json={"prompt": "<|im_start|>user\nhi<|im_end|>\n"})

    chunks: list[dict | str] = [
        {"choices": [{"index": 0, "text": t, "finish_reason": None}]}
        for t in ["Sure", ". <tool", '_call>{"name": "f", "arguments": {"a": 1}}', "</tool_call>"]
    ]
    chunks.append(
        {
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4},
        }
    )
    server = fake_server(200, sse(*chunks, "[DONE]"), "prompt", handler)
    evs = events_of(server, tools=[{"type": "function", "function": {"name": "f"}}])
    assert paths == ["/apply-template"]
    assert b"POST /v1/completions " in b"".join(server.sent)
    body = request_json(server)
    assert body["prompt"].startswith("<|im_start|>") and "<tool_response>" in body["stop"]
    assert [e.text for e in evs if isinstance(e, TextDelta)] == ["Sure", ". "]
    call = next(e for e in evs if isinstance(e, ToolCallDelta))
    assert (call.name, json.loads(call.arguments_json)) == ("f", {"a": 1})
    assert evs[-1] == Finish("tool_calls", 5, 4)


def test_mid_stream_error_raises():
    body = sse(
        delta(content="Hel"),
        {
            "error": {
                "code": 500,
                "type": "server_error",
                "message": "The model produced output that does not match the expected peg-native format",
            }
        },
    )
    server = fake_server(200, body)
    it = server.chat([{"role": "user", "content": "hi"}])
    assert next(it) == TextDelta("Hel", None)
    with pytest.raises(BackendError, match="peg-native"):
        next(it)


def test_http_errors_are_typed():
    ctx = {
        "error": {
            "code": 400,
            "type": "exceed_context_size_error",
            "message": "request (9031 tokens) exceeds the available context size (8192 tokens)",
        }
    }
    server = fake_server(400, json.dumps(ctx).encode())
    with pytest.raises(ContextLengthExceeded) as info:
        events_of(server)
    assert info.value.status == 400
    loading = {"error": {"code": 503, "message": "Loading model"}}
    server = fake_server(503, json.dumps(loading).encode())
    with pytest.raises(BackendError, match="Loading model"):
        events_of(server)


def test_sampling_is_filtered_and_logprobs_requested():
    server = fake_server(200, sse({"choices": [{"index": 0, "finish_reason": "length", "delta": {}}]}, "[DONE]"))
    evs = events_of(server, sampling={"temperature": 0.2, "bogus": 1, "stop": ["x"], "max_tokens": None}, logprobs=True)
    seen = request_json(server)
    assert seen["temperature"] == 0.2 and "bogus" not in seen and "max_tokens" not in seen
    assert seen["logprobs"] is True and seen["top_logprobs"] == 1
    assert evs == [Finish("length", 0, 0)]
