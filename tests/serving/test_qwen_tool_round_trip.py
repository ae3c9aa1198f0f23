"""Issue [llama] acceptance 2: a Qwen tool round trip through all four APIs on a real node.

The run's shared Qwen node (``qwen_node``, tests/conftest.py) serves the optional
Qwen2.5-Coder-0.5B-Instruct card (its own chat template, llama.cpp's native parser for its
``<tool_call>`` dialect). Each API: the model is asked something only the tool knows, calls the
tool (``tool_choice`` auto, nothing forces it), the client sends a result the model cannot guess
(a temperature of 23 degrees), and the final answer must be prose that uses it, with no repeated
call. Greedy decoding, so a run is repeatable; every API is used streaming once and not streaming
once across its two turns.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import ollama
import openai
import pytest
from skulk_testing.nodes import NodeProcess

from tests.conftest import QWEN_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

QWEN = QWEN_MODEL
ASK = "What's the weather in Paris right now?"
RESULT = "23 degrees C, sunny"
GREEDY = {"temperature": 0}  # this anthropic SDK has no temperature argument
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Current weather in a city"
WEATHER = {"name": "get_weather", "description": DESCRIPTION, "parameters": PARAMS}
OA_TOOLS: Any = [{"type": "function", "function": WEATHER}]


def uses_result(text: str) -> None:
    assert "23" in text and "<tool" not in text and '"name"' not in text, text


def is_paris_call(name: str, arguments: str | dict[str, Any]) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert name == "get_weather" and "paris" in str(args.get("city", "")).lower(), (name, args)


def test_openai_chat_completions(qwen_node: NodeProcess) -> None:
    oa = openai.OpenAI(base_url=qwen_node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    messages: Any = [{"role": "user", "content": ASK}]
    first = oa.chat.completions.create(model=QWEN, messages=messages, tools=OA_TOOLS, temperature=0, max_tokens=60)
    assert first.choices[0].finish_reason == "tool_calls", first
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    is_paris_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    text, reasons, calls = "", [], 0
    for chunk in oa.chat.completions.create(
        model=QWEN, messages=messages, tools=OA_TOOLS, temperature=0, max_tokens=60, stream=True
    ):
        for c in chunk.choices:
            text += c.delta.content or ""
            calls += len(c.delta.tool_calls or ())
            reasons += [c.finish_reason] if c.finish_reason else []
    assert reasons == ["stop"] and calls == 0, (reasons, text)
    uses_result(text)


def test_openai_responses(qwen_node: NodeProcess) -> None:
    oa = openai.OpenAI(base_url=qwen_node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    tools: Any = [{"type": "function", "name": "get_weather", "description": DESCRIPTION, "parameters": PARAMS}]
    with oa.responses.stream(model=QWEN, input=ASK, tools=tools, temperature=0) as s:
        first = s.get_final_response()
    call = next(i for i in first.output if i.type == "function_call")
    is_paris_call(call.name, call.arguments)
    inputs: Any = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
    ]
    final = oa.responses.create(model=QWEN, input=inputs, tools=tools, temperature=0, max_output_tokens=60)
    assert not [i for i in final.output if i.type == "function_call"], final.output
    uses_result(final.output_text)


def test_anthropic_messages(qwen_node: NodeProcess) -> None:
    an = anthropic.Anthropic(base_url=qwen_node.url, api_key="x", max_retries=0, timeout=300)
    tools: Any = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMS}]
    messages: Any = [{"role": "user", "content": ASK}]
    first = an.messages.create(model=QWEN, max_tokens=60, messages=messages, tools=tools, extra_body=GREEDY)
    assert first.stop_reason == "tool_use", first
    block = next(b for b in first.content if b.type == "tool_use")
    is_paris_call(block.name, block.input)  # type: ignore[arg-type]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": RESULT}]},
    ]
    with an.messages.stream(model=QWEN, max_tokens=60, messages=messages, tools=tools, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and all(b.type == "text" for b in final.content), final
    uses_result("".join(b.text for b in final.content if b.type == "text"))


def test_ollama_chat(qwen_node: NodeProcess) -> None:
    ol = ollama.Client(host=qwen_node.url, timeout=300)
    messages: Any = [{"role": "user", "content": ASK}]
    first = ol.chat(model=QWEN, messages=messages, tools=OA_TOOLS, options={"temperature": 0, "num_predict": 60})
    call = (first.message.tool_calls or [])[0]
    is_paris_call(call.function.name, dict(call.function.arguments))
    messages += [first.message, {"role": "tool", "tool_name": "get_weather", "content": RESULT}]
    text, calls = "", 0
    for part in ol.chat(
        model=QWEN, messages=messages, tools=OA_TOOLS, options={"temperature": 0, "num_predict": 60}, stream=True
    ):
        text += part.message.content or ""
        calls += len(part.message.tool_calls or ())
    assert calls == 0, text
    uses_result(text)


def test_a_forced_call_after_a_result_still_calls(qwen_node: NodeProcess) -> None:
    """The answer turn is the default, not a wall: a client that wants another call forces it."""
    oa = openai.OpenAI(base_url=qwen_node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    messages: Any = [
        {"role": "user", "content": ASK + " And in Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": RESULT},
    ]
    r = oa.chat.completions.create(
        model=QWEN, messages=messages, tools=OA_TOOLS, tool_choice="required", temperature=0, max_tokens=60
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"  # type: ignore[index,union-attr]
