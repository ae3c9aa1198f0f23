"""Constrained output and reasoning on both llama.cpp backends with the real SmolLM2 model.

SmolLM2 (135M) ignores most instructions: unconstrained it answers "give me JSON" in prose and a
tool request in prose. Every assert here holds only because the grammar holds.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from skulk_engine_llamacpp.constraints import Constraint
from skulk_engine_llamacpp.events import Finish, ReasoningDelta, TextDelta, ToolCallDelta
from skulk_engine_llamacpp.templates import chatml_tools_template

pytestmark = pytest.mark.slow

S = {"type": "string", "maxLength": 24}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": S}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["score"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"]},
    {
        "type": "object",
        "properties": {"pts": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}},
        "required": ["pts"],
    },
    {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"id": {"type": "integer"}, "name": S}, "required": ["id", "name"]}
        },
        "required": ["user"],
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "object", "properties": {"c": {"enum": [1, 2, 3]}}, "required": ["c"]}},
                "required": ["b"],
            }
        },
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"sku": S, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"status": {"const": "done"}, "n": {"type": "integer"}},
        "required": ["status", "n"],
    },
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["v"]},
    {"type": "object", "properties": {"v": {"type": ["string", "null"], "maxLength": 10}}, "required": ["v"]},
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]},
    {"type": "object", "properties": {"name": S, "nick": S}, "required": ["name"]},
    {
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
        "required": ["from", "to"],
    },
    {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {"mode": {"enum": ["fast", "slow"]}, "level": {"enum": [1, 2]}},
        "required": ["mode", "level"],
    },
    {
        "type": "object",
        "properties": {
            "title": S,
            "meta": {
                "type": "object",
                "properties": {
                    "pages": {"type": "integer"},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                },
                "required": ["pages", "tags"],
            },
        },
        "required": ["title", "meta"],
    },
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": S}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
JOKE = [{"role": "user", "content": "Tell me a joke about cats."}]


def answer(events: list[Any]) -> tuple[str, list[ToolCallDelta], Finish]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    fin = events[-1]
    assert isinstance(fin, Finish)
    return text, calls, fin


def test_twenty_schemas_validate_on_the_server_backend(chat_server: Any) -> None:
    assert len(SCHEMAS) == 20
    for i, schema in enumerate(SCHEMAS):
        jsonschema.Draft202012Validator.check_schema(schema)
        strict = i % 2 == 0  # strict and not
        fmt = {"type": "json_schema", "schema": schema, "strict": strict}
        events = list(
            chat_server.chat(
                [{"role": "user", "content": "Fill in this form with example data."}],
                sampling={"max_tokens": 160, "temperature": 0.2, "seed": i},
                constraint=Constraint(None, fmt),
            )
        )
        text, _, fin = answer(events)
        assert fin.reason == "stop", (i, text)
        jsonschema.validate(json.loads(text), schema)  # raises with the schema number in the trace


def test_a_number_at_its_bound_ends(chat_server: Any) -> None:
    """Led into `10.` under `maximum: 10`, the grammar leaves only zeros, and SmolLM2 wrote them until
    max_tokens (every seed, before numbers got a finest step): now the number ends and parses."""
    schema = {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10}}}
    fmt = {"type": "json_schema", "schema": {**schema, "required": ["score"]}, "strict": True}
    ask = [{"role": "user", "content": 'Repeat exactly: {"score":10.' + "0" * 60}]
    for seed in range(2):
        sampling = {"max_tokens": 160, "temperature": 0.2, "seed": seed}
        text, _, fin = answer(list(chat_server.chat(ask, sampling=sampling, constraint=Constraint(None, fmt))))
        assert fin.reason == "stop", text
        assert json.loads(text)["score"] == 10


def test_json_object_mode_gives_an_object(chat_server: Any) -> None:
    ask = [{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}]
    fmt = {"type": "json_object"}
    text, _, fin = answer(
        list(chat_server.chat(ask, sampling={"max_tokens": 200, "seed": 3}, constraint=Constraint(None, fmt)))
    )
    assert fin.reason == "stop", text
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(("choice", "names"), [("required", {"get_weather", "add"}), ("add", {"add"})])
def test_a_forced_tool_choice_yields_a_valid_call(chat_server: Any, choice: str, names: set[str]) -> None:
    for seed in range(2):
        events = list(
            chat_server.chat(
                JOKE, tools=TOOLS, sampling={"max_tokens": 80, "seed": seed}, constraint=Constraint(choice)
            )
        )
        text, calls, fin = answer(events)
        assert fin.reason == "tool_calls" and len(calls) == 1 and not text.strip()
        call = calls[0]
        assert call.name in names
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.name)
        jsonschema.validate(json.loads(call.arguments_json), schema)


def test_the_answer_after_a_tool_result_is_not_empty(chat_server: Any) -> None:
    msgs = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C and sunny"},
    ]
    for seed in range(3):
        text, _, fin = answer(list(chat_server.chat(msgs, tools=TOOLS, sampling={"max_tokens": 30, "seed": seed})))
        assert text.strip() and "<" not in text[:1], text
        assert fin.reason in ("stop", "length", "tool_calls")


def test_in_process_backend_is_constrained_too(inproc: Any) -> None:
    for schema in (SCHEMAS[7], SCHEMAS[17]):
        fmt = {"type": "json_schema", "schema": schema, "strict": True}
        text, _, fin = answer(list(inproc.chat(JOKE, sampling={"max_tokens": 120}, constraint=Constraint(None, fmt))))
        jsonschema.validate(json.loads(text), schema)
    text, calls, fin = answer(
        list(inproc.chat(JOKE, tools=TOOLS, sampling={"max_tokens": 80}, constraint=Constraint("get_weather")))
    )
    assert fin.reason == "tool_calls" and [c.name for c in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0].arguments_json)["city"], str)


def test_a_template_that_opens_a_think_block_yields_reasoning(smollm2_path: Any) -> None:
    """A template that honours enable_thinking: its generation prompt opens `<think>` unless thinking
    is off. SmolLM2 never closes the block, so with thinking on everything it writes is reasoning."""
    from skulk_engine_llamacpp.server_backend import LlamaServer

    base = chatml_tools_template(None)
    template = base.replace(
        "{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n",
        "{{- '<|im_start|>assistant\\n' -}}{%- if enable_thinking is not defined or enable_thinking -%}"
        "{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}\n",
    )
    assert template != base
    with LlamaServer(smollm2_path, n_parallel=1, chat_template=template, tool_mode="prompt") as srv:
        on = list(srv.chat(JOKE, tools=TOOLS, sampling={"max_tokens": 16, "seed": 1}, enable_thinking=True))
        off = list(srv.chat(JOKE, tools=TOOLS, sampling={"max_tokens": 16, "seed": 1}, enable_thinking=False))
    assert "".join(e.text for e in on if isinstance(e, ReasoningDelta)).strip()
    assert not "".join(e.text for e in on if isinstance(e, TextDelta)).strip()
    assert not [e for e in off if isinstance(e, ReasoningDelta)]
