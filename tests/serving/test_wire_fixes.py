"""Issue [llama] wire misses, each through the official Python SDK that shows it, against a real echo node.

The echo engine is deterministic (it answers with the last user message; `/think A | B` streams A as
reasoning and B as the answer), so every assert here is exact. The same fixes against llama.cpp
and the JavaScript SDKs are in `test_llama_constrained.py` and `tests/js_sdks`.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from skulk_testing.echo_node import ECHO, WEATHER, WEATHER_TOOLS
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": WEATHER_TOOLS[0]["function"]["parameters"],
    }
]
THINK = "/think first I weigh it | the answer is four"


@pytest.fixture(scope="module")
def node(shared_echo_node: NodeProcess) -> NodeProcess:
    """The run's shared echo node (skulk_testing): these tests only send requests."""
    return shared_echo_node


@pytest.fixture(scope="module")
def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def an(node: NodeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def ol(node: NodeProcess) -> ollama.Client:
    return ollama.Client(host=node.url, timeout=30)


# --- Anthropic ------------------------------------------------------------------------------------


def test_anthropic_usage_has_the_required_nullable_keys(an: anthropic.Anthropic) -> None:
    msg = an.messages.create(model=ECHO, max_tokens=20, messages=[{"role": "user", "content": "hello there"}])
    for key in ("inference_geo", "output_tokens_details", "cache_creation", "server_tool_use", "service_tier"):
        assert key in msg.usage.model_fields_set, key  # sent (as null), not just defaulted by the SDK
    with an.messages.stream(model=ECHO, max_tokens=20, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert "inference_geo" in final.usage.model_fields_set and final.usage.output_tokens > 0


def test_anthropic_tool_use_blocks_carry_a_direct_caller_never_null(an: anthropic.Anthropic, node: NodeProcess) -> None:
    """The specification requires `caller` (default direct); `caller: null` broke the Vercel AI SDK."""
    msg = an.messages.create(
        model=ECHO, max_tokens=20, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": WEATHER}]
    )
    block = next(b for b in msg.content if b.type == "tool_use")
    assert block.input == {"city": "Paris"}
    assert block.model_dump().get("caller") == {"type": "direct"}
    raw = httpx.post(
        node.url + "/v1/messages",
        headers={"anthropic-version": "2023-06-01", "x-api-key": "x"},
        json={"model": ECHO, "max_tokens": 20, "stream": True, "tools": ANTHROPIC_TOOLS,
              "messages": [{"role": "user", "content": WEATHER}]},
        timeout=30,
    ).text  # fmt: skip
    assert '"tool_use"' in raw and '"caller":{"type":"direct"}' in raw.replace(" ", "") and '"caller":null' not in raw


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_matched_stop_sequence_is_reported(an: anthropic.Anthropic, stream: bool) -> None:
    kwargs: dict[str, Any] = {
        "model": ECHO,
        "max_tokens": 50,
        "stop_sequences": ["never", "fox jumps"],
        "messages": [{"role": "user", "content": "the quick brown fox jumps over the dog"}],
    }
    if stream:
        with an.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = an.messages.create(**kwargs)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "fox jumps"
    assert "".join(b.text for b in msg.content if b.type == "text") == "the quick brown "
    unmatched = an.messages.create(**{**kwargs, "stop_sequences": ["zebra"]})
    assert unmatched.stop_reason == "end_turn" and unmatched.stop_sequence is None


# --- OpenAI Responses -----------------------------------------------------------------------------


def test_responses_report_the_sampling_values_used(oa: openai.OpenAI) -> None:
    default = oa.responses.create(model=ECHO, input="hello there")
    assert (default.temperature, default.top_p) == (1.0, 1.0)
    chosen = oa.responses.create(model=ECHO, input="hello there", temperature=0.2, top_p=0.5)
    assert (chosen.temperature, chosen.top_p) == (0.2, 0.5)


def test_responses_tool_round_trip_answers(oa: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER_TOOLS[0]["function"]["parameters"]}]
    first = oa.responses.create(model=ECHO, input=WEATHER, tools=tools)
    call = next(item for item in first.output if item.type == "function_call")
    follow: Any = [
        {"role": "user", "content": WEATHER.replace("/tool", "weather for")},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"},
    ]
    final = oa.responses.create(model=ECHO, input=follow, tools=tools)
    assert final.output and final.output_text.startswith("weather for get_weather")


# --- Ollama ---------------------------------------------------------------------------------------


def test_ollama_generate_context_continues_the_conversation(ol: ollama.Client) -> None:
    first = ol.generate(model=ECHO, prompt="alpha beta")
    assert first.context and first.response == "alpha beta"
    streamed = list(ol.generate(model=ECHO, prompt="alpha beta", stream=True))
    assert streamed[-1].done and streamed[-1].context == first.context
    second = ol.generate(model=ECHO, prompt="gamma", context=first.context)
    assert second.response == "gamma" and len(second.context) > len(first.context)
    # the earlier turns reached the engine: the prompt is longer than the new words alone
    alone = ol.generate(model=ECHO, prompt="gamma")
    assert second.prompt_eval_count > alone.prompt_eval_count
    with pytest.raises(ollama.ResponseError) as err:
        ol.generate(model=ECHO, prompt="gamma", context=[1, 2, 3])
    assert err.value.status_code == 400 and "context" in str(err.value)


# --- every accepted name is listed ----------------------------------------------------------------


def test_short_model_names_are_listed_everywhere(oa: openai.OpenAI, an: anthropic.Anthropic, ol: ollama.Client) -> None:
    short = ECHO.rsplit("/", 1)[-1]
    ids = [m.id for m in oa.models.list()]
    assert ECHO in ids and short in ids
    assert oa.models.retrieve(short).id == short
    assert short in [m.id for m in an.models.list()]
    tags = [m.model for m in ol.list().models]
    assert f"{short}:latest" in tags and f"{ECHO}:latest" in tags
    for name in (ECHO, short):  # both listed names are accepted
        assert oa.chat.completions.create(model=name, messages=[{"role": "user", "content": "ok"}]).choices


# --- reasoning in each API's shape ----------------------------------------------------------------


def test_reasoning_openai_chat(oa: openai.OpenAI) -> None:
    msgs: Any = [{"role": "user", "content": THINK}]
    answer = oa.chat.completions.create(model=ECHO, messages=msgs)
    message: Any = answer.choices[0].message
    assert message.content == "the answer is four" and message.reasoning_content == "first I weigh it"
    reasoning, content = "", ""
    for chunk in oa.chat.completions.create(model=ECHO, messages=msgs, stream=True):
        if chunk.choices:
            delta: Any = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert (reasoning, content) == ("first I weigh it", "the answer is four")
    off = oa.chat.completions.create(model=ECHO, messages=msgs, reasoning_effort="none")
    assert getattr(off.choices[0].message, "reasoning_content", None) in (None, "")


def test_reasoning_openai_responses(oa: openai.OpenAI) -> None:
    r = oa.responses.create(model=ECHO, input=THINK)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"] and r.output_text == "the answer is four"
    item: Any = r.output[0]
    assert "".join(c.text for c in (item.content or item.summary)) == "first I weigh it"
    with oa.responses.stream(model=ECHO, input=THINK) as s:
        final = s.get_final_response()
    assert [i.type for i in final.output] == ["reasoning", "message"] and final.output_text == "the answer is four"


def test_reasoning_anthropic(an: anthropic.Anthropic) -> None:
    kwargs: Any = {"model": ECHO, "max_tokens": 50, "messages": [{"role": "user", "content": THINK}]}
    msg = an.messages.create(**kwargs)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "first I weigh it" and msg.content[1].text == "the answer is four"
    with an.messages.stream(**kwargs) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    off = an.messages.create(**kwargs, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


def test_reasoning_ollama(ol: ollama.Client) -> None:
    chat = ol.chat(model=ECHO, messages=[{"role": "user", "content": THINK}])
    assert chat.message.thinking == "first I weigh it" and chat.message.content == "the answer is four"
    parts = list(ol.chat(model=ECHO, messages=[{"role": "user", "content": THINK}], stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "first I weigh it"
    gen = ol.generate(model=ECHO, prompt=THINK, think=False)
    assert not gen.thinking and gen.response == "the answer is four"


# --- constrained output: what cannot be enforced is a clear 400 -----------------------------------

BAD_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}


def test_unsupported_schema_features_are_a_400_everywhere(
    oa: openai.OpenAI, an: anthropic.Anthropic, ol: ollama.Client
) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "n", "schema": BAD_SCHEMA}}
    with pytest.raises(openai.BadRequestError) as e1:
        oa.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "x"}], response_format=fmt)
    assert "multipleOf" in e1.value.message
    text: Any = {"format": {"type": "json_schema", "name": "n", "schema": BAD_SCHEMA}}
    with pytest.raises(openai.BadRequestError) as e2:
        oa.responses.create(model=ECHO, input="x", text=text)
    assert "multipleOf" in e2.value.message
    with pytest.raises(anthropic.BadRequestError) as e3:
        an.messages.create(
            model=ECHO,
            max_tokens=10,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"output_format": {"type": "json_schema", "schema": BAD_SCHEMA}},
        )
    assert "multipleOf" in str(e3.value)
    with pytest.raises(ollama.ResponseError) as e4:
        ol.chat(model=ECHO, messages=[{"role": "user", "content": "x"}], format=BAD_SCHEMA)
    assert e4.value.status_code == 400 and "multipleOf" in str(e4.value)
    remote: Any = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "https://x/y.json"}}}
    with pytest.raises(openai.BadRequestError, match="local references"):
        oa.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "x"}], response_format=remote)


def test_supported_formats_reach_the_engine(oa: openai.OpenAI) -> None:
    """A valid format is accepted (the echo engine ignores it): only llama.cpp enforces it."""
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True}}
    answer = oa.chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "fine"}], response_format=fmt)
    assert answer.choices[0].message.content == "fine"
    assert json.loads(answer.model_dump_json())["choices"][0]["finish_reason"] == "stop"
