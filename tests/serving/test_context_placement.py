"""Issue [capacity] acceptance 1 on a real node: an instance placed with `context_tokens` runs at that context.

Uses the session's llama.cpp node (`llama_node`). SmolLM2's GGUF is added again under a model id of
its own, so requests for that id reach only the instance placed here (the default SmolLM2 instance
keeps serving the other suites), placed with ``context_tokens: 2048`` and removed at the end.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import CHAT_MODEL

MODEL = "local/smollm2-ctx2k"


@pytest.fixture(scope="module")
def small_context(llama_node, models_dir):
    gguf = models_dir / CHAT_MODEL / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.exists():
        pytest.skip(f"{gguf} is not provisioned")
    added = llama_node.post("/models/add", json={"path": str(gguf), "model_id": MODEL})
    assert added.status_code == 200, added.text
    placed = llama_node.post("/place_instance", json={"model_id": MODEL, "context_tokens": 2048})
    assert placed.status_code == 200, placed.text
    instance_id = placed.json()["instance_id"]
    try:
        llama_node.wait_ready(MODEL, timeout=120)
        yield instance_id
    finally:
        httpx.delete(f"{llama_node.url}/instance/{instance_id}", timeout=30)
        httpx.delete(f"{llama_node.url}/models/custom/{MODEL}", timeout=30)


def test_the_instance_reports_the_context_it_was_placed_with(llama_node, small_context):
    (wrapped,) = [w for w in llama_node.state()["instances"].values() if small_context in str(w)]
    instance = next(iter(wrapped.values()))
    assert instance["contextLimit"] == 2048
    assert instance["kvCacheType"] == "f16"
    assert instance["reservedBytes"]  # what admission charged, per node


def test_a_prompt_over_the_context_is_refused_with_a_400(llama_node, small_context):
    long_prompt = " ".join(["apple"] * 3000)  # about 3,000 tokens for SmolLM2's tokenizer
    answer = llama_node.post(
        "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": long_prompt}]},
        timeout=120,
    )
    assert answer.status_code == 400, answer.text
    assert "2048" in answer.json()["error"]["message"]
    short = llama_node.post(
        "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]},
        timeout=120,
    )
    assert short.status_code == 200, short.text
