"""Fast tests of the pieces under constrained output, reasoning and admission (no model needed)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from skulk_api_control import requests_common
from skulk_engine_llamacpp import constraints
from skulk_engine_llamacpp.admission import TokenGate
from skulk_engine_llamacpp.constraints import Constraint, call_schema, closed, format_schema, parse_tool_choice
from skulk_engine_llamacpp.reasoning import ThinkSplitter, split_reasoning
from skulk_kernel.api import ChatMessage, TextGenerationParams, ToolSpec

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def params(**kw: object) -> TextGenerationParams:
    return TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),), **kw)  # type: ignore[arg-type]


# --- the carried constraint ------------------------------------------------------------------------


def test_the_prefix_is_spelled_alike_on_both_sides() -> None:
    assert constraints.CONSTRAINT_PREFIX == requests_common.CONSTRAINT_PREFIX


def test_a_response_format_round_trips_through_tool_choice() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}}
    carried = requests_common.constrain(params(tools=(ToolSpec(name="t"),), tool_choice="auto"), fmt)
    got = parse_tool_choice(carried.tool_choice)
    assert got == Constraint("auto", {"type": "json_schema", "schema": {"type": "object"}, "strict": True})
    assert not got.forces_call
    assert parse_tool_choice("required").forces_call and parse_tool_choice("add").forced_name == "add"
    assert parse_tool_choice(None) == Constraint() and not parse_tool_choice("auto").forces_call
    assert requests_common.constrain(params(), {"type": "text"}).tool_choice is None
    none = requests_common.constrain(params(tools=(ToolSpec(name="t"),), tool_choice="none"), {"type": "json_object"})
    assert none.tools == ()  # "none" stays none for engines that do not read the carried format


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ({"type": "integer", "multipleOf": 3}, "multipleOf"),
        ({"if": {"type": "string"}}, "'if'"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"$ref": "https://example.com/s.json"}, "local references"),
        ({"type": "string", "pattern": "(?<=a)b"}, "lookaround"),
        ({"type": "string", "format": "hostname"}, "format 'hostname'"),
        ({"type": "decimal"}, "unknown type"),
        ({"properties": {"a": {"not": {"type": "null"}}}}, "properties.a.not"),
    ],
)
def test_unsupported_schema_features_are_named(schema: dict, complaint: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(requests_common.ConstraintError, match=complaint.replace("(", r"\(").replace("$", r"\$")):
        requests_common.constrain(params(), fmt)


def test_forced_tool_choice_and_a_format_conflict() -> None:
    with pytest.raises(requests_common.ConstraintError, match="cannot be combined"):
        requests_common.constrain(params(tools=(ToolSpec(name="t"),), tool_choice="required"), {"type": "json_object"})


def test_schemas_are_closed_unless_they_allow_extra_keys() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"enum": [1]}}}}}
    shut = closed(schema)
    assert shut["additionalProperties"] is False and shut["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is not modified
    assert format_schema({"type": "json_schema", "schema": schema, "strict": False}) == shut
    keeps = {"type": "object", "additionalProperties": True}
    assert format_schema({"type": "json_schema", "schema": keeps}) == keeps
    assert format_schema({"type": "json_object"}) == {"type": "object"}
    one = call_schema([WEATHER, ADD], "add")
    assert one["properties"]["name"] == {"const": "add"}
    both = call_schema([WEATHER, ADD])
    assert [o["properties"]["name"]["const"] for o in both["anyOf"]] == ["get_weather", "add"]
    with pytest.raises(ValueError, match="not among the offered tools"):
        call_schema([WEATHER], "nope")


def test_integers_and_numbers_get_bounds_that_end_them_unless_they_have_their_own() -> None:
    """A bound on a value does not end a number (`10.000...` is at most 10): a number also gets a
    finest step, which llguidance turns into a bound on the digits after the point."""
    shut = closed({"type": "object", "properties": {"n": {"type": "number", "maximum": 10}, "i": {"type": "integer"}}})
    assert shut["properties"]["n"] == {
        "type": "number",
        "minimum": -constraints.SAFE_INTEGER,
        "maximum": 10,
        "multipleOf": constraints.NUMBER_STEP,
    }
    assert shut["properties"]["i"] == {
        "type": "integer",
        "minimum": -constraints.SAFE_INTEGER,
        "maximum": constraints.SAFE_INTEGER,
    }
    own = {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}
    assert closed(own) == own


def test_grammars_embed_the_schema_compactly() -> None:
    lark = constraints.lark_call(call_schema([WEATHER]))
    assert lark.startswith("%llguidance") and '"<tool_call>\\n"' in lark and "%json" in lark
    body = json.loads(lark.split("call: %json ", 1)[1])
    assert body["x-guidance"]["whitespace_flexible"] is False
    typed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(constraints.lark_json(typed).split("%json ", 1)[1])["properties"] == typed["properties"]
    assert "%json" not in constraints.lark_json({"type": "object"})  # any object: the bounded grammar


def test_gbnf_call_wraps_the_converters_rules() -> None:
    pytest.importorskip("llama_cpp")
    gbnf = constraints.gbnf_call(call_schema([WEATHER]))
    assert gbnf.startswith('root ::= "<tool_call>\\n" call-json "\\n</tool_call>"')
    assert gbnf.count("root ::=") == 1 and "call-json ::=" in gbnf


# --- reasoning ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        ("<think>\nweigh it</think>\n\nfour", False, ("weigh it", "four")),
        ("  <think>a</think>b", False, ("a", "b")),
        ("no markers", False, ("", "no markers")),
        ("answer <think>not reasoning</think>", False, ("", "answer <think>not reasoning</think>")),
        ("weigh it</think>four", True, ("weigh it", "four")),
        ("<think>cut off", False, ("cut off", "")),
        ("<thin", False, ("", "<thin")),
    ],
)
def test_split_reasoning(text: str, inside: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, inside) == expected


def test_the_splitter_never_leaks_a_marker_one_character_at_a_time() -> None:
    text = "<think>step one, step two</think>The answer."
    s = ThinkSplitter()
    parts = [p for ch in text for p in s.feed(ch)] + s.finish()
    assert "".join(t for r, t in parts if r) == "step one, step two"
    assert "".join(t for r, t in parts if not r) == "The answer."
    assert not any("<" in t for _, t in parts)


# --- the token gate -------------------------------------------------------------------------------


def test_the_gate_never_overcommits_and_admits_in_arrival_order() -> None:
    gate = TokenGate(pool=1000, poll_s=0.005)
    order: list[int] = []
    lock = threading.Lock()
    peak = [0]

    def request(i: int, need: int) -> None:
        with gate.reserve(need) as ok:
            assert ok
            with lock:
                order.append(i)
                peak[0] = max(peak[0], gate.reserved)
            time.sleep(0.02)

    threads = []
    for i, need in enumerate([600, 600, 100, 900, 50, 5000]):
        t = threading.Thread(target=request, args=(i, need))
        t.start()
        threads.append(t)
        time.sleep(0.003)  # arrive in this order
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4, 5]  # FIFO: the small ones did not overtake the 600 and 900 ones
    assert peak[0] <= 1000 and gate.peak <= 1000 and gate.reserved == 0 and gate.running == 0


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    gate = TokenGate(pool=10, poll_s=0.005)
    stop = threading.Event()
    results: list[bool] = []
    with gate.reserve(10):
        t = threading.Thread(target=lambda: results.append(gate.reserve(5, stop.is_set).__enter__()))
        t.start()
        time.sleep(0.05)
        assert gate.waiting == 1
        stop.set()
        t.join(5)
    assert results == [False] and gate.waiting == 0 and gate.reserved == 0
    with gate.reserve(10) as ok:
        assert ok
