"""The Responses API (`POST /v1/responses`) against a real node (echo engine), driven by the official
`openai` SDK and raw HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai_error_asserts import assert_openai_error
from skulk_testing.echo_node import CORE_PLUGINS, ECHO, SLOW, WEATHER, echo_node
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]
PLUGINS = [*CORE_PLUGINS, "api-openai"]


def echo_words(text: str) -> int:
    """How the echo engine counts a message's prompt tokens: its words, plus 2 per message."""
    return len([w for w in text.split(" ") if w]) + 2


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    folder = tmp_path_factory.mktemp("api-openai-responses")
    with echo_node(folder, [ECHO], PLUGINS, name="api-openai-responses-test") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> OpenAI:
    return OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=20)


def sse_events(
    node: NodeProcess, body: dict[str, Any], path: str = "/v1/responses"
) -> tuple[list[str], list[dict[str, Any]]]:
    """The raw SSE stream: its non-empty lines, and the data payloads (each checked against its event)."""
    with httpx.stream("POST", node.url + path, json={**body, "stream": True}, timeout=20) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    events: list[dict[str, Any]] = []
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])  # every data line is JSON: no [DONE] for Responses
            assert data["type"] == name
            events.append(data)
            name = None
        else:
            assert line.startswith(":"), line
    return lines, events


# --- non-streaming -------------------------------------------------------------------------------


def test_create_text(client: OpenAI) -> None:
    resp = client.responses.create(model=ECHO, input="hello big world")
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status == "completed" and resp.model == ECHO
    assert resp.output_text == "hello big world"
    (msg,) = resp.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert resp.usage is not None
    assert resp.usage.input_tokens == echo_words("hello big world")
    assert resp.usage.output_tokens == 3
    assert resp.usage.total_tokens == resp.usage.input_tokens + 3
    assert resp.created_at > 0


def test_instructions_become_the_system_message(client: OpenAI) -> None:
    plain = client.responses.create(model=ECHO, input="ping pong")
    told = client.responses.create(model=ECHO, input="ping pong", instructions="answer in three words")
    assert told.output_text == "ping pong"  # echo answers the user message...
    assert told.instructions == "answer in three words"
    assert plain.usage is not None and told.usage is not None
    # ...but the prompt it was given had the instructions as one more message
    assert told.usage.input_tokens - plain.usage.input_tokens == echo_words("answer in three words")


def test_item_list_input(client: OpenAI) -> None:
    resp = client.responses.create(
        model=ECHO,
        input=[
            {"role": "developer", "content": "be terse"},
            {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},  # type: ignore[misc,list-item]
            {"type": "message", "role": "user", "content": "second turn"},
        ],
    )
    assert resp.output_text == "second turn"


def test_max_output_tokens_is_incomplete(client: OpenAI) -> None:
    resp = client.responses.create(model=ECHO, input="one two three four", max_output_tokens=2)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text == "one two"
    assert resp.max_output_tokens == 2


def test_function_call_and_follow_up(client: OpenAI) -> None:
    first = client.responses.create(model=ECHO, input=WEATHER, tools=TOOLS)  # type: ignore[arg-type]
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.tools[0].type == "function"
    follow = client.responses.create(  # the first output is passed back as it came
        model=ECHO,
        tools=TOOLS,  # type: ignore[arg-type]
        input=[
            {"role": "user", "content": WEATHER},
            *[item.model_dump(exclude_none=True) for item in first.output],  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny and 20C"},
        ],
    )
    assert follow.status == "completed"
    assert first.usage is not None and follow.usage is not None
    # the prompt grew by the assistant's call turn (no text: 2) and the tool output message
    assert follow.usage.input_tokens - first.usage.input_tokens == 2 + echo_words("sunny and 20C")


def test_unprefixed_path(node: NodeProcess) -> None:
    r = node.post("/responses", json={"model": ECHO, "input": "no prefix"})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "no prefix"


