"""Exact continuation on the server backend: a greedy answer cut anywhere goes on as if never cut.

The real model on llama.cpp's server. ``token_ids`` streams each delta's ids; a continuation
(``continue_ids``, what a resume sends) must produce the rest of the uninterrupted answer token
for token. The text-only prefill (the fallback) is shown alongside: it re-tokenizes, which is what
made a resumed answer drift before.
"""

from __future__ import annotations

from typing import Any

import pytest
from skulk_engine_llamacpp.events import Finish, ReasoningDelta, TextDelta

pytestmark = pytest.mark.slow
STORY = [{"role": "user", "content": "Write a long story about a fox who learns to sail across the ocean."}]
TOKENS = 120


def answer(server: Any, messages: list[dict[str, Any]], n: int, **kw: Any) -> tuple[str, list[int], Finish]:
    events = list(server.chat(messages, sampling={"max_tokens": n, "temperature": 0}, token_ids=True, **kw))
    assert not any(isinstance(e, ReasoningDelta) for e in events)
    fin = events[-1]
    assert isinstance(fin, Finish)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    return "".join(d.text for d in deltas), [i for d in deltas for i in d.ids], fin


def test_token_ids_spell_the_streamed_text(chat_server: Any) -> None:
    text, ids, fin = answer(chat_server, STORY, 40)
    assert len(ids) == fin.completion_tokens == 40
    assert chat_server._post("/detokenize", {"tokens": ids})["content"] == text


@pytest.mark.parametrize("cut", [7, 33, 71])
def test_a_continuation_from_ids_is_the_uninterrupted_answer(chat_server: Any, cut: int) -> None:
    full, ids, _ = answer(chat_server, STORY, TOKENS)
    assert len(ids) == TOKENS
    head = chat_server._post("/detokenize", {"tokens": ids[:cut]})["content"]
    messages = [*STORY, {"role": "assistant", "content": head}]
    rest, rest_ids, fin = answer(chat_server, messages, TOKENS - cut, continue_ids=ids[:cut])
    assert rest_ids == ids[cut:] and head + rest == full
    assert fin.prompt_tokens > cut  # the prompt carried the streamed ids


def test_ids_that_do_not_spell_the_message_fall_back_to_the_text(chat_server: Any) -> None:
    """A stale or foreign id list never corrupts the answer: the trailing text is what counts."""
    _, ids, _ = answer(chat_server, STORY, 30)
    messages = [*STORY, {"role": "assistant", "content": "Once upon a time"}]
    by_text, _, _ = answer(chat_server, messages, 10)
    rest, _, fin = answer(chat_server, messages, 10, continue_ids=ids[-5:])
    assert rest == by_text and fin.completion_tokens == 10
