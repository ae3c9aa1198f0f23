"""The engine on a tiny random model: the kernel's conformance suite plus MLX specifics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from skulk_engine_mlx.engine import MlxEngine
from skulk_engine_mlx.session import MlxSession
from skulk_kernel.api import (
    ChatMessage,
    ModelCard,
    RunnerSpec,
    SamplingParams,
    TextGenerationParams,
    TokenChunk,
    ToolSpec,
)
from skulk_testing.conformance import EngineConformance, PluginConformance, make_runner_spec


class TestMlxPlugin(PluginConformance):
    plugin_name = "engine-mlx"
    hook_owners = ("api-control", "hardware")  # plugin_fits is hardware's hook (hardware needs api-control)


class TestMlxEngineConformance(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> MlxEngine:
        return MlxEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls, tiny_model: Path, tiny_card: ModelCard) -> RunnerSpec:
        return make_runner_spec(tiny_card, tiny_model, backend="mlx-cpu")


@pytest.fixture(scope="module")
def session(tiny_model: Path, tiny_card: ModelCard) -> Iterator[MlxSession]:
    loaded = MlxEngine().load(make_runner_spec(tiny_card, tiny_model), lambda d, t: None)
    yield loaded
    loaded.close()


def ask(text: str = "hello world", **sampling: Any) -> TextGenerationParams:
    sampling.setdefault("temperature", 0.0)
    return TextGenerationParams(
        model_id="test/tiny-mlx",
        messages=(ChatMessage(role="user", content=text),),
        sampling=SamplingParams(**sampling),
    )


def run(session: MlxSession, params: TextGenerationParams) -> tuple[str, list[Any]]:
    chunks = list(session.generate("c", params, lambda: False))
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk)), chunks


def test_backend_tag_follows_the_platform() -> None:
    import sys

    tags = MlxEngine().backend_tags({})
    assert tags == (["mlx-metal"] if sys.platform == "darwin" else ["mlx-cpu"])
    assert MlxEngine().backend_tags({"engine_builds": {"mlx": "unusable: no libmlx"}}) == []
    assert MlxEngine.splits == frozenset({"Pipeline", "Tensor"})


def test_greedy_is_deterministic_and_reports_usage_and_stats(session: MlxSession) -> None:
    first, chunks = run(session, ask(max_tokens=24))
    again, _ = run(session, ask(max_tokens=24))
    assert first and first == again
    final = chunks[-1]
    assert final.finish_reason == "length" and final.usage.completion_tokens == 24
    assert final.stats.backend.startswith("mlx-") and final.stats.generation_tokens == 24


def test_stop_string_ends_the_text_before_it(session: MlxSession) -> None:
    full, _ = run(session, ask(max_tokens=32))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full
    text, chunks = run(session, ask(max_tokens=32, stop=(stop,)))
    assert chunks[-1].finish_reason == "stop"
    assert text == full[: full.index(stop)]


def test_seeded_sampling_repeats_and_seeds_differ(session: MlxSession) -> None:
    a, _ = run(session, ask(max_tokens=24, temperature=1.5, seed=7))
    b, _ = run(session, ask(max_tokens=24, temperature=1.5, seed=7))
    c, _ = run(session, ask(max_tokens=24, temperature=1.5, seed=8))
    d, _ = run(
        session, ask(max_tokens=24, temperature=1.5, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, seed=7)
    )
    assert a == b and a != c and d


def test_logprobs_with_top_alternatives(session: MlxSession) -> None:
    params = ask(max_tokens=6).model_copy(update={"logprobs": True, "top_logprobs": 3})
    _, chunks = run(session, params)
    lps = [lp for c in chunks if isinstance(c, TokenChunk) for lp in c.logprobs]
    assert len(lps) == 6
    for lp in lps:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        assert lp.top_logprobs[0].logprob >= lp.top_logprobs[-1].logprob
        assert abs(lp.top_logprobs[0].logprob - lp.logprob) < 1e-4  # greedy took the best


def test_count_tokens_renders_the_template(session: MlxSession) -> None:
    plain = session.count_tokens(ask("hi"))
    with_tools = session.count_tokens(ask("hi").model_copy(update={"tools": (ToolSpec(name="get_weather"),)}))
    assert 0 < plain < with_tools


def test_quantized_kv_cache_option(tiny_model: Path, tiny_card: ModelCard) -> None:
    card = tiny_card.model_copy(update={"sections": {"runtime": {"kv_bits": 8, "kv_group_size": 32}}})
    quantized = MlxEngine().load(make_runner_spec(card, tiny_model), lambda d, t: None)
    try:
        assert quantized.config.kv_bits == 8
        text, chunks = run(quantized, ask(max_tokens=8))
        assert chunks[-1].finish_reason == "length" and text
        assert type(quantized.stepper.cache[0]).__name__ == "QuantizedKVCache"
    finally:
        quantized.close()


def test_tokens_that_show_nothing_yet_send_keep_alives(session: MlxSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool call's tokens are held until the call is whole: the session sends an empty chunk at
    most every KEEPALIVE_S of them (here every step), so a long call does not read as a dead runner."""
    from skulk_engine_mlx import session as session_module
    from skulk_engine_mlx.textparse import Text

    class Holding:  # holds every piece, as the router does inside a tool call
        stopped = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.held = ""

        def feed(self, piece: str) -> list[Any]:
            self.held += piece
            return []

        def finish(self) -> list[Any]:
            return [Text(self.held)]

    params = ask(max_tokens=6, ignore_eos=True)
    text, plain = run(session, params)
    assert not [c for c in plain if isinstance(c, TokenChunk) and not c.text and c.finish_reason is None]
    monkeypatch.setattr(session_module, "TextRouter", Holding)
    monkeypatch.setattr(session_module, "KEEPALIVE_S", 0.0)
    held_text, chunks = run(session, params)
    alive = [c for c in chunks if isinstance(c, TokenChunk) and not c.text and c.finish_reason is None]
    assert len(alive) == 6 and held_text == text  # one per step; the text comes whole at the end
    assert [c.seq for c in chunks] == list(range(len(chunks)))
