"""Unit tests of the fallback tool-call parser (no model needed)."""

from __future__ import annotations

import json
import random

import pytest
from skulk_engine_llamacpp.events import ToolCallDelta
from skulk_engine_llamacpp.toolcalls import ToolCallStreamParser, parse_tool_calls

TOOLS = {"get_weather", "search"}


def stream(text: str, chunks: list[int] | None = None, tools=TOOLS, allow_bare=True):
    """Feed text in pieces (sizes from chunks, else 1 char) and collect items."""
    p = ToolCallStreamParser(tools, allow_bare)
    items: list = []
    i = 0
    sizes = iter(chunks or [])
    while i < len(text):
        n = next(sizes, 1)
        items += p.feed(text[i : i + n])
        i += n
    items += p.finish()
    prose = "".join(x for x in items if isinstance(x, str))
    calls = [x for x in items if isinstance(x, ToolCallDelta)]
    return prose, calls


def args(call: ToolCallDelta) -> dict:
    return json.loads(call.arguments_json)


def test_plain_prose_untouched():
    text = "Paris is sunny today. I think 3 < 4 and a <b>bold</b> tag is fine."
    assert parse_tool_calls(text, TOOLS).content == text
    assert stream(text) == (text, [])


def test_tagged_call():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    prose, calls = stream(text)
    assert prose.strip() == "Let me check."
    assert [c.name for c in calls] == ["get_weather"]
    assert args(calls[0]) == {"city": "Paris"}
    assert calls[0].id.startswith("call_")


def test_two_tagged_calls_and_list_form():
    text = (
        '<tool_call>{"name": "search", "arguments": {"q": "a"}}</tool_call>\n'
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}},'
        ' {"name": "search", "parameters": {"q": "b"}}]</tool_call>'
    )
    prose, calls = stream(text)
    assert prose.strip() == ""
    assert [c.name for c in calls] == ["search", "get_weather", "search"]
    assert args(calls[2]) == {"q": "b"}


def test_missing_close_tag_at_end_and_before_next_call():
    text = (
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}\n'
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'
    )
    prose, calls = stream(text)
    assert prose.strip() == ""
    assert [c.name for c in calls] == ["search", "get_weather"]
    assert args(calls[1]) == {"city": "Oslo"}


def test_missing_close_tag_followed_by_prose():
    text = '<tool_call>{"name": "search", "arguments": {"q": "x"}} and then some words'
    prose, calls = stream(text, chunks=[5] * 40)
    assert [c.name for c in calls] == ["search"]
    assert prose.strip() == "and then some words"


def test_openai_and_generic_shapes():
    for body in (
        '{"function": {"name": "search", "arguments": {"q": 1}}}',
        '{"tool_call": {"name": "search", "arguments": {"q": 1}}}',
        '{"tool_calls": [{"name": "search", "arguments": {"q": 1}}]}',
    ):
        parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
        assert [c.name for c in parsed.tool_calls] == ["search"], body
        assert args(parsed.tool_calls[0]) == {"q": 1}


def test_bare_json_whole_message_known_tool():
    parsed = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Paris"}}', TOOLS)
    assert parsed.content == "" and parsed.tool_calls[0].name == "get_weather"
    fenced = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    assert parse_tool_calls(fenced, TOOLS).tool_calls[0].name == "get_weather"


def test_bare_json_is_prose_when_not_a_known_call():
    for text in (
        '{"name": "Alice", "age": 3}',  # JSON answer, no arguments key -> still prose
        '{"name": "unknown_tool", "arguments": {}}',
        'Here: {"name": "get_weather", "arguments": {"city": "Paris"}} done',
        "[1, 2, 3]",
        "```python\nprint(1)\n```",
    ):
        parsed = parse_tool_calls(text, TOOLS)
        assert parsed.tool_calls == (), text
        assert parsed.content == text


def test_bare_json_disabled():
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert parse_tool_calls(text, TOOLS, allow_bare_json=False).content == text


def test_malformed_tag_keeps_words_drops_tags():
    prose, calls = stream("<tool_call>I am not json</tool_call> ok")
    assert calls == []
    assert prose == "I am not json ok"


def test_truncated_call_is_dropped_not_leaked():
    prose, calls = stream('Sure. <tool_call>\n{"name": "get_weather", "argum')
    assert calls == []
    assert prose == "Sure. "


def test_hallucinated_tool_response_ends_text():
    prose, calls = stream('It is <tool_response>{"temp": 3}</tool_response> sunny')
    assert prose == "It is " and calls == []


def test_chatml_markers_stripped_and_partial_markers_held():
    p = ToolCallStreamParser(TOOLS)
    assert p.feed("Hello <tool_") == ["Hello "]  # held back: could be a tag
    assert p.feed("box> world<|im_end|>") == ["<tool_box> world"]
    assert p.finish() == []
    prose, _ = stream("Bye <|im_start|>")
    assert prose == "Bye "
    prose, _ = stream("a < b")  # a lone '<' at the end is prose
    assert prose == "a < b"


def test_prose_is_released_promptly():
    p = ToolCallStreamParser(TOOLS)
    assert p.feed("The") == ["The"]
    assert p.feed(" weather") == [" weather"]


@pytest.mark.parametrize("seed", range(20))
def test_random_chunking_is_equivalent(seed):
    rng = random.Random(seed)
    text = (
        'Checking.<tool_call>\n{"name": "search", "arguments": {"q": "x<y"}}\n</tool_call>'
        'Done <b>now</b>.<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    )
    whole = parse_tool_calls(text, TOOLS)
    chunks = [rng.randint(1, 7) for _ in range(len(text))]
    prose, calls = stream(text, chunks)
    assert prose == "Checking.Done <b>now</b>."
    assert [c.name for c in calls] == [c.name for c in whole.tool_calls] == ["search", "get_weather"]
    assert args(calls[0]) == {"q": "x<y"}
