"""A profile's `[plugins.engine-llamacpp]` options reach llama.cpp: read back from the engine itself.

The path is the real one: the node validates the table (`LlamaCppConfig`), the worker hands the
validated table to the runner (`runner_options`), the engine reads it back through the same model
and launches llama.cpp's server. What llama.cpp then reports is checked: its context parameters
(logged at verbosity 4: `llama_context: n_ubatch = 16`), `/props` (context, slots) and the
`llama_decode` calls it counts in `/metrics` (a prompt goes in `ceil(tokens / n_batch)` of them).
One SmolLM2 server (about 0.6 s) for the whole module.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from skulk_kernel.api import ChatMessage, ModelCard, Profile, SamplingParams, TextGenerationParams
from skulk_kernel.node import Node
from skulk_testing.conformance import make_runner_spec

pytestmark = pytest.mark.slow

PLUGIN = "engine-llamacpp"
OPTIONS = {
    "n_ubatch": 16,
    "n_batch": 32,
    "n_parallel": 2,
    "n_ctx": 1024,
    "n_threads": 1,
    "n_threads_batch": 1,  # two batch threads on a busy 2-core box make the prefill 10x slower
    "verbosity": 4,
}


def llama_context(log: str, key: str) -> int:
    match = re.search(rf"llama_context: {key}\s*=\s*(\d+)", log)
    assert match, f"llama.cpp did not report {key} (verbosity 4 logs the context parameters)"
    return int(match.group(1))


def decodes(session: Any) -> int:
    metrics = str(session.backend._server.handle_metrics())
    match = re.search(r"^llamacpp:n_decode_total (\d+)", metrics, flags=re.M)
    assert match, metrics
    return int(match.group(1))


def test_a_profiles_options_take_effect_in_llama_cpp(smollm2_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    runner_options = pytest.importorskip("skulk_worker.worker").runner_options
    from skulk_engine_llamacpp.engine import LlamaServerEngine

    node = Node(Profile(name="options", plugins=(PLUGIN,), plugin_config={PLUGIN: dict(OPTIONS)}))
    card = ModelCard(model_id="HuggingFaceTB/SmolLM2-135M-Instruct", n_layers=30, hidden_size=576)
    spec = make_runner_spec(card, smollm2_path, options=runner_options(node, PLUGIN))
    session = LlamaServerEngine().load(spec, lambda done, total: None)
    try:
        log = ""
        deadline = time.monotonic() + 5
        while "llama_context: n_ubatch" not in log and time.monotonic() < deadline:  # logged from a thread
            log += capfd.readouterr().err
            time.sleep(0.05)
        assert llama_context(log, "n_ubatch") == OPTIONS["n_ubatch"]
        assert llama_context(log, "n_batch") == OPTIONS["n_batch"]
        assert llama_context(log, "n_ctx") == OPTIONS["n_ctx"]
        threads = re.search(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)", log)
        assert threads, "llama.cpp did not report its threads"
        assert (int(threads[1]), int(threads[2])) == (OPTIONS["n_threads"], OPTIONS["n_threads_batch"])
        assert session.backend.props["total_slots"] == OPTIONS["n_parallel"]
        assert session.backend.context_length == OPTIONS["n_ctx"]

        words = " ".join(f"word{i}" for i in range(30))
        params = TextGenerationParams(
            model_id="m",
            messages=(ChatMessage(role="user", content=f"Repeat: {words}"),),
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
        )
        before = decodes(session)
        final = list(session.generate("c1", params, lambda: False))[-1]
        prompt = final.usage.prompt_tokens
        calls = decodes(session) - before
        print(f"llama.cpp reports n_ubatch={llama_context(log, 'n_ubatch')}, {prompt} prompt tokens in {calls} decodes")
        assert prompt > 2 * OPTIONS["n_batch"]
        # one llama_decode per n_batch-token chunk of the prompt; the one output token is sampled from its logits
        assert calls == math.ceil(prompt / OPTIONS["n_batch"])
    finally:
        session.close()
