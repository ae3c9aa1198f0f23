"""Issue [defaults] acceptance 2 and 3: models load when asked for, and unload after keep_alive.

A real node (cpu-llamacpp, no default models) with the Qwen2.5-Coder-0.5B-Instruct card provisioned
(tests/conftest.py's shared models dir) and no instance. Through the real `ollama` client
(`/api/chat`), the real `openai` SDK (`/v1/chat/completions`) and one `anthropic` SDK message (all
three reach the same shared path, `skulk_api_control.on_demand`): ten first requests sent at once
load the model once and are all answered; with `keep_alive: "2s"` the instance is gone a few
seconds after the last request, and the next request loads it again. A model too large for any
node is a 4xx with the planner's reason in under a second. Embeddings load on first use too. The
time to first token of an on-demand load and of an already placed model are printed for the
closing note (run with -s).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.conftest import EMBED_MODEL, QWEN_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ASK = [{"role": "user", "content": "What is the capital of France? One word."}]


@pytest.fixture(scope="module")
def bare_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import ProvisionError, provision_qwen05

    try:
        provision_qwen05(models_dir)  # cached after the first run
    except ProvisionError as exc:
        pytest.skip(f"Qwen2.5-Coder-0.5B not provisionable here: {exc}")
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"ondemand-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", "--no-default-models", home=tmp_path_factory.mktemp("ondemand"), env=env)
    try:
        node.wait_api(timeout=60)
        yield node
    finally:
        node.stop()


def instances_of(node: NodeProcess, model_id: str) -> list[str]:
    found = []
    for wrapped in node.state()["instances"].values():
        inst = next(iter(wrapped.values()))
        if inst["shardAssignments"]["modelId"] == model_id:
            found.append(inst["instanceId"])
    return found


def openai_ttft(node: NodeProcess) -> tuple[str, float]:
    """One streamed chat completion: its text and the seconds to its first content token."""
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=600)
    began, first, text = time.monotonic(), 0.0, ""
    for chunk in client.chat.completions.create(
        model=QWEN_MODEL,
        messages=ASK,
        max_tokens=8,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    ):
        for choice in chunk.choices:
            if choice.delta.content and not first:
                first = time.monotonic() - began
            text += choice.delta.content or ""
    return text, first


def anthropic_message(node: NodeProcess) -> str:
    client = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=600)
    answer = client.messages.create(model=QWEN_MODEL, max_tokens=8, messages=ASK, extra_body={"temperature": 0})  # type: ignore[arg-type]
    return "".join(getattr(block, "text", "") for block in answer.content)


def ollama_chat(node: NodeProcess, keep_alive: str | int | None = "2s") -> str:
    client = ollama.Client(host=node.url, timeout=600)
    answer = client.chat(
        model=QWEN_MODEL, messages=ASK, options={"temperature": 0, "num_predict": 8}, keep_alive=keep_alive
    )
    return answer.message.content or ""


def test_ten_first_requests_load_once_and_keep_alive_unloads_then_reloads(bare_node: NodeProcess) -> None:
    assert instances_of(bare_node, QWEN_MODEL) == []
    seen: set[str] = set()
    with ThreadPoolExecutor(max_workers=11) as pool:
        watching = True

        def watch() -> None:  # every instance of the model that ever exists while the requests run
            while watching:
                seen.update(instances_of(bare_node, QWEN_MODEL))
                time.sleep(0.1)

        watcher = pool.submit(watch)
        asks: list[Any] = [pool.submit(openai_ttft, bare_node) for _ in range(4)]
        asks += [pool.submit(ollama_chat, bare_node) for _ in range(5)]
        asks += [pool.submit(anthropic_message, bare_node)]
        answers = [a.result(timeout=600) for a in asks]
        watching = False
        watcher.result(timeout=10)
    last_answer = time.monotonic()
    texts = [a[0] if isinstance(a, tuple) else a for a in answers]
    assert all("paris" in t.lower() for t in texts), texts
    assert len(seen) == 1, seen  # ten first requests, one placement
    on_demand_ttft = min(a[1] for a in answers if isinstance(a, tuple))

    ps = httpx.get(bare_node.url + "/api/ps", timeout=10).json()["models"]
    expires = datetime.fromisoformat(ps[0]["expires_at"].replace("Z", "+00:00"))
    assert 0 < (expires - datetime.now(UTC)).total_seconds() < 5, ps  # keep_alive "2s", not the 5 min default

    bare_node.wait_until(lambda: instances_of(bare_node, QWEN_MODEL) == [], 20, "the idle instance to be removed")
    gone_after = time.monotonic() - last_answer
    assert gone_after >= 1.5, gone_after  # not before its keep_alive

    reload_text, reload_ttft = openai_ttft(bare_node)  # loads it again (alone this time)
    assert "paris" in reload_text.lower()
    again = instances_of(bare_node, QWEN_MODEL)
    assert len(again) == 1 and again[0] not in seen
    ps = httpx.get(bare_node.url + "/api/ps", timeout=10).json()["models"]
    expires = datetime.fromisoformat(ps[0]["expires_at"].replace("Z", "+00:00"))
    assert 240 < (expires - datetime.now(UTC)).total_seconds() <= 301, ps  # no keep_alive given: the default 5 min
    assert "paris" in ollama_chat(bare_node, keep_alive=-1).lower()  # -1: it stays until deleted
    ps = httpx.get(bare_node.url + "/api/ps", timeout=10).json()["models"]
    assert ps[0]["expires_at"].startswith("2999"), ps
    placed_text, placed_ttft = openai_ttft(bare_node)
    assert "paris" in placed_text.lower()
    print(
        f"\n[on-demand] time to first token: ten first requests at once {on_demand_ttft:.2f}s, one request "
        f"that reloads it {reload_ttft:.2f}s, placed {placed_ttft:.2f}s; removed {gone_after:.1f}s after the "
        "last request (keep_alive 2s)"
    )


def test_embeddings_load_on_first_use(bare_node: NodeProcess, models_dir: Path) -> None:
    from skulk_engine_llamacpp.models import ProvisionError, provision_minilm

    try:
        provision_minilm(models_dir)
    except ProvisionError as exc:
        pytest.skip(f"all-MiniLM-L6-v2 not provisionable here: {exc}")
    assert instances_of(bare_node, EMBED_MODEL) == []
    client = openai.OpenAI(base_url=bare_node.url + "/v1", api_key="x", max_retries=0, timeout=600)
    vectors = client.embeddings.create(model=EMBED_MODEL, input=["on demand"]).data
    assert len(vectors) == 1 and len(vectors[0].embedding) == 384
    assert len(instances_of(bare_node, EMBED_MODEL)) == 1


def test_a_model_too_large_for_any_node_is_a_4xx_with_the_reason_at_once(
    bare_node: NodeProcess, models_dir: Path
) -> None:
    import gguf
    import numpy as np

    (models_dir / "local").mkdir(exist_ok=True)
    path = models_dir / "local" / f"giant-{uuid.uuid4().hex[:6]}.gguf"  # a real header, 4 TB of weights on paper
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 80), (writer.add_embedding_length, 8192), (writer.add_head_count, 64)):
        add(value)
    writer.add_head_count_kv(8)
    writer.add_context_length(8192)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "r+b") as f:
        f.truncate(4 * 1024**4)
    try:
        added = bare_node.post("/models/add", json={"path": str(path), "model_id": "test/giant"})
        assert added.status_code == 200, added.text
        client = openai.OpenAI(base_url=bare_node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        began = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="test/giant", messages=ASK, stream=True)  # type: ignore[arg-type]
        took = time.monotonic() - began
        assert 400 <= caught.value.status_code < 500 and "GiB" in str(caught.value), caught.value
        assert took < 1.0, took
        began = time.monotonic()
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=bare_node.url, timeout=30).chat(model="test/giant", messages=ASK)
        assert 400 <= refused.value.status_code < 500 and "GiB" in refused.value.error
        assert time.monotonic() - began < 1.0
        assert instances_of(bare_node, "test/giant") == []
    finally:
        httpx.delete(bare_node.url + "/models/custom/test/giant", timeout=10)
        path.unlink()  # never leave 4 TB (on paper) in the shared models directory
