"""The OpenAI API against a real node (echo engine), driven by the official `openai` SDK and raw HTTP."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai_error_asserts import assert_openai_error
from skulk_testing.echo_node import CORE_PLUGINS, ECHO, EMBED, SLOW, WEATHER, echo_node
from skulk_testing.echo_node import WEATHER_TOOLS as TOOLS
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

PLUGINS = [*CORE_PLUGINS, "api-openai"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    folder = tmp_path_factory.mktemp("api-openai")
    with echo_node(folder, [ECHO, EMBED], PLUGINS, name="api-openai-test") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> OpenAI:
    return OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=20)


def chat(text: str, **kwargs: Any) -> dict[str, Any]:
    return {"model": ECHO, "messages": [{"role": "user", "content": text}], **kwargs}


def sse_lines(node: NodeProcess, body: dict[str, Any], path: str = "/v1/chat/completions") -> list[str]:
    """The raw SSE stream as its non-empty lines."""
    with httpx.stream("POST", node.url + path, json=body, timeout=20) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def data_events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


# --- chat: non-streaming -------------------------------------------------------------------------


def test_non_stream_content_and_usage(client: OpenAI) -> None:
    out = client.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "hello big world"}])
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    assert out.model == ECHO
    assert out.system_fingerprint
    choice = out.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == "hello big world"
    assert choice.message.refusal is None
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert out.usage is not None
    assert out.usage.completion_tokens == 3
    assert out.usage.prompt_tokens == 5  # echo: 3 words + 2 per message
    assert out.usage.total_tokens == 8


def test_max_tokens_gives_length(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=ECHO, max_tokens=2, messages=[{"role": "user", "content": "one two three four"}]
    )
    assert out.choices[0].message.content == "one two"
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 2
    out = client.chat.completions.create(
        model=ECHO, max_completion_tokens=1, messages=[{"role": "user", "content": "one two three four"}]
    )
    assert out.choices[0].message.content == "one"
    assert out.choices[0].finish_reason == "length"


def test_stop_strings(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=ECHO, stop=["three"], messages=[{"role": "user", "content": "one two three four"}]
    )
    assert out.choices[0].message.content == "one two "
    assert out.choices[0].finish_reason == "stop"
    out = client.chat.completions.create(
        model=ECHO, stop="wo", messages=[{"role": "user", "content": "one two three four"}]
    )
    assert out.choices[0].message.content == "one t"


def test_logprobs_join_to_content(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=ECHO,
        logprobs=True,
        top_logprobs=3,
        messages=[{"role": "user", "content": "the quick brown fox"}],
    )
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    for t in choice.logprobs.content:
        assert t.logprob <= 0
        assert t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 3
    plain = client.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "x"}])
    assert plain.choices[0].logprobs is None


def test_tool_call_non_stream(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=ECHO,
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": WEATHER}],
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, str)
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_tool_round_trip_messages_accepted(client: OpenAI) -> None:
    """Assistant `content: null` with indexed tool_calls, a tool message with `name`, text parts, extras."""
    out = client.chat.completions.create(
        model=ECHO,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": WEATHER},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {  # type: ignore[list-item,typeddict-unknown-key]
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "name": "get_weather",  # type: ignore[typeddict-unknown-key]
                "content": "sunny",
            },
            {"role": "user", "content": [{"type": "text", "text": "thanks a lot"}]},
        ],
        temperature=0.2,
        top_p=0.9,
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        user="someone",
        extra_body={
            "enable_thinking": False,
            "reasoning_effort": "low",
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "some_future_field": {"x": 1},
        },
    )
    assert out.choices[0].message.content == "thanks a lot"


def test_bench_adds_generation_stats(node: NodeProcess) -> None:
    r = node.post("/bench/chat/completions", json=chat("a b c"))
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "a b c"
    stats = body["generation_stats"]
    assert stats["generation_tokens"] == 3 and stats["prompt_tokens"] == 5
    assert "generation_tps" in stats
    assert "generation_stats" not in node.post("/v1/chat/completions", json=chat("a b c")).json()


def test_unprefixed_paths(node: NodeProcess) -> None:
    r = node.post("/chat/completions", json=chat("no prefix"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "no prefix"
    r = node.post("/embeddings", json={"model": EMBED, "input": "no prefix"})
    assert r.status_code == 200 and len(r.json()["data"]) == 1


# --- chat: streaming -----------------------------------------------------------------------------


def test_stream_true(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=ECHO, stream=True, messages=[{"role": "user", "content": "stream me some words"}]
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({(c.id, c.created, c.model, c.system_fingerprint) for c in chunks}) == 1
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "stream me some words"
    reasons = [c.choices[0].finish_reason for c in chunks]
    assert reasons[-1] == "stop" and reasons[:-1] == [None] * (len(reasons) - 1)
    assert chunks[-1].usage is None  # no include_usage: no usage chunk
    assert len(chunks) == 1 + 4 + 1  # role, one per word, finish


def test_stream_helper(client: OpenAI) -> None:
    with client.chat.completions.stream(
        model=ECHO,
        messages=[{"role": "user", "content": "helper works fine"}],
        stream_options={"include_usage": True},
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == "helper works fine"
    assert final.choices[0].message.content == "helper works fine"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens == 3


def test_stream_include_usage(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=ECHO,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "count these"}],
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (4, 2, 6)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_max_tokens_and_logprobs(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=ECHO,
            stream=True,
            max_tokens=3,
            logprobs=True,
            top_logprobs=2,
            messages=[{"role": "user", "content": "alpha beta gamma delta epsilon"}],
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "alpha beta gamma"
    assert chunks[-1].choices[0].finish_reason == "length"
    tokens = [
        t.token
        for c in chunks
        if c.choices[0].logprobs and c.choices[0].logprobs.content
        for t in c.choices[0].logprobs.content
    ]
    assert "".join(tokens) == content
    with_text = [c for c in chunks if c.choices[0].delta.content]
    assert all(c.choices[0].logprobs and len(c.choices[0].logprobs.content[0].top_logprobs) == 2 for c in with_text)


def test_stream_tool_call(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=ECHO,
            stream=True,
            tools=TOOLS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": WEATHER}],
        )
    )
    tool_deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(tool_deltas) == 1 and len(tool_deltas[0]) == 1  # sent whole, in one delta
    delta = tool_deltas[0][0]
    assert delta.index == 0 and delta.id and delta.type == "function"
    assert delta.function is not None and delta.function.name == "get_weather"
    assert json.loads(delta.function.arguments or "") == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    with client.chat.completions.stream(
        model=ECHO,
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": WEATHER}],
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_raw_sse_framing(node: NodeProcess) -> None:
    lines = sse_lines(node, chat("raw framing here", stream=True, stream_options={"include_usage": True}))
    assert lines[0].startswith(": command_id ")
    command_id = lines[0].split()[-1]
    assert lines[-1] == "data: [DONE]"
    assert lines[-2].startswith(": generation_stats ")
    stats = json.loads(lines[-2][len(": generation_stats ") :])
    assert stats["generation_tokens"] == 3
    events = data_events(lines)
    assert all(e["id"] == f"chatcmpl-{command_id}" for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finish = events[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 8
    assert all(line.startswith(("data: ", ": ")) for line in lines)


WORKING = "/working 3 quiet then words"  # the echo engine: 3 empty keep-alive chunks, then the words


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", chat(WORKING, stream=True)),
        ("/v1/responses", {"model": ECHO, "input": WORKING, "stream": True}),
        ("/v1/completions", {"model": ECHO, "prompt": WORKING, "stream": True}),
    ],
    ids=["chat", "responses", "completions"],
)
def test_an_engines_keep_alives_reach_the_client_as_comments(
    node: NodeProcess, client: OpenAI, path: str, body: dict[str, Any]
) -> None:
    """Work that shows nothing yet (a tool call being written) sends the engine's empty chunks: each
    is a `: keep-alive` comment on the wire, so a proxy's read timeout sees bytes, and the SDK
    ignores them (the stream parses to the same text)."""
    lines = sse_lines(node, body, path)
    started = next(i for i, line in enumerate(lines) if line.startswith(": command_id"))
    assert lines[started:].count(": keep-alive") == 3, lines  # after the first chunk: the engine's own
    if path == "/v1/chat/completions":
        stream = client.chat.completions.create(model=ECHO, messages=body["messages"], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "quiet then words"
    elif path == "/v1/responses":
        with client.responses.stream(model=ECHO, input=WORKING) as events:
            assert events.get_final_response().output_text == "quiet then words"
    else:
        stream = client.completions.create(model=ECHO, prompt=WORKING, stream=True)
        assert "quiet then words" in "".join(c.choices[0].text for c in stream if c.choices)


# --- embeddings and models -----------------------------------------------------------------------


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_embeddings_base64_default_and_float(client: OpenAI, node: NodeProcess) -> None:
    texts = ["the cat sat", "a dog ran", "the cat sat"]
    b64 = client.embeddings.create(model=EMBED, input=texts)  # the SDK asks for base64
    flt = client.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    for res in (b64, flt):
        assert res.object == "list" and res.model == EMBED
        assert [d.index for d in res.data] == [0, 1, 2]
        assert all(len(d.embedding) == 16 for d in res.data)
        assert all(abs(_norm(d.embedding) - 1.0) < 1e-5 for d in res.data)
        assert res.usage.prompt_tokens == 9 and res.usage.total_tokens == 9
    for a, b in zip(b64.data, flt.data, strict=True):
        assert all(abs(x - y) < 1e-6 for x, y in zip(a.embedding, b.embedding, strict=True))
    assert flt.data[0].embedding == flt.data[2].embedding != flt.data[1].embedding
    single = client.embeddings.create(model=EMBED, input="just one", encoding_format="float")
    assert len(single.data) == 1
    raw = node.post("/v1/embeddings", json={"model": EMBED, "input": "x", "encoding_format": "base64"}).json()
    assert isinstance(raw["data"][0]["embedding"], str)


def test_embeddings_rejects_token_ids(client: OpenAI, node: NodeProcess) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input=[[1, 2, 3]])
    assert "token-id" in info.value.message
    for bad in ([1, 2, 3], [], 5, ["ok", 3]):
        r = node.post("/v1/embeddings", json={"model": EMBED, "input": bad})
        assert r.status_code == 400 and r.headers["x-should-retry"] == "false", (bad, r.text)
        assert r.json()["error"]["param"] == "input"


def test_embeddings_on_a_chat_model_is_a_400(node: NodeProcess) -> None:
    r = node.post("/v1/embeddings", json={"model": ECHO, "input": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "unsupported_task"


def test_models_list(client: OpenAI, node: NodeProcess) -> None:
    ids = [m.id for m in client.models.list()]
    assert ECHO in ids and EMBED in ids
    raw = node.get("/v1/models").json()
    assert raw["object"] == "list"
    for entry in raw["data"]:
        assert entry["object"] == "model" and entry["owned_by"] == "skulk" and isinstance(entry["created"], int)
    assert client.models.retrieve(ECHO).id == ECHO
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no/such-model")


# --- errors --------------------------------------------------------------------------------------


BAD_BODIES: list[tuple[str, bytes, int, str | None]] = [
    ("invalid json", b'{"model": "skulk/echo", "messages": [', 400, None),
    ("not an object", b'["skulk/echo"]', 400, None),
    ("empty body", b"", 400, None),
    ("messages not a list", json.dumps({"model": ECHO, "messages": "hi"}).encode(), 400, "messages"),
    ("empty messages", json.dumps({"model": ECHO, "messages": []}).encode(), 400, "messages"),
    ("no model", json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), 400, "model"),
    ("unknown model", json.dumps(chat("x", model="no/such-model")).encode(), 404, "model"),
    ("temperature as a string", json.dumps(chat("x", temperature="0.7")).encode(), 400, "temperature"),
    (
        "bad role",
        json.dumps({"model": ECHO, "messages": [{"role": "robot", "content": "x"}]}).encode(),
        400,
        "messages[0].role",
    ),
    (
        "content a number",
        json.dumps({"model": ECHO, "messages": [{"role": "user", "content": 3}]}).encode(),
        400,
        "messages[0].content",
    ),
    ("max_tokens zero", json.dumps(chat("x", max_tokens=0)).encode(), 400, "max_tokens"),
    (
        "top_logprobs too big",
        json.dumps(chat("x", logprobs=True, top_logprobs=50)).encode(),
        400,
        "top_logprobs",
    ),
    (
        "image part",
        json.dumps(
            {
                "model": ECHO,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
            }
        ).encode(),
        400,
        "model",  # skulk/echo does not accept images
    ),
    (
        "audio part",
        json.dumps({"model": ECHO, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}).encode(),
        400,
        "messages[0].content[0].type",
    ),
    ("n=2", json.dumps(chat("x", n=2)).encode(), 400, "n"),
    ("context overflow", json.dumps(chat("x", max_tokens=100_000)).encode(), 400, None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("why", "body", "status", "param"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_requests_are_openai_4xx(
    node: NodeProcess, why: str, body: bytes, status: int, param: str | None, stream: bool
) -> None:
    if stream and body.startswith(b"{") and why not in ("invalid json",):
        body = json.dumps({**json.loads(body), "stream": True}).encode()
    r = node.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert_openai_error(r, status, param, "context_length_exceeded" if why == "context overflow" else None)


def test_oversize_body_is_413(node: NodeProcess) -> None:
    big = b'{"model": "skulk/echo", "messages": [{"role": "user", "content": "' + b"a" * (33 << 20) + b'"}]}'
    r = node.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no content-length: the route itself enforces the limit
        yield b'{"model": "skulk/echo", "messages": [{"role": "user", "content": "'
        for _ in range(33):
            yield b"a" * (1 << 20)
        yield b'"}]}'

    r = node.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.headers["x-should-retry"] == "false"


def test_unknown_model_is_not_found(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no/such-model", messages=[{"role": "user", "content": "x"}])
    message = info.value.message
    assert "no/such-model" in message and ECHO in message  # names the models it could use
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.code == "model_not_found"


# --- disconnects ---------------------------------------------------------------------------------


def _open_tasks(node: NodeProcess) -> int:
    return len(node.state()["tasks"])


def _assert_runner_free(node: NodeProcess) -> None:
    """Echo admits 4 tasks at once: a quick answer now means no abandoned task holds a slot."""
    started = time.monotonic()
    r = node.post("/v1/chat/completions", json=chat("still serving"), timeout=15)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "still serving"
    assert time.monotonic() - started < 2.0


def _wait_no_tasks(node: NodeProcess) -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if _open_tasks(node) == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"tasks still open after the client left: {node.state().get('tasks')}")


def test_stream_disconnect_cancels(node: NodeProcess) -> None:
    for _ in range(4):  # as many as the runner admits: any one left running would block the next request
        with httpx.stream("POST", node.url + "/v1/chat/completions", json=chat(SLOW, stream=True), timeout=10) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 3:
                        assert _open_tasks(node) >= 1  # it is running...
                        break  # ...and leaving the block closes the connection mid-stream
    _wait_no_tasks(node)
    _assert_runner_free(node)


def test_non_stream_disconnect_cancels(node: NodeProcess) -> None:
    for _ in range(4):
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while the answer is being generated
            httpx.post(node.url + "/v1/chat/completions", json=chat(SLOW), timeout=0.4)
    _wait_no_tasks(node)
    _assert_runner_free(node)


def test_cancel_by_command_id_ends_the_stream_cleanly(node: NodeProcess) -> None:
    """`: command_id` is what POST /v1/cancel/{id} takes; the stream then finishes normally."""
    started = time.monotonic()
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=chat(SLOW, stream=True), timeout=10) as r:
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith(": command_id ")
        cancelled = node.post(f"/v1/cancel/{first.split()[-1]}")
        assert cancelled.status_code == 200, cancelled.text
        rest = [line for line in lines if line]
    assert time.monotonic() - started < 5
    assert rest[-1] == "data: [DONE]"
    events = data_events(rest)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    _wait_no_tasks(node)


def test_a_cancel_that_comes_after_the_client_left_is_answered_as_done(node: NodeProcess) -> None:
    """Stop in a browser drops the stream and sends the cancel at once; when the drop is read first
    the request has ended before the cancel arrives: 200 `ended`, not 404. An id never served: 404."""
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=chat(SLOW, stream=True), timeout=10) as r:
        command_id = next(r.iter_lines()).split()[-1]
    _wait_no_tasks(node)
    cancelled = node.post(f"/v1/cancel/{command_id}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"message": "the request had already ended", "command_id": command_id, "ended": True}
    unknown = node.post("/v1/cancel/00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "command_not_found", unknown.text


def test_concurrent_streams_stay_separate(client: OpenAI) -> None:
    results: dict[int, str] = {}

    def run(i: int) -> None:
        words = " ".join(f"s{i}w{k}" for k in range(20))
        chunks = client.chat.completions.create(model=ECHO, stream=True, messages=[{"role": "user", "content": words}])
        results[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: " ".join(f"s{i}w{k}" for k in range(20)) for i in range(6)}


# --- a second node: keep-alives, and a catalog model with no instance ----------------------------


@pytest.fixture(scope="module")
def keepalive_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    folder = tmp_path_factory.mktemp("api-openai-keepalive")
    # (in [plugins.master], the table write_profile opens last): this node keeps the 404 of a model with no
    # instance; by default a request places the model (tests/serving/test_on_demand_node.py)
    extra = "place_on_request = false\n\n[plugins.api-openai]\nkeepalive_s = 0.02\n"
    with echo_node(folder, [ECHO], PLUGINS, extra, name="api-openai-test") as proc:
        yield proc


def test_keepalive_while_waiting_for_the_first_token(keepalive_node: NodeProcess) -> None:
    lines = sse_lines(keepalive_node, chat("/slow a b c", stream=True))  # first token after 50 ms
    assert lines[0] == ": keep-alive"
    first_other = next(line for line in lines if line != ": keep-alive")
    assert first_other.startswith(": command_id ")
    assert lines[-1] == "data: [DONE]"
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in data_events(lines) if e["choices"])
    assert content == "/slow a b c"
    client = OpenAI(base_url=keepalive_node.url + "/v1", api_key="x", max_retries=0, timeout=20)
    chunks = list(
        client.chat.completions.create(model=ECHO, stream=True, messages=[{"role": "user", "content": "/slow x y"}])
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "/slow x y"


def test_model_without_instance_says_how_to_place_it_when_place_on_request_is_off(keepalive_node: NodeProcess) -> None:
    client = OpenAI(base_url=keepalive_node.url + "/v1", api_key="x", max_retries=0, timeout=20)
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model=EMBED, input="x")
    assert "place_instance" in info.value.message and EMBED in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"
    # still listed: /v1/models has every catalog model
    assert EMBED in [m.id for m in client.models.list()]
