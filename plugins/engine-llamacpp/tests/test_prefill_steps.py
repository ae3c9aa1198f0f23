"""A long prompt is evaluated in steps a cancel stops between, and rendered and tokenized once (prefill.py).

llama.cpp's server evaluates a prompt to its end once it started, whatever happens to the client; these
tests hold the session to what the steps promise on the real server (SmolLM2, 8,192 tokens of context):
a cancel mid-prompt frees llama.cpp's slot and the gate's reservation within about a second, the request
that follows the steps finds them cached, and the runner's count, the gate's count and the steps render
the prompt once.
"""

from __future__ import annotations

import itertools
import threading
import time
import unittest.mock
from typing import Any

import pytest
from skulk_engine_llamacpp.admission import TokenGate
from skulk_engine_llamacpp.engine import LlamaSession
from skulk_engine_llamacpp.prefill import FIRST_STEP, MIN_STEP, TAIL, PromptMemo, exact_steps, prefill_steps
from skulk_kernel.api import ChatMessage, PrefillProgressChunk, SamplingParams, TextGenerationParams, TokenChunk

pytestmark = pytest.mark.timeout(300)


def _long(n_words: int, tag: str) -> TextGenerationParams:
    words = " ".join(f"{tag}{i}" for i in range(n_words))
    return TextGenerationParams(
        model_id="m",
        messages=(ChatMessage(role="user", content=f"Summarize this list: {words}"),),
        sampling=SamplingParams(max_tokens=8, temperature=0),
    )


def _session(server: Any) -> LlamaSession:
    return LlamaSession(server, None, "llama_server-cpu", TokenGate(server.context_length, max_running=4))  # type: ignore[arg-type]


def _idle(server: Any) -> bool:
    return not any(s["is_processing"] for s in server.slots())


def test_a_cancel_mid_prompt_frees_the_slot_and_the_reservation_within_a_second(chat_server: Any) -> None:
    session = _session(chat_server)
    cancel = threading.Event()
    in_prefill = threading.Event()
    chunks: list[Any] = []

    stamps: list[float] = []

    def run() -> None:
        for chunk in session.generate("c1", _long(800, "a"), cancel.is_set):
            chunks.append(chunk)
            if isinstance(chunk, PrefillProgressChunk) and chunk.processed > 0:
                stamps.append(time.monotonic())
                if len(stamps) >= 3:  # two steps timed: the one in flight is sized to about 0.75 s
                    in_prefill.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert in_prefill.wait(180), "no prefill steps were reported"
    cancel.set()
    started = time.monotonic()
    worker.join(30)
    ended = time.monotonic() - started
    while not _idle(chat_server):
        assert time.monotonic() - started < 10, "llama.cpp's slot still busy 10 s after the cancel"
        time.sleep(0.02)
    freed = time.monotonic() - started
    assert isinstance(chunks[-1], TokenChunk) and chunks[-1].finish_reason == "cancelled", chunks[-1]
    assert session.gate is not None and session.gate.reserved == 0 and session.gate.running == 0
    # within the step in flight: about 0.75 s on a quiet box (the bound is a second); a loaded
    # shared box stretches a step, so the bound is the longest step seen, plus slack
    step = max(b - a for a, b in itertools.pairwise(stamps))
    assert ended < max(1.0, 2 * step) and freed < max(1.0, 2 * step) + 0.2, (ended, freed, step)


def test_the_request_after_the_steps_finds_them_cached(chat_server: Any) -> None:
    session = _session(chat_server)
    params = _long(500, "b")
    prompt = session.count_tokens(params)
    chunks = list(session.generate("c2", params, lambda: False))
    steps = [c for c in chunks if isinstance(c, PrefillProgressChunk) and c.processed > 0]
    final = chunks[-1]
    assert steps and steps[-1].processed >= prompt - 4096, steps
    assert isinstance(final, TokenChunk) and final.usage is not None and final.usage.prompt_tokens == prompt
    assert final.stats is not None and final.stats.prompt_tokens == prompt
    # the generating request evaluated only what the steps left (its tail), not the whole prompt
    evaluated = prompt - steps[-1].processed
    assert evaluated <= max(TAIL, 4096), evaluated


def test_one_render_and_tokenization_per_prompt(chat_server: Any) -> None:
    session = _session(chat_server)
    params = _long(150, "c")  # over STEP_MIN tokens: counted exactly (a shorter one is bounded, below)
    before = chat_server.memo.computed
    first = session.count_tokens(params)  # the runner's context check
    assert session.count_tokens(params) == first  # the gate's reservation
    assert chat_server.memo.computed == before + 1


