"""Continuous batching on a single-rank MLX session, on the real SmolLM2 (the engine's own runner path).

Four requests sent together step in one batch (the batcher saw them side by side) and each greedy
text equals the text that request gets alone; a cancelled stream ends at once while the others
finish; a split or quantized-cache session keeps the one-sequence path (width 1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SMOLLM2_CARD
from skulk_engine_mlx.engine import MlxEngine
from skulk_engine_mlx.session import MlxSession
from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams, TokenChunk
from skulk_testing.conformance import make_runner_spec

pytestmark = pytest.mark.slow

PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a computer is to a child.",
    "List three fruits and their colors.",
)


@pytest.fixture(scope="module")
def session(smollm2_mlx: Path) -> Iterator[MlxSession]:
    loaded = MlxEngine().load(make_runner_spec(SMOLLM2_CARD, smollm2_mlx), lambda d, t: None)
    assert isinstance(loaded, MlxSession)
    yield loaded
    loaded.close()


def ask(text: str, max_tokens: int = 32, **extra: Any) -> TextGenerationParams:
    return TextGenerationParams(
        model_id=SMOLLM2_CARD.model_id,
        messages=(ChatMessage(role="user", content=text),),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        **extra,
    )


def run(session: MlxSession, params: TextGenerationParams, cancel: threading.Event | None = None) -> list[Any]:
    flag = cancel or threading.Event()
    return list(session.generate("c", params, flag.is_set))


def text(chunks: list[Any]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk))


def together(session: MlxSession, params: list[TextGenerationParams]) -> list[list[Any]]:
    results: list[list[Any]] = [[] for _ in params]

    def one(i: int) -> None:
        results[i] = run(session, params[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(params))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_single_rank_session_is_wide(session: MlxSession) -> None:
    assert session.batcher is not None and session.dispatch_width > 1


def test_four_streams_together_give_each_its_own_greedy_text(session: MlxSession) -> None:
    alone = [text(run(session, ask(p))) for p in PROMPTS]
    session.batcher.widest = 0  # type: ignore[union-attr]
    batched = together(session, [ask(p) for p in PROMPTS])
    assert session.batcher.widest >= 2  # type: ignore[union-attr]
    assert [text(chunks) for chunks in batched] == alone
    for chunks in batched:
        assert chunks[-1].finish_reason in ("stop", "length")


def test_each_stream_keeps_its_own_max_tokens_stop_and_logprobs(session: MlxSession) -> None:
    params = [
        ask(PROMPTS[0], max_tokens=3),
        ask(PROMPTS[1], max_tokens=40, logprobs=True, top_logprobs=2),
        ask(PROMPTS[2], max_tokens=40).model_copy(
            update={"sampling": SamplingParams(temperature=0.0, max_tokens=40, stop=("computer",))}
        ),
    ]
    short, scored, stopped = together(session, params)
    assert short[-1].usage.completion_tokens == 3 and short[-1].finish_reason == "length"
    lps = [lp for c in scored if isinstance(c, TokenChunk) for lp in c.logprobs]
    assert len(lps) == scored[-1].usage.completion_tokens
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0.0 for lp in lps)
    assert "computer" not in text(stopped)


def test_a_cancelled_stream_leaves_the_batch_at_once(session: MlxSession) -> None:
    cancel = threading.Event()
    out: list[Any] = []
    ended: list[float] = []

    def long_one() -> None:
        for chunk in session.generate("c", ask(PROMPTS[1], max_tokens=400), cancel.is_set):
            out.append(chunk)
        ended.append(time.monotonic())

    thread = threading.Thread(target=long_one)
    thread.start()
    other = ask(PROMPTS[3], max_tokens=24)
    others = together(session, [other])
    deadline = time.monotonic() + 60
    while len(out) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    cancel.set()
    asked = time.monotonic()
    thread.join(30)
    assert out[-1].finish_reason == "cancelled"
    assert ended[0] - asked < 2.0
    assert others[0][-1].finish_reason in ("stop", "length")
    assert text(run(session, other)) == text(others[0])  # the batch still serves after a cancel