# --- streaming -----------------------------------------------------------------------------------


def test_stream_helper_text(client: OpenAI) -> None:
    deltas: list[str] = []
    with client.responses.stream(model=ECHO, input="streamed words here") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert deltas == ["streamed", " words", " here"]
    assert final.output_text == "streamed words here" and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == 3


def test_stream_helper_function_call_then_follow_up(client: OpenAI) -> None:
    with client.responses.stream(model=ECHO, input=WEATHER, tools=TOOLS) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(
        model=ECHO,
        input=[
            {"role": "user", "content": "what is the weather in Paris"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'},
        ],
        tools=TOOLS,  # type: ignore[arg-type]
    ) as stream:
        answer = stream.get_final_response()
    assert answer.status == "completed"
    assert answer.output_text == "what is the weather in Paris"  # echo repeats the last user message


def test_stream_truncation_ends_in_response_incomplete(client: OpenAI, node: NodeProcess) -> None:
    events = list(client.responses.create(model=ECHO, input="a b c d", max_output_tokens=2, stream=True))
    assert events[0].type == "response.created"
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output_text == "a b"
    with client.responses.stream(model=ECHO, input="a b c d", max_output_tokens=2) as stream:
        for _ in stream:
            pass
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()  # as with OpenAI: a truncated stream has no response.completed


def test_raw_sse_framing(node: NodeProcess) -> None:
    lines, events = sse_events(node, {"model": ECHO, "input": "raw frames"})
    assert lines[0].startswith(": command_id ")
    assert "data: [DONE]" not in lines
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["response"]["id"] for e in events if "response" in e} == {events[0]["response"]["id"]}
    assert events[0]["response"]["id"] == "resp_" + lines[0].split()[-1]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == "raw frames"
    item_id = next(e for e in events if e["type"] == "response.output_item.added")["item"]["id"]
    assert {e["item_id"] for e in deltas} == {item_id}
    assert events[-1]["response"]["output"][0]["id"] == item_id
    _, prefixless = sse_events(node, {"model": ECHO, "input": "x"}, path="/responses")
    assert prefixless[-1]["type"] == "response.completed"


