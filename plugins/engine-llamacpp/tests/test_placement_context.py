"""The placement's context and KV cache type reach llama.cpp (RunnerSpec.context_limit, .kv_cache_type).

One SmolLM2 server (about a second) started with a q8_0 cache at 1,024 tokens: llama.cpp reports
that context in /props and answers with the quantized cache.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from skulk_kernel.api import ChatMessage, ModelCard, SamplingParams, TextGenerationParams
from skulk_testing.conformance import make_runner_spec

pytestmark = pytest.mark.slow
CARD = ModelCard(model_id="HuggingFaceTB/SmolLM2-135M-Instruct", n_layers=30, hidden_size=576, context_length=8192)
ONE_CORE = {"n_threads": 1, "n_threads_batch": 1, "n_parallel": 2}


def test_the_cache_type_becomes_llama_cpps_k_and_v_types(smollm2_path: Path) -> None:
    xlc = pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.server_backend import LlamaServer

    params = LlamaServer(smollm2_path, n_ctx=2048, cache_type="q4_0")._params()
    assert params.n_ctx == 2048
    assert params.cache_type_k == params.cache_type_v == xlc.ggml_type.GGML_TYPE_Q4_0
    default = LlamaServer(smollm2_path)._params()
    assert default.cache_type_k == default.cache_type_v == xlc.ggml_type.GGML_TYPE_F16


def test_a_placed_context_and_q8_cache_start_llama_server(smollm2_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.engine import LlamaServerEngine

    spec = make_runner_spec(CARD, smollm2_path, backend="llama_server-cpu", options=ONE_CORE)
    spec = dataclasses.replace(spec, context_limit=1024, kv_cache_type="q8_0")
    session = LlamaServerEngine().load(spec, lambda done, total: None)
    try:
        assert session.backend.context_length == 1024
        params = TextGenerationParams(
            model_id=CARD.model_id,
            messages=(ChatMessage(role="user", content="Say hi"),),
            sampling=SamplingParams(max_tokens=4, temperature=0.0),
        )
        chunks = list(session.generate("c1", params, lambda: False))
        assert any(type(c).__name__ == "TokenChunk" for c in chunks), chunks
    finally:
        session.close()
