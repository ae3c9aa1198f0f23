"""Stop strings, reasoning and tool calls out of streamed text, fed in awkward pieces."""

from __future__ import annotations

import json

from skulk_engine_mlx.textparse import Text, TextRouter, tool_call_from_json
from skulk_kernel.api import ToolCall


def feed_all(router: TextRouter, pieces: list[str]) -> list[Text | ToolCall]:
    out: list[Text | ToolCall] = []
    for piece in pieces:
        out += router.feed(piece)
        if router.stopped:
            break
    return out + router.finish()


def text_of(items: list[Text | ToolCall], reasoning: bool = False) -> str:
    return "".join(i.text for i in items if isinstance(i, Text) and i.reasoning == reasoning)


def test_stop_string_is_never_emitted_even_in_part() -> None:
    router = TextRouter(stops=["END"])
    shown: list[str] = []
    for piece in ["Hello E", "N", "D world"]:
        shown += [i.text for i in router.feed(piece) if isinstance(i, Text)]
        assert not any("E" in s and s.endswith("E") for s in shown[1:]), shown
    assert router.stopped
    assert "".join(shown) == "Hello "


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    router = TextRouter(stops=["</answer>"])
    items = feed_all(router, ["a <", "/ans", "wer? no"])
    assert text_of(items) == "a </answer? no" and not router.stopped


def test_reasoning_is_split_from_content() -> None:
    items = feed_all(TextRouter(), ["<thi", "nk>let me think</th", "ink>The answer is 4."])
    assert text_of(items, reasoning=True) == "let me think"
    assert text_of(items) == "The answer is 4."


def test_reasoning_opened_by_the_template() -> None:
    items = feed_all(TextRouter(thinking=True), ["hmm</think>", "done"])
    assert text_of(items, reasoning=True) == "hmm" and text_of(items) == "done"


def test_tool_call_is_parsed_and_tags_never_leak() -> None:
    router = TextRouter(tools=["get_weather"])
    items = feed_all(
        router,
        ["Let me check. <tool", '_call>\n{"name": "get_weather", "argu', 'ments": {"city": "Paris"}}\n</tool_call>'],
    )
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert text_of(items) == "Let me check. "


def test_unclosed_tool_call_at_the_end_still_counts() -> None:
    items = feed_all(TextRouter(tools=["f"]), ['<tool_call>{"name": "f", "arguments": {}}'])
    assert [i.name for i in items if isinstance(i, ToolCall)] == ["f"]


def test_without_tools_tags_are_plain_text() -> None:
    items = feed_all(TextRouter(), ["<tool_call>x</tool_call>"])
    assert text_of(items) == "<tool_call>x</tool_call>"


def test_unknown_tool_or_bad_json_is_not_a_call() -> None:
    assert tool_call_from_json('{"name": "other", "arguments": {}}', frozenset({"f"})) is None
    assert tool_call_from_json("{not json", None) is None
    call = tool_call_from_json('{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}', None)
    assert call is not None and json.loads(call.arguments) == {"a": 1}


def test_special_markers_are_stripped() -> None:
    assert text_of(feed_all(TextRouter(), ["Hi<|im_", "end|>"])) == "Hi"
