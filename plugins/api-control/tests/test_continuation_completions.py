"""A text completion resumed on another instance: prompt plus what was streamed, and no second echo."""

from __future__ import annotations

from skulk_api_control.continuation import Progress, continued_params
from skulk_kernel.api import ChatMessage, CommandId, CompletionParams, SamplingParams, TextGenerationParams, TokenChunk


def completion(raw: str | None, ids: tuple[int, ...] = (), suffix: str | None = None) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="m",
        messages=(ChatMessage(role="user", content=raw or ""),),
        raw_prompt=raw,
        sampling=SamplingParams(max_tokens=10, temperature=0),
        completion=CompletionParams(prompt_ids=ids, suffix=suffix, echo=suffix is None, prompt_logprobs=1),
    )


def streamed(*pieces: tuple[str, tuple[int, ...]]) -> Progress:
    p = Progress()
    for i, (text, ids) in enumerate(pieces):
        p.add(TokenChunk(command_id=CommandId("c"), seq=i, text=text, token_ids=ids))
    return p


def test_a_text_prompt_goes_on_from_its_text_plus_the_streamed_text_without_echoing_again() -> None:
    again = continued_params(completion("def f():"), streamed(("\n", (1,)), ("  return", (2,))))
    assert again is not None and again.completion is not None
    assert again.raw_prompt == "def f():\n  return" and again.continue_from == ()
    assert again.completion.echo is False and again.completion.prompt_logprobs is None
    assert again.sampling.max_tokens == 8


def test_an_id_prompt_goes_on_from_its_ids_plus_the_streamed_ids() -> None:
    again = continued_params(completion(None, (5, 6)), streamed((" a", (7,)), (" b", (8,))))
    assert again is not None and again.completion is not None and again.completion.prompt_ids == (5, 6, 7, 8)
    without_ids = continued_params(completion(None, (5, 6)), streamed((" a", ())))
    assert without_ids is None  # the text cannot be appended to ids exactly: not resumed


def test_fill_in_the_middle_extends_the_prefix_and_keeps_the_suffix() -> None:
    again = continued_params(completion("x = ", suffix="\nprint(x)"), streamed(("4", (9,))))
    assert again is not None and again.completion is not None
    assert again.raw_prompt == "x = 4" and again.completion.suffix == "\nprint(x)"