def test_a_short_chat_is_bounded_without_tokenizing_it(chat_server: Any) -> None:
    """A short prompt that fits is counted by a bound (no render or tokenization before generating);
    the bound is never under the exact count; a prompt near the limit is counted exactly."""
    session = _session(chat_server)
    ask = _long(3, "d")
    session.count_tokens(ask)  # the conversation's shape is rendered once
    shapes, before = chat_server.shapes.computed, chat_server.memo.computed
    texts = ("hi", "Tell me about owls and salt.", "é" * 40, "")
    bounds = [
        session.count_tokens(ask.model_copy(update={"messages": (ChatMessage(role="user", content=t),)})) for t in texts
    ]
    assert chat_server.shapes.computed == shapes and chat_server.memo.computed == before  # no server round trip
    for text, bound in zip(texts, bounds, strict=True):
        exact = chat_server.count_tokens([{"role": "user", "content": text}])
        assert exact <= bound <= exact + len(text.encode()) + 4, (text, exact, bound)
    system = ask.model_copy(
        update={"messages": (ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi"))}
    )
    assert session.count_tokens(system) >= chat_server.count_tokens(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    near = ask.model_copy(update={"sampling": SamplingParams(max_tokens=chat_server.context_length - 20)})
    assert session.count_tokens(near) == chat_server.count_tokens([m.template_dict() for m in near.messages])
    chunks = list(session.generate("c3", ask, lambda: False))
    assert isinstance(chunks[-1], TokenChunk) and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens <= session.count_tokens(ask)


def test_short_prompts_go_in_one_request() -> None:
    class Never:
        def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            raise AssertionError("a short prompt was stepped")

    assert list(prefill_steps(Never(), list(range(200)))) == []


def test_steps_grow_to_the_measured_speed_and_leave_the_tail() -> None:
    sent: list[int] = []

    class Fast:
        prefill_tps: float | None = None

        def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            sent.append(len(body["prompt"]))
            assert path == "/completion" and body["n_predict"] == 0 and body["cache_prompt"] is True
            return {"timings": {"prompt_n": len(body["prompt"]) - (sent[-2] if len(sent) > 1 else 0)}}

    done = list(prefill_steps(Fast(), list(range(20000))))
    assert done == sent and sent == sorted(sent) and sent[0] == FIRST_STEP
    assert sent[-1] <= 20000 - TAIL and max(b - a for a, b in itertools.pairwise(sent)) <= 4096


def test_on_a_slow_box_steps_shrink_below_the_wide_floor_and_the_next_prompt_starts_narrow() -> None:
    """A cancel waits one step: where 128 tokens take seconds (a loaded box: 40 tokens a second
    here), steps go down towards MIN_STEP, and the next prompt's first step is sized from this
    one's speed instead of starting at FIRST_STEP again."""
    sent: list[int] = []
    clock = [0.0]

    class Loaded:
        prefill_tps: float | None = None

        def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            n = len(body["prompt"]) - (sent[-1] if sent else 0)
            sent.append(len(body["prompt"]))
            clock[0] += n / 40  # evaluating takes the step's tokens at 40 a second
            return {"timings": {"prompt_n": n}}

    server = Loaded()
    with unittest.mock.patch("skulk_engine_llamacpp.prefill.time.monotonic", lambda: clock[0]):
        list(prefill_steps(server, list(range(1000))))
        steps = [b - a for a, b in itertools.pairwise([0, *sent])]
        assert steps[0] == FIRST_STEP and set(steps[1:]) == {MIN_STEP}, steps  # 0.75 s is 30 tokens: the floor
        assert server.prefill_tps == pytest.approx(40)
        sent.clear()
        list(prefill_steps(server, list(range(1000))))
    assert sent[0] == MIN_STEP, "the next prompt starts at the pace the last one measured"


def test_the_memo_keeps_the_newest() -> None:
    memo = PromptMemo(size=2)
    for key in ("a", "b", "a", "c"):
        memo.ids(key, lambda k=key: [ord(k)])
    assert memo.computed == 3  # "a" a second time was a hit
    memo.ids("b", lambda: [0])
    assert memo.computed == 4  # "b" was evicted by "c" (least recently used)


def test_steps_end_on_the_micro_batch_grid() -> None:
    """Steps cut the prompt where one whole request's micro-batches would: the same cached bits."""
    sent: list[int] = []

    class Slow:
        prefill_tps: float | None = None

        def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            sent.append(len(body["prompt"]))
            return {"timings": {"prompt_n": 10}}  # far under a micro-batch per step

    list(prefill_steps(Slow(), list(range(3000)), grid=512, target_s=1e-6))
    assert sent == [512, 1024, 1536, 2048, 2560] and all(n % 512 == 0 for n in sent)


def test_a_resume_feeds_its_streamed_ids_in_exact_batches() -> None:
    sent: list[int] = []

    class Server:
        def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            sent.append(len(body["prompt"]))
            return {}

    ids = list(range(100 + 71))  # a 100-token prompt and 71 streamed ids
    assert list(exact_steps(Server(), ids, 100, 32)) == sent
    assert sent == [100, 132, 164, 170]  # the prompt whole, then at most 32 ids a request, the last id left
