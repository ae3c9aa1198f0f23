"""JSON mode that ends (bounded_json.py): the grammar's shape, and SmolLM2 on both backends.

SmolLM2 asked for "any JSON object" used to loop (`{"name":",","name":",",...`) until max_tokens cut
the object off; under the bounded grammar every answer here is closed and parses.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from skulk_engine_llamacpp import constraints
from skulk_engine_llamacpp.bounded_json import (
    DEFAULT_BOUNDS,
    JsonBounds,
    gbnf_bounded_object,
    is_any_object,
    lark_bounded_object,
)
from skulk_engine_llamacpp.constraints import Constraint, format_schema
from skulk_engine_llamacpp.events import Finish, TextDelta

# temperature 0: Paris is a long answer whose keys repeat (`windSpeedInhoc`, ...) that the bounds close
# after about 1,200 tokens; the others are short
PROMPTS = [
    "Describe the weather in Paris as JSON.",
    "List three fruits as JSON.",
    "Return JSON with name and age of a person.",
]


def test_json_object_and_an_open_object_schema_get_the_bounded_grammar() -> None:
    assert is_any_object(format_schema({"type": "json_object"}))
    assert is_any_object({"type": "object", "additionalProperties": True})
    assert not is_any_object({"type": "object", "properties": {"a": {"type": "string"}}})
    assert not is_any_object({"type": "array"})
    assert constraints.lark_json({"type": "object"}) == lark_bounded_object()
    assert "%json" in constraints.lark_json({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert constraints.gbnf_json({"type": "object"}) == gbnf_bounded_object()


@pytest.mark.parametrize("spell", [lark_bounded_object, gbnf_bounded_object])
def test_every_bound_is_in_the_grammar(spell: Any) -> None:
    b = JsonBounds(max_depth=3, max_keys=5, max_items=7, max_string=11, max_key=13, max_digits=6)
    grammar = spell(b)
    assert "{0,4}" in grammar and "{0,6}" in grammar  # pairs and items after the first
    assert "{0,11}" in grammar and "{1,13}" in grammar  # string and key characters
    assert "obj2" in grammar and "obj3" not in grammar  # three levels of containers
    assert "arr0" not in grammar  # the top is an object


def test_the_default_bounds_are_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "api.md").read_text()
    for value in (DEFAULT_BOUNDS.max_depth, DEFAULT_BOUNDS.max_keys, DEFAULT_BOUNDS.max_string):
        assert f"{value}" in doc


def _run(backend: Any, prompt: str) -> tuple[str, Finish]:
    text, finish = "", None
    for event in backend.chat(
        [{"role": "user", "content": prompt}],
        sampling={"max_tokens": 2000, "temperature": 0.0},
        constraint=Constraint(response_format={"type": "json_object"}),
    ):
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, Finish):
            finish = event
    assert finish is not None
    return text, finish


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_smollm2_json_object_ends_and_parses_on_the_server(chat_server: Any, prompt: str) -> None:
    text, finish = _run(chat_server, prompt)
    assert finish.reason == "stop", text[-200:]
    assert isinstance(json.loads(text), dict)


@pytest.mark.slow
def test_smollm2_json_object_ends_and_parses_in_process(inproc: Any) -> None:
    text, finish = _run(inproc, PROMPTS[2])
    assert finish.reason == "stop", text[-200:]
    assert isinstance(json.loads(text), dict)