# --- errors --------------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, bytes, int, str | None]] = [
    ("invalid json", b"{not json", 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("no model", json.dumps({"input": "x"}).encode(), 400, "model"),
    ("no input", json.dumps({"model": ECHO}).encode(), 400, "input"),
    ("bad item", json.dumps({"model": ECHO, "input": [{"type": "nope"}]}).encode(), 400, "input[0].type"),
    (
        "image part",
        json.dumps(
            {
                "model": ECHO,
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            }
        ).encode(),
        400,
        "model",  # skulk/echo does not accept images
    ),
    (
        "file part",
        json.dumps({"model": ECHO, "input": [{"role": "user", "content": [{"type": "input_file"}]}]}).encode(),
        400,
        "input[0].content[0].type",
    ),
    (
        "bad temperature",
        json.dumps({"model": ECHO, "input": "x", "temperature": "hot"}).encode(),
        400,
        "temperature",
    ),
    (
        "builtin tool",
        json.dumps({"model": ECHO, "input": "x", "tools": [{"type": "web_search"}]}).encode(),
        400,
        "tools[0].type",
    ),
    (
        "previous id",
        json.dumps({"model": ECHO, "input": "x", "previous_response_id": "resp_1"}).encode(),
        400,
        "previous_response_id",
    ),
    ("unknown model", json.dumps({"model": "no/such", "input": "x"}).encode(), 404, "model"),
    (
        "context overflow",
        json.dumps({"model": ECHO, "input": "x", "max_output_tokens": 100_000}).encode(),
        400,
        None,
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("why", "body", "status", "param"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_requests_are_openai_4xx(
    node: NodeProcess, why: str, body: bytes, status: int, param: str | None, stream: bool
) -> None:
    if stream and body.startswith(b"{") and why != "invalid json":
        body = json.dumps({**json.loads(body), "stream": True}).encode()
    r = node.post("/v1/responses", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert_openai_error(r, status, param, "context_length_exceeded" if why == "context overflow" else None)


def test_sdk_raises_typed_errors(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=ECHO, input=[])
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="no/such-model", input="x")
    assert info.value.code == "model_not_found"


# --- disconnects ---------------------------------------------------------------------------------


def _open_tasks(node: NodeProcess) -> int:
    return len(node.state()["tasks"])


def _wait_no_tasks(node: NodeProcess) -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if _open_tasks(node) == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"tasks still open after the client left: {node.state().get('tasks')}")


def _assert_runner_free(node: NodeProcess) -> None:
    """Echo admits 4 tasks at once: a quick answer now means no abandoned task holds a slot."""
    started = time.monotonic()
    r = node.post("/v1/responses", json={"model": ECHO, "input": "still serving"}, timeout=15)
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "still serving"
    assert time.monotonic() - started < 2.0


def test_stream_disconnect_cancels(node: NodeProcess) -> None:
    for _ in range(4):  # as many as the runner admits: any one left running would block the next request
        with httpx.stream(
            "POST",
            node.url + "/v1/responses",
            json={"model": ECHO, "input": SLOW, "stream": True},
            timeout=10,
        ) as r:
            assert r.status_code == 200
            deltas = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and '"response.output_text.delta"' in line:
                    deltas += 1
                    if deltas == 3:
                        assert _open_tasks(node) >= 1  # it is running...
                        break  # ...and leaving the block closes the connection mid-stream
    _wait_no_tasks(node)
    _assert_runner_free(node)


def test_non_stream_disconnect_cancels(node: NodeProcess) -> None:
    for _ in range(4):
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while the answer is being generated
            httpx.post(node.url + "/v1/responses", json={"model": ECHO, "input": SLOW}, timeout=0.4)
    _wait_no_tasks(node)
    _assert_runner_free(node)


def test_cancel_by_command_id_ends_the_stream_cleanly(node: NodeProcess) -> None:
    """`: command_id` is what POST /v1/cancel/{id} takes; the stream then ends with response.completed."""
    started = time.monotonic()
    with httpx.stream(
        "POST", node.url + "/v1/responses", json={"model": ECHO, "input": SLOW, "stream": True}, timeout=10
    ) as r:
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith(": command_id ")
        cancelled = node.post(f"/v1/cancel/{first.split()[-1]}")
        assert cancelled.status_code == 200, cancelled.text
        rest = [line for line in lines if line.startswith("data: ")]
    assert time.monotonic() - started < 5
    last = json.loads(rest[-1][len("data: ") :])
    assert last["type"] == "response.completed"
    assert last["response"]["output"][0]["status"] == "completed"
    _wait_no_tasks(node)


# --- a second node: keep-alives before the first token -------------------------------------------


@pytest.fixture(scope="module")
def keepalive_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    folder = tmp_path_factory.mktemp("api-openai-responses-keepalive")
    extra = "\n[plugins.api-openai]\nkeepalive_s = 0.02\n"
    with echo_node(folder, [ECHO], PLUGINS, extra, name="api-openai-responses-keepalive") as proc:
        yield proc


def test_keepalive_while_waiting_for_the_first_token(keepalive_node: NodeProcess) -> None:
    # the first token comes after 50 ms, far over keepalive_s
    lines, events = sse_events(keepalive_node, {"model": ECHO, "input": "/slow a b c"})
    assert lines[0] == ": keep-alive"
    assert next(line for line in lines if line != ": keep-alive").startswith(": command_id ")
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "/slow a b c"
    client = OpenAI(base_url=keepalive_node.url + "/v1", api_key="x", max_retries=0, timeout=20)
    with client.responses.stream(model=ECHO, input="/slow x y") as stream:
        assert stream.get_final_response().output_text == "/slow x y"
