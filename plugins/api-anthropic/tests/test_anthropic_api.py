"""The Anthropic API against a real node (echo engine), driven by the `anthropic` SDK and raw HTTP."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Anthropic
from skulk_testing.echo_node import ECHO, EMBED, SLOW, WEATHER, echo_node
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "x"}


@pytest.fixture(scope="module")
def node(shared_echo_node: NodeProcess) -> NodeProcess:
    """The run's shared echo node (skulk_testing): these tests only send requests."""
    return shared_echo_node


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> Anthropic:
    return Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=20)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def sse_events(node: NodeProcess, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream("POST", node.url + "/v1/messages", json=body, headers=HEADERS, timeout=20) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    events = []
    for name_line, data_line in zip(lines[::2], lines[1::2], strict=True):
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        events.append((name_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return events


# --- messages ------------------------------------------------------------------------------------


def test_create(client: Anthropic) -> None:
    out = client.messages.create(model=ECHO, max_tokens=64, messages=user("hello big world"))
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == ECHO
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == "hello big world"  # type: ignore[union-attr]
    assert out.stop_reason == "end_turn" and out.stop_sequence is None
    assert out.usage.input_tokens == 5 and out.usage.output_tokens == 3  # echo: 3 words + 2 per message


def test_system_is_a_message(client: Anthropic) -> None:
    out = client.messages.create(
        model=ECHO, max_tokens=64, system=[{"type": "text", "text": "be brief"}], messages=user("hi")
    )
    assert out.usage.input_tokens == (2 + 2) + (1 + 2)


def test_max_tokens_stop_reason(client: Anthropic) -> None:
    out = client.messages.create(model=ECHO, max_tokens=2, messages=user("one two three four"))
    assert out.content[0].text == "one two"  # type: ignore[union-attr]
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 2
    with client.messages.stream(model=ECHO, max_tokens=1, messages=user("one two")) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].text == "one"  # type: ignore[union-attr]


def test_stream_helper(client: Anthropic) -> None:
    with client.messages.stream(model=ECHO, max_tokens=64, messages=user("hello big world")) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["hello", " big", " world"]
    assert final.content[0].text == "hello big world"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 5 and final.usage.output_tokens == 3


def test_stream_true_raw_events(client: Anthropic) -> None:
    events = list(client.messages.create(model=ECHO, max_tokens=64, messages=user("a b"), stream=True))
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_an_engines_keep_alives_are_comments_the_sdk_ignores(node: NodeProcess, client: Anthropic) -> None:
    """The engine's empty chunks (work that shows nothing yet) are `: keep-alive` comments after
    message_start: bytes for a proxy's read timeout, never an event (the SDK sees the same stream)."""
    body = {"model": ECHO, "max_tokens": 64, "stream": True, "messages": user("/working 3 a b")}
    for stops in ([], ["zzz"]):  # stop sequences hold text back: keep-alives still pass
        with httpx.stream(
            "POST", node.url + "/v1/messages", json={**body, "stop_sequences": stops}, headers=HEADERS, timeout=20
        ) as r:
            lines = [line for line in r.iter_lines() if line]
        started = lines.index("event: message_start")
        assert lines[started:].count(": keep-alive") == 3, lines
    events = list(client.messages.create(model=ECHO, max_tokens=64, messages=user("/working 3 a b"), stream=True))
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    with client.messages.stream(model=ECHO, max_tokens=64, messages=user("/working 3 a b")) as stream:
        assert stream.get_final_text() == "a b"


def test_sse_framing(node: NodeProcess) -> None:
    events = sse_events(node, {"model": ECHO, "max_tokens": 64, "stream": True, "messages": user("x y")})
    for name, data in events:
        assert name == data["type"]
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    message = events[0][1]["message"]
    assert message["content"] == [] and message["usage"]["input_tokens"] > 0
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "", "citations": None},
    }
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["usage"] == {
        "input_tokens": 4,
        "output_tokens": 2,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def test_tool_use_round_trip(client: Anthropic) -> None:
    out = client.messages.create(model=ECHO, max_tokens=64, tools=TOOLS, messages=user(WEATHER))  # type: ignore[arg-type]
    assert out.stop_reason == "tool_use"
    (block,) = out.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Paris"}
    assert block.id.startswith("toolu_")
    # the current specification's required `caller` (never null), and the newest SDK fields as null
    assert block.caller is not None and block.caller.type == "direct"
    assert out.diagnostics is None and out.usage.speed is None
    assert "diagnostics" in out.model_fields_set and "speed" in out.usage.model_fields_set  # sent, not defaulted
    follow = client.messages.create(
        model=ECHO,
        max_tokens=64,
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[
            {"role": "user", "content": WEATHER},
            {"role": "assistant", "content": out.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": block.id, "content": "sunny, 21 C"},
                    {"type": "text", "text": "thanks, and tomorrow"},
                ],
            },
        ],
    )
    assert follow.stop_reason == "end_turn"
    assert follow.content[0].text == "thanks, and tomorrow"  # type: ignore[union-attr]


