"""Text completions on the tiny random MLX model: prompt as text or ids, echo, prompt logprobs, FIM refusal.

The prompt's logprobs come from chunked passes over the prompt on one KV cache; a chunk of 2 tokens
must give what one pass over the whole prompt gives (the cache carries the context across chunks),
and the second position's logprob must be the one the model gives when it generates from the first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_engine_mlx.completion import score_prompt
from skulk_engine_mlx.engine import MlxEngine
from skulk_engine_mlx.session import MlxSession
from skulk_kernel.api import (
    ChatMessage,
    CompletionParams,
    ErrorChunk,
    ModelCard,
    PromptChunk,
    SamplingParams,
    TextGenerationParams,
    TokenChunk,
)
from skulk_testing.conformance import make_runner_spec

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def session(tiny_model: Path, tiny_card: ModelCard) -> Iterator[MlxSession]:
    loaded = MlxEngine().load(make_runner_spec(tiny_card, tiny_model), lambda d, t: None)
    assert isinstance(loaded, MlxSession)
    yield loaded
    loaded.close()


def completion(prompt: str | None = PROMPT, max_tokens: int = 4, **fields: object) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="test/tiny-mlx",
        messages=(ChatMessage(role="user", content=prompt or ""),),
        raw_prompt=prompt,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        completion=CompletionParams(**fields),  # type: ignore[arg-type]
    )


def test_text_and_ids_give_the_same_greedy_answer(session: MlxSession) -> None:
    ids = session.tokenizer.encode(PROMPT)
    by_text = list(session.generate("c", completion(), lambda: False))
    by_ids = list(session.generate("c", completion(None, prompt_ids=tuple(ids)), lambda: False))
    text = "".join(c.text for c in by_text if isinstance(c, TokenChunk))
    assert text == "".join(c.text for c in by_ids if isinstance(c, TokenChunk))
    assert by_text[-1].usage.prompt_tokens == len(ids) == session.count_tokens(completion())


def test_echo_with_prompt_logprobs_comes_first(session: MlxSession) -> None:
    chunks = list(session.generate("c", completion(echo=True, prompt_logprobs=2, generate=False), lambda: False))
    echo = chunks[0]
    assert isinstance(echo, PromptChunk) and echo.text == PROMPT
    assert list(echo.token_ids) == session.tokenizer.encode(PROMPT)
    assert len(echo.logprobs) == len(echo.token_ids) and echo.logprobs[0].logprob == 0.0
    assert all(lp.logprob <= 0.0 and len(lp.top_logprobs) == 2 for lp in echo.logprobs[1:])
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 0


def test_chunked_scoring_equals_one_pass_and_generation(session: MlxSession) -> None:
    ids = session.tokenizer.encode(PROMPT)

    def scored(step: int) -> list[float]:
        return [
            v
            for v, _ in session.compute.call(
                lambda: score_prompt(session.loaded.model, session._make_cache(), ids, 3, step), None, "score"
            )
        ]

    whole, chunked = scored(512), scored(2)
    assert chunked == pytest.approx(whole, abs=1e-4)
    # the model's own logprob of the token it generates after ids[0] is what scoring [ids[0], token] gives
    params = completion(None, 1, prompt_ids=tuple(ids[:1])).model_copy(update={"logprobs": True, "top_logprobs": 1})
    chunks = list(session.generate("c", params, lambda: False))
    token = session.last_tokens[0]
    generated = next(lp for c in chunks if isinstance(c, TokenChunk) for lp in c.logprobs).logprob
    forced = session.compute.call(
        lambda: score_prompt(session.loaded.model, session._make_cache(), [ids[0], token], 1, 512), None, "score"
    )
    assert forced[1][0] == pytest.approx(generated, abs=1e-3)


def test_suffix_without_fim_tokens_is_refused(session: MlxSession) -> None:
    chunks = list(session.generate("c", completion(suffix=" end"), lambda: False))
    assert isinstance(chunks[0], ErrorChunk) and chunks[0].error_type == "invalid_request_error"
    assert "fill-in-the-middle" in chunks[0].message


def test_an_empty_prompt_is_refused_and_the_session_still_serves(session: MlxSession) -> None:
    chunks = list(session.generate("c", completion(""), lambda: False))
    assert isinstance(chunks[0], ErrorChunk) and "empty" in chunks[0].message
    raw = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="x"),), raw_prompt="")
    chunks = list(session.generate("c", raw, lambda: False))
    assert isinstance(chunks[0], ErrorChunk) and chunks[0].error_type == "invalid_request_error"
    assert list(session.generate("c", completion(), lambda: False))[-1].finish_reason in ("stop", "length")
