"""Speculative decoding on the server backend with a real pair: Qwen2.5-Coder-0.5B drafting for 1.5B.

Greedy text must be the plain model's, character for character. That holds because the target
scores a drafted run of tokens in one batch whose CPU arithmetic, with flash attention and
batch-exact weight types (the pair requantized to Q4_1, see ``models.BATCH_EXACT_TYPES``), rounds
exactly as one token at a time does. (With the shipped Q4_K_M files the two runs part at near-ties
of the plain run's top two choices; the bench reports both.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from skulk_engine_llamacpp.events import Finish, TextDelta

PROMPTS = [
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [{"role": "user", "content": "List the planets of the solar system, one per line."}],
]  # two of 48 tokens each: three of 60 took CI seven minutes beside other model suites


def run(server: Any, messages: list[dict[str, str]], n: int) -> tuple[str, Finish]:
    events = list(server.chat(messages, sampling={"max_tokens": n, "temperature": 0}))
    fin = events[-1]
    assert isinstance(fin, Finish)
    return "".join(e.text for e in events if isinstance(e, TextDelta)), fin


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_draft_model_keeps_greedy_text_and_reports_acceptance(qwen_pair: tuple[Path, Path]) -> None:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.server_backend import LlamaServer

    target, draft = qwen_pair
    common = {"n_parallel": 1, "n_threads": 1, "n_threads_batch": 1, "n_ctx": 1024}
    with LlamaServer(target, **common) as srv:
        plain = [run(srv, m, 48) for m in PROMPTS]
        assert srv.speculative_stats() == {"drafted": 0, "accepted": 0}
    with LlamaServer(target, draft_model_path=draft, draft_max=4, **common) as srv:
        spec = [run(srv, m, 48) for m in PROMPTS]
        totals = srv.speculative_stats()
    for (p_text, p_fin), (s_text, s_fin) in zip(plain, spec, strict=True):
        assert p_text.strip() and s_text == p_text
        assert s_fin.completion_tokens == p_fin.completion_tokens
        assert 0 < s_fin.timings["draft_n_accepted"] <= s_fin.timings["draft_n"]
    assert totals["drafted"] == sum(f.timings["draft_n"] for _, f in spec)
    assert totals["accepted"] / totals["drafted"] > 0.3  # same family, same vocabulary: most drafts hold


def test_draft_counts_reach_the_final_chunk_stats() -> None:
    """The kernel-side mapping (no model): llama.cpp's timings -> GenerationStats.draft_*."""
    from skulk_engine_llamacpp.engine import LlamaSession
    from skulk_kernel.api import ChatMessage, TextGenerationParams

    class Backend:
        def chat(self, *args: Any, **kwargs: Any) -> Any:
            yield TextDelta("hi", None)
            yield Finish("stop", 3, 9, {"draft_n": 12, "draft_n_accepted": 7, "predicted_per_second": 5.0})

    params = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="x"),))
    session = LlamaSession(Backend(), None, "llama_server-cpu")  # type: ignore[arg-type]
    chunks = list(session._generate("c1", params, lambda: False))
    stats = chunks[-1].stats
    assert stats is not None and (stats.draft_tokens, stats.draft_accepted) == (12, 7)