def test_streamed_tool_use(client: Anthropic) -> None:
    with client.messages.stream(
        model=ECHO,
        max_tokens=64,
        tools=TOOLS,
        tool_choice={"type": "any"},  # type: ignore[arg-type]
        messages=user(WEATHER),
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Paris"}
    assert final.content[0].caller is not None and final.content[0].caller.type == "direct"


def test_count_tokens(client: Anthropic, node: NodeProcess) -> None:
    counted = client.messages.count_tokens(model=ECHO, messages=user("hello big world"))  # type: ignore[arg-type]
    assert counted.input_tokens == 5  # the engine's count, the same as messages.create's usage
    r = node.post("/v1/messages/count_tokens", json={"model": ECHO, "messages": user("a b")}, headers=HEADERS)
    assert r.json() == {"input_tokens": 4} and r.headers["x-skulk-token-count"] == "exact"
    too_long = node.post(
        "/v1/messages/count_tokens",
        headers=HEADERS,
        json={"model": ECHO, "messages": user(" ".join(["w"] * 5000))},
    )
    assert too_long.status_code == 200 and too_long.json() == {"input_tokens": 5002}  # over the 4096 limit


def test_models_list_terminates_and_is_anthropic_shaped(client: Anthropic, node: NodeProcess) -> None:
    models = list(client.models.list())  # auto-pagination: ends only if has_more is honest
    ids = [m.id for m in models]
    assert ids[0] == ECHO and EMBED not in ids  # placed first; /v1/messages cannot use embedding models
    assert models[0].type == "model" and models[0].display_name == ECHO and models[0].max_input_tokens == 4096
    assert client.models.retrieve(ECHO).id == ECHO
    headers = {"anthropic-version": "2023-06-01"}
    page = node.get("/v1/models?limit=1000", headers=headers).json()
    assert [m["id"] for m in page["data"]] == ids and page["has_more"] is False
    assert page["first_id"] == ids[0] and page["last_id"] == ids[-1]
    walked: list[str] = []
    after = ""
    while True:
        one = node.get(f"/v1/models?limit=1{after}", headers=headers).json()
        walked += [m["id"] for m in one["data"]]
        if not one["has_more"]:
            break
        after = f"&after_id={one['last_id']}"
    assert walked == ids
    bearer = node.get("/v1/models", headers={"Authorization": "Bearer x", "anthropic-version": "2099-01-01"})
    assert bearer.json()["data"][0]["type"] == "model"
    assert node.get("/v1/models", headers={"x-api-key": "x"}).json()["data"][0]["type"] == "model"
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no/such-model")


def test_openai_clients_still_get_the_openai_model_list(node: NodeProcess) -> None:
    body = node.get("/v1/models", headers={"Authorization": "Bearer x"}).json()
    assert body["object"] == "list" and all(m["object"] == "model" for m in body["data"])


def test_auth_headers_and_versions_are_accepted(node: NodeProcess) -> None:
    bearer = Anthropic(
        base_url=node.url,
        auth_token="x",
        max_retries=0,
        timeout=20,
        default_headers={"anthropic-version": "2026-10-21"},
    )
    assert bearer.messages.create(model=ECHO, max_tokens=8, messages=user("ok")).content[0].text == "ok"  # type: ignore[union-attr]
    r = node.post(
        "/v1/messages",
        json={"model": ECHO, "max_tokens": 8, "messages": user("ok")},
        headers={"x-api-key": "x", "anthropic-version": "1999-01-01"},
    )
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "ok"


# --- errors --------------------------------------------------------------------------------------


def _assert_error(r: httpx.Response, status: int, error_type: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["request_id"].startswith("req_")
    assert r.headers["x-should-retry"] == "false"
    return body


@pytest.mark.parametrize(
    "content, needle",
    [
        (json.dumps({"model": ECHO, "messages": user("x")}), "max_tokens"),
        (json.dumps({"model": ECHO, "max_tokens": 5, "messages": []}), "messages"),
        ('{"model": "skulk/echo", "max_tokens": 5, "messages": [', "JSON"),
        ("", "empty"),
        (
            json.dumps({"model": ECHO, "max_tokens": 5, "messages": user("x"), "temperature": "hot"}),
            "temperature",
        ),
    ],
)
def test_malformed_requests_are_anthropic_400s(node: NodeProcess, content: str, needle: str) -> None:
    r = node.post("/v1/messages", content=content, headers={**HEADERS, "content-type": "application/json"})
    assert needle in _assert_error(r, 400, "invalid_request_error")["error"]["message"]


def test_sdk_raises_typed_errors(client: Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=ECHO, max_tokens=5, messages=[])
    assert bad.value.status_code == 400
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no/such-model", max_tokens=5, messages=user("x"))
    assert "no/such-model" in str(missing.value.message)
    with pytest.raises(anthropic.NotFoundError):
        with client.messages.stream(model="no/such-model", max_tokens=5, messages=user("x")) as stream:
            stream.get_final_message()


def test_unknown_model_and_context_overflow(node: NodeProcess) -> None:
    r = node.post("/v1/messages", json={"model": "no/such-model", "max_tokens": 5, "messages": user("x")})
    _assert_error(r, 404, "not_found_error")
    r = node.post("/v1/messages", json={"model": EMBED, "max_tokens": 5, "messages": user("x")})
    _assert_error(r, 400, "invalid_request_error")
    # max_tokens is a ceiling every Anthropic client must send: over the context it is lowered, not refused
    r = node.post("/v1/messages", json={"model": ECHO, "max_tokens": 5000, "messages": user("x")})
    assert r.status_code == 200 and r.json()["content"][0]["text"], r.text
    long = {"model": ECHO, "max_tokens": 5, "messages": user("x " * 5000), "stream": True}
    r = node.post("/v1/messages", json=long)  # a prompt over the context still is a 400
    assert "context_length_exceeded" in _assert_error(r, 400, "invalid_request_error")["error"]["message"]


# --- disconnects ---------------------------------------------------------------------------------


def _wait_no_tasks(node: NodeProcess) -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if not node.state()["tasks"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"tasks still open after the client left: {node.state().get('tasks')}")


def _assert_runner_free(client: Anthropic) -> None:
    """Echo admits 4 tasks at once: a quick answer now means no abandoned task holds a slot."""
    started = time.monotonic()
    out = client.messages.create(model=ECHO, max_tokens=8, messages=user("still serving"))
    assert out.content[0].text == "still serving"  # type: ignore[union-attr]
    assert time.monotonic() - started < 2.0


def test_stream_disconnect_cancels(node: NodeProcess, client: Anthropic) -> None:
    for _ in range(4):  # as many as the runner admits: one left running would block the next request
        body = {"model": ECHO, "max_tokens": 500, "stream": True, "messages": user(SLOW)}
        with httpx.stream("POST", node.url + "/v1/messages", json=body, headers=HEADERS, timeout=10) as r:
            assert r.status_code == 200
            deltas = 0
            for line in r.iter_lines():
                if line == "event: content_block_delta":
                    deltas += 1
                    if deltas == 3:
                        assert node.state()["tasks"]  # it is running...
                        break  # ...and leaving the block closes the connection mid-stream
    _wait_no_tasks(node)
    _assert_runner_free(client)


def test_sdk_stream_close_cancels(node: NodeProcess, client: Anthropic) -> None:
    with client.messages.stream(model=ECHO, max_tokens=500, messages=user(SLOW)) as stream:
        for i, _ in enumerate(stream.text_stream):
            if i == 2:
                break
    _wait_no_tasks(node)


def test_non_stream_disconnect_cancels(node: NodeProcess, client: Anthropic) -> None:
    for _ in range(4):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                node.url + "/v1/messages",
                json={"model": ECHO, "max_tokens": 500, "messages": user(SLOW)},
                headers=HEADERS,
                timeout=0.4,
            )
    _wait_no_tasks(node)
    _assert_runner_free(client)


def test_cancel_by_message_id_ends_the_stream_cleanly(node: NodeProcess) -> None:
    """The message id is `msg_<command_id>`: POST /v1/cancel/{command_id} stops it, and it ends normally."""
    started = time.monotonic()
    body = {"model": ECHO, "max_tokens": 500, "stream": True, "messages": user(SLOW)}
    with httpx.stream("POST", node.url + "/v1/messages", json=body, headers=HEADERS, timeout=10) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: message_start"
        message_id = json.loads(next(lines)[len("data: ") :])["message"]["id"]
        cancelled = node.post(f"/v1/cancel/{message_id.removeprefix('msg_')}")
        assert cancelled.status_code == 200, cancelled.text
        rest = [line for line in lines if line]
    assert time.monotonic() - started < 5
    assert rest[-2:] == ["event: message_stop", 'data: {"type":"message_stop"}']
    delta = next(json.loads(line[6:]) for line in rest if line.startswith('data: {"type":"message_delta"'))
    assert delta["delta"]["stop_reason"] == "end_turn"
    _wait_no_tasks(node)


# --- a second node: pings while the first token is awaited ---------------------------------------


def test_pings_while_waiting_for_the_first_token(tmp_path: Path) -> None:
    # the first token comes after 0.5 s (25 keep-alive periods): a ping first even on a loaded box
    extra = "\n[plugins.api-anthropic]\nkeepalive_s = 0.02\n\n[plugins.engine-echo]\ntoken_delay_s = 0.5\n"
    with echo_node(tmp_path, [ECHO], extra=extra, name="api-anthropic-test") as proc:
        events = sse_events(proc, {"model": ECHO, "max_tokens": 64, "stream": True, "messages": user("a b")})
        names = [n for n, _ in events]
        assert names[0] == "message_start" and names[1] == "ping" and names[-1] == "message_stop"
        assert all(name == data["type"] for name, data in events)
        client = Anthropic(base_url=proc.url, api_key="x", max_retries=0, timeout=20)
        with client.messages.stream(model=ECHO, max_tokens=64, messages=user("/slow x y")) as stream:
            assert stream.get_final_text() == "/slow x y"
