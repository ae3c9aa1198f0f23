"""The Responses API without a node (fast): request parsing, and the encoder's bodies and events
validated against the `openai` SDK's own types and its stream accumulator."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import (
    Response,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter
from skulk_api_openai.requests import RequestError
from skulk_api_openai.responses import ResponsesEncoder
from skulk_api_openai.responses_requests import ResponsesRequest, parse_responses_request
from skulk_kernel.api import Chunk, ErrorChunk, TokenChunk, TokenLogprob, ToolCall, ToolCallChunk, TopLogprob, Usage

CMD = "0b7f2d5e-1111-2222-3333-444455556666"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def body(**kwargs: Any) -> dict[str, Any]:
    return {"model": "skulk/echo", "input": "hi", **kwargs}


# --- parsing -------------------------------------------------------------------------------------


def test_string_input_and_instructions() -> None:
    req = parse_responses_request(body(instructions="be brief", max_output_tokens=7, temperature=0.5, top_p=0.9))
    msgs = req.params.messages
    assert [(m.role, m.content) for m in msgs] == [("system", "be brief"), ("user", "hi")]
    assert req.params.sampling.max_tokens == 7
    assert req.params.sampling.temperature == 0.5 and req.params.sampling.top_p == 0.9
    assert req.stream is False and req.instructions == "be brief"
    assert req.tool_choice == "auto" and req.tools == () and req.parallel_tool_calls is True


def test_item_list_round_trip() -> None:
    """A replayed `response.output` (reasoning, message, function calls) plus the tool outputs."""
    req = parse_responses_request(
        body(
            input=[
                {"role": "developer", "content": "dev rules"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "hmm"}],
                },
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "checking", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                    "status": "completed",
                },
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": {"tz": "CET"}},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "noon"}],
                },
                {"role": "user", "content": "thanks"},
            ],
            tools=[
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "w",
                    "parameters": {"type": "object"},
                },
                {"type": "function", "name": "get_time", "strict": True},
            ],
            tool_choice={"type": "function", "name": "get_time"},
            reasoning={"effort": "low"},
            store=True,
            user="u",
            include=["reasoning.encrypted_content"],
        )
    )
    msgs = req.params.messages
    assert [m.role for m in msgs] == ["developer", "user", "assistant", "tool", "tool", "user"]
    assistant = msgs[2]
    assert assistant.content == "checking" and assistant.reasoning_content == "hmm"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        ("c1", "get_weather", {"city": "Paris"}),
        ("c2", "get_time", {"tz": "CET"}),
    ]
    assert (msgs[3].tool_call_id, msgs[3].name, msgs[3].content) == ("c1", "get_weather", "sunny")
    assert (msgs[4].tool_call_id, msgs[4].name, msgs[4].content) == ("c2", "get_time", "noon")
    assert [t.name for t in req.params.tools] == ["get_weather", "get_time"]
    assert req.params.tool_choice == "get_time"
    assert req.tool_choice == {"type": "function", "name": "get_time"}
    assert req.params.enable_thinking is True
    assert req.params.logprobs is False


def test_function_call_without_message_is_its_own_turn() -> None:
    req = parse_responses_request(
        body(
            input=[
                {"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "r"},
            ]
        )
    )
    roles = [(m.role, m.content, len(m.tool_calls)) for m in req.params.messages]
    assert roles == [("user", "x", 0), ("assistant", None, 1), ("tool", "r", 0)]


def test_reasoning_effort_and_logprobs() -> None:
    assert parse_responses_request(body(reasoning={"effort": "none"})).params.enable_thinking is False
    assert parse_responses_request(body(reasoning={"effort": None})).params.enable_thinking is None
    assert parse_responses_request(body()).params.enable_thinking is None
    req = parse_responses_request(body(include=["message.output_text.logprobs"], top_logprobs=2))
    assert req.params.logprobs is True and req.params.top_logprobs == 2


BAD: list[tuple[dict[str, Any], str | None]] = [
    ({"input": "x"}, "model"),
    ({"model": "skulk/echo"}, "input"),
    (body(input=[]), "input"),
    (
        body(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "u"}]}]),
        "input[0].content[0].type",
    ),
    (
        body(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "u"}]}]),
        "input[0].content[0].file_id",
    ),
    (body(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
    (body(input=[{"type": "function_call", "name": "f"}]), "input[0].call_id"),
    (body(input=[{"role": "robot", "content": "x"}]), "input[0].role"),
    (body(input=[3]), "input[0]"),
    (body(temperature="hot"), "temperature"),
    (body(max_output_tokens=0), "max_output_tokens"),
    (body(tools=[{"type": "web_search"}]), "tools[0].type"),
    (body(tools=[{"type": "function"}]), "tools[0].name"),
    (body(tool_choice="sometimes"), "tool_choice"),
    (body(tool_choice={"type": "function", "name": "nope"}), "tool_choice"),
    (body(previous_response_id="resp_1"), "previous_response_id"),
    (body(stream="yes"), "stream"),
]


@pytest.mark.parametrize(("data", "param"), BAD, ids=[str(p) for _, p in BAD])
def test_bad_requests_name_the_field(data: dict[str, Any], param: str | None) -> None:
    with pytest.raises(RequestError) as info:
        parse_responses_request(data)
    assert info.value.status == 400
    assert info.value.param == param, info.value.message
    assert param is not None and param.startswith(info.value.message.split(":")[0])  # the message names it


# --- encoding ------------------------------------------------------------------------------------


def request(**kwargs: Any) -> ResponsesRequest:
    return parse_responses_request(body(**kwargs))


async def _aiter(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def tokens(*texts: str, reasoning: int = 0, reason: str = "stop") -> list[Chunk]:
    """Token chunks (the first `reasoning` of them marked reasoning) and the terminal chunk."""
    out: list[Chunk] = [TokenChunk(command_id=CMD, seq=i, text=t, reasoning=i < reasoning) for i, t in enumerate(texts)]
    out.append(
        TokenChunk(
            command_id=CMD,
            seq=len(texts),
            text="",
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=4, completion_tokens=len(texts)),
        )
    )
    return out


TOOL = ToolCallChunk(
    command_id=CMD,
    seq=0,
    calls=(ToolCall(id="call_9", name="get_weather", arguments='{"city":"Paris"}'),),
    finish_reason="tool_calls",
    usage=Usage(prompt_tokens=4, completion_tokens=1),
)


def non_stream(req: ResponsesRequest, chunks: list[Chunk]) -> tuple[Response, dict[str, Any]]:
    enc = ResponsesEncoder(req, command_id=CMD, created_at=1700000000, model="skulk/echo", emit=False)
    assert asyncio.run(enc.collect(_aiter(chunks))) is None
    raw = enc.response()
    return Response.model_validate(raw, strict=False), raw


def stream(req: ResponsesRequest, chunks: list[Chunk]) -> tuple[list[dict[str, Any]], str]:
    """The SSE text of a whole stream, checked event by event against the SDK's event types."""
    enc = ResponsesEncoder(req, command_id=CMD, created_at=1700000000, model="skulk/echo")

    async def run() -> str:
        text = enc.start()
        async for piece in enc.events(_aiter(chunks)):
            text += piece
        return text

    text = asyncio.run(run())
    events: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[len("data: ") :])
        assert event_line[len("event: ") :] == data["type"]
        if data["type"] != "error":
            EVENTS.validate_python(data)  # every field the SDK type requires, with the right types
        events.append(data)
    assert "[DONE]" not in text
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events, text


