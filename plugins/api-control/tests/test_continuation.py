"""Pure parts of routing and continuation: prefix keys, the continued request, summed usage."""

from __future__ import annotations

from skulk_api_control.continuation import Progress, Resumer, continued_params
from skulk_api_control.routing import prefix_keys
from skulk_kernel.api import ChatMessage, CommandId, SamplingParams, TextGenerationParams, TokenChunk, Usage


def params(*messages: ChatMessage, max_tokens: int | None = 200, raw: str | None = None) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="m",
        messages=messages or (ChatMessage(role="user", content="hi"),),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0, seed=7),
        raw_prompt=raw,
    )


def progress(*texts: str) -> Progress:
    p = Progress()
    for i, t in enumerate(texts):
        p.add(TokenChunk(command_id=CommandId("c"), seq=i, text=t))
    return p


def test_the_continued_request_carries_the_text_as_an_open_assistant_turn_and_the_remaining_budget() -> None:
    again = continued_params(params(), progress("Once", " upon", " a"))
    assert again is not None
    assert again.messages[-1] == ChatMessage(role="assistant", content="Once upon a")
    assert again.sampling.max_tokens == 197 and again.sampling.seed == 7 and again.sampling.temperature == 0
    assert continued_params(params(), Progress()) == params()  # nothing streamed: the same request


def test_a_client_prefill_is_extended_and_a_raw_prompt_continues_raw() -> None:
    prefilled = params(ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="Sure:"))
    again = continued_params(prefilled, progress(" yes"))
    assert again is not None and again.messages[-1].content == "Sure: yes" and len(again.messages) == 2
    raw = continued_params(params(raw="<s>story:"), progress(" a fox"))
    assert raw is not None and raw.raw_prompt == "<s>story: a fox" and raw.messages == params().messages


def chunk(seq: int, text: str, ids: tuple[int, ...] = (), reasoning: bool = False) -> TokenChunk:
    return TokenChunk(command_id=CommandId("c"), seq=seq, text=text, token_ids=ids, reasoning=reasoning)


def test_streamed_token_ids_ride_along_and_count_the_budget() -> None:
    p = Progress()
    for i, (text, ids) in enumerate([("Once", (11,)), ("", (12,)), (" upón", (13, 14))]):  # a split UTF-8 token
        p.add(chunk(i, text, ids))
    again = continued_params(params(), p)
    assert again is not None and again.continue_from == (11, 12, 13, 14)
    assert again.messages[-1].content == "Once upón" and again.sampling.max_tokens == 196
    p.add(chunk(3, " a", (15,)))  # a second resume covers both attempts
    twice = continued_params(params(), p)
    assert twice is not None and twice.continue_from == (11, 12, 13, 14, 15)


def test_one_chunk_without_ids_drops_them_for_good() -> None:
    p = Progress()
    p.add(chunk(0, "Once", (11,)))
    p.add(chunk(1, "think", reasoning=True))  # reasoning carries no ids: the text no longer spells them
    p.add(chunk(2, " upon", (12,)))
    again = continued_params(params(), p)
    assert again is not None and again.continue_from == () and p.ids is None
    assert continued_params(params(raw="story:"), progress_with_ids()).continue_from == ()  # type: ignore[union-attr]


def progress_with_ids() -> Progress:
    p = Progress()
    p.add(chunk(0, " a fox", (5, 6)))
    return p


def test_an_exhausted_budget_is_not_resumed() -> None:
    assert continued_params(params(max_tokens=2), progress("a", "b")) is None


def test_prefix_keys_skip_system_only_prefixes_and_extend_with_each_turn() -> None:
    system = ChatMessage(role="system", content="be brief")
    turn1 = (system, ChatMessage(role="user", content="hi"))
    turn2 = (*turn1, ChatMessage(role="assistant", content="hello"), ChatMessage(role="user", content="more"))
    assert len(prefix_keys((system,))) == 0
    assert prefix_keys(turn2)[: len(prefix_keys(turn1))] == prefix_keys(turn1)
    assert prefix_keys((system, ChatMessage(role="user", content="other"))) != prefix_keys(turn1)


def test_final_usage_counts_every_attempt_once() -> None:
    resumer = Resumer.__new__(Resumer)
    resumer.base_tokens = 50
    final = TokenChunk(
        command_id=CommandId("c"),
        seq=9,
        text="",
        finish_reason="length",
        usage=Usage(prompt_tokens=95, completion_tokens=150),
    )
    summed = resumer._summed(final)
    assert summed.usage == Usage(prompt_tokens=45, completion_tokens=200)
