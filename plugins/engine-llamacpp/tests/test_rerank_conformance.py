"""llama.cpp's server backend against the conformance suite's reranking test, on the tiny random
cross-encoder (`tiny_rerank`): a score per document, in order, the same for the same document.

The text generation tests of the suite are skipped here (the runner spec is a reranker); llama.cpp's
text generation is covered by test_chat_backends.py and the node tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from skulk_kernel.api import ModelCard, ModelId, RunnerSpec
from skulk_testing.conformance import EngineConformance, LoadedSession, make_runner_spec

pytest.importorskip("xllamacpp")


def _spec(tmp: Path) -> RunnerSpec:
    from skulk_engine_llamacpp.tiny_rerank import write_tiny_reranker_gguf

    path = write_tiny_reranker_gguf(tmp / "tiny-reranker.gguf")
    card = ModelCard(
        model_id=ModelId("test/tiny-reranker"),
        n_layers=2,
        hidden_size=32,
        tasks=("TextRerank",),
        family="bert",
        context_length=512,
        gguf_file=path.name,
    )
    return make_runner_spec(card, path, backend="llama_server-cpu", options={"n_threads": 1, "n_parallel": 2})


class TestLlamaServerReranking(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> object:
        from skulk_engine_llamacpp.engine import LlamaServerEngine

        return LlamaServerEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls, tmp_path_factory: pytest.TempPathFactory) -> RunnerSpec:
        return _spec(tmp_path_factory.mktemp("rerank"))

    @pytest.fixture(scope="class")
    @classmethod
    def rerank_runner_spec(cls, runner_spec: RunnerSpec) -> RunnerSpec:
        return runner_spec

    @pytest.fixture(scope="class")
    @classmethod
    def loaded(cls, any_loaded: LoadedSession) -> LoadedSession:
        pytest.skip("a reranker: text generation is tested with chat models elsewhere")