def sdk_final(events: list[dict[str, Any]], tools: Any = omit) -> Any:
    """What `client.responses.stream(...).get_final_response()` would return for these events."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=tools, text_format=omit)
    for data in events:
        state.handle_event(EVENTS.validate_python(data))
    return state._completed_response


def test_non_stream_text_validates_against_the_sdk() -> None:
    resp, raw = non_stream(request(), tokens("hello", " big", " world"))
    assert resp.id == f"resp_{CMD}" and resp.object == "response" and resp.status == "completed"
    assert resp.output_text == "hello big world"
    (msg,) = resp.output
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.status == "completed"
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (4, 3, 7)
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.incomplete_details is None and resp.error is None
    for key in (
        "created_at",
        "completed_at",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "text",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "max_tool_calls",
        "background",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
    ):
        assert key in raw, key
    assert raw["text"]["format"]["type"] == "text"


def test_non_stream_truncation_is_incomplete() -> None:
    resp, _ = non_stream(request(max_output_tokens=2), tokens("a", " b", reason="length"))
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    msg = resp.output[0]
    assert isinstance(msg, ResponseOutputMessage) and msg.status == "incomplete"
    assert resp.output_text == "a b"


def test_non_stream_function_call() -> None:
    resp, raw = non_stream(request(tools=[{"type": "function", "name": "get_weather"}]), [TOOL])
    (call,) = resp.output
    assert call.type == "function_call"
    assert call.id is not None and call.id.startswith("fc_")
    assert (call.call_id, call.name, call.status) == ("call_9", "get_weather", "completed")
    assert isinstance(raw["output"][0]["arguments"], str)
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert resp.status == "completed" and resp.output_text == ""
    assert raw["tools"][0]["name"] == "get_weather"


def test_reasoning_items() -> None:
    resp, _ = non_stream(request(reasoning={"effort": "high"}), tokens("think", " more", "Answer", reasoning=2))
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    rs = resp.output[0]
    assert isinstance(rs, ResponseReasoningItem)
    assert rs.id.startswith("rs_") and rs.content is not None and rs.content[0].text == "think more"
    assert resp.output_text == "Answer"
    assert resp.usage is not None and resp.usage.output_tokens_details.reasoning_tokens == 2
    assert resp.reasoning is not None and resp.reasoning.effort == "high"

    events, _ = stream(request(), tokens("think", "Answer", reasoning=1))
    types = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    final = sdk_final(events)
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == "Answer"


def test_stream_lifecycle_and_identities() -> None:
    events, _ = stream(request(), tokens("one", " two", " three"))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert {e["response"]["id"] for e in events if "response" in e} == {f"resp_{CMD}"}
    assert events[0]["response"]["output"] == [] and events[0]["response"]["status"] == "in_progress"
    item_id = events[2]["item"]["id"]
    assert events[2]["item"]["content"] == []
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    for e in events[3:9]:
        assert (e["item_id"], e["output_index"], e["content_index"]) == (item_id, 0, 0)
    assert [e["delta"] for e in events[4:7]] == ["one", " two", " three"]
    assert events[7]["text"] == "one two three"
    assert events[9]["item"]["id"] == item_id
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["output"][0]["id"] == item_id
    assert completed["usage"]["output_tokens"] == 3
    final = sdk_final(events)
    assert final.output_text == "one two three" and final.id == f"resp_{CMD}"


def test_stream_function_call() -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}]
    events, _ = stream(request(tools=tools), [TOOL])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["call_id"] == "call_9"
    assert events[3]["delta"] == '{"city":"Paris"}' and events[3]["item_id"] == added["id"]
    assert events[4]["arguments"] == '{"city":"Paris"}' and events[4]["name"] == "get_weather"
    final = sdk_final(events, tools)
    (call,) = final.output
    assert call.call_id == "call_9" and json.loads(call.arguments) == {"city": "Paris"}


def test_stream_text_then_tool_call_are_two_items() -> None:
    chunks: list[Chunk] = [TokenChunk(command_id=CMD, seq=0, text="let me check"), TOOL]
    events, _ = stream(request(tools=[{"type": "function", "name": "get_weather"}]), chunks)
    final = sdk_final(events)
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1]


def test_stream_truncation_ends_incomplete() -> None:
    events, _ = stream(request(max_output_tokens=1), tokens("a", reason="length"))
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    assert "response.completed" not in [e["type"] for e in events]


def test_stream_logprobs() -> None:
    lp = TokenLogprob(token="hi", logprob=-0.5, bytes=(104, 105), top_logprobs=(TopLogprob(token="hi", logprob=-0.5),))
    chunks: list[Chunk] = [TokenChunk(command_id=CMD, seq=0, text="hi", logprobs=(lp,)), *tokens()[-1:]]
    events, _ = stream(request(include=["message.output_text.logprobs"], top_logprobs=1), chunks)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["token"] == "hi" and delta["logprobs"][0]["bytes"] == [104, 105]
    part = events[-1]["response"]["output"][0]["content"][0]
    assert part["logprobs"][0]["logprob"] == -0.5 and part["logprobs"][0]["top_logprobs"][0]["token"] == "hi"


def test_stream_error_mid_stream() -> None:
    chunks: list[Chunk] = [
        TokenChunk(command_id=CMD, seq=0, text="par"),
        ErrorChunk(command_id=CMD, seq=1, message="the runner died", code="runner_failed"),
    ]
    events, _ = stream(request(), chunks)
    types = [e["type"] for e in events]
    assert types[-2:] == ["error", "response.failed"]
    error = events[-2]
    assert error["message"] == "the runner died" and error["code"] == "runner_failed"
    assert error["error"]["message"] == "the runner died"  # the nested shape the Python SDK raises on
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "the runner died"
    assert failed["output"][0]["status"] == "incomplete"
    Response.model_validate(failed)


def test_non_stream_error_is_returned() -> None:
    enc = ResponsesEncoder(request(), command_id=CMD, created_at=1, model="m", emit=False)
    chunks: list[Chunk] = [ErrorChunk(command_id=CMD, seq=0, message="boom")]
    got = asyncio.run(enc.collect(_aiter(chunks)))
    assert got is not None and got.message == "boom"


def test_late_error_after_keepalives_is_a_failed_response() -> None:
    """A stream that had to wait already sent its 200: a late InferenceError ends it as response.failed."""
    from skulk_api_control.dispatch import InferenceError
    from skulk_api_control.streaming import Dispatch
    from skulk_api_openai.responses_routes import _responses_sse

    req = request()

    async def late() -> Any:
        await asyncio.sleep(0.05)
        raise InferenceError(400, "prompt too long", code="context_length_exceeded")

    def encoder(cid: str) -> ResponsesEncoder:
        return ResponsesEncoder(req, command_id=cid, created_at=1, model="skulk/echo")

    async def run() -> str:
        text = ""
        async for piece in _responses_sse(Dispatch(late()), encoder, CMD, 0.01):
            text += piece
        return text

    text = asyncio.run(run())
    assert text.startswith(": keep-alive\n\n")
    blocks = [b for b in text.split("\n\n") if b and not b.startswith(":")]
    types = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    assert types == ["response.created", "response.in_progress", "error", "response.failed"]
    error = json.loads(blocks[2].split("\n")[1].removeprefix("data: "))
    assert error["code"] == "context_length_exceeded" and error["error"]["message"] == "prompt too long"
    failed = json.loads(blocks[3].split("\n")[1].removeprefix("data: "))
    assert failed["response"]["id"] == f"resp_{CMD}" and failed["response"]["status"] == "failed"
