"""Issue [llama] acceptance 4: 32 concurrent streams of 256 tokens on one node all complete.

The real serving path -- a node process, the runner, llama.cpp's server with its default 16 slots,
the token gate queueing the other 16 (with keep-alives), the node's streams -- on a tiny random
llama GGUF (:mod:`skulk_engine_llamacpp.tiny`), so the burst takes seconds on a busy 2-core box.
The same burst on SmolLM2 is `bench/bench_llama.py --burst`. With the context below, the pool
holds about 14 reservations of prompt + 256 at once, so the gate (not llama.cpp) must keep the KV
pool from overflowing: a failure here is a 5xx, an error event or a stream cut short.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TINY = "test/tiny-random-chatml"
STREAMS, TOKENS = 32, 256


@pytest.fixture(scope="module")
def tiny_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.tiny import write_tiny_chatml_gguf

    path = write_tiny_chatml_gguf(models_dir / "local" / "tiny-random-chatml-4k.gguf", context_length=4096)
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"llama-burst-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", "--no-default-models", home=tmp_path_factory.mktemp("burst"), env=env)
    try:
        node.wait_api(timeout=60)
        added = node.post("/models/add", json={"path": str(path), "model_id": TINY}, timeout=30)
        assert added.status_code == 200, added.text  # held until the node's own master session begins
        place_until_listed(node, TINY)
        node.wait_ready(TINY, timeout=120)
        yield node
    finally:
        node.stop()


async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str | None, int, int]:
    body = {
        "model": TINY,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": TOKENS,
        "temperature": 0.9,
        "seed": i,
        "messages": [{"role": "user", "content": f"Write a long story about ship number {i}."}],
    }
    reason, pieces, completion = None, 0, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return r.status_code, (await r.aread()).decode()[:200], 0, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 200, f"error: {chunk['error']}", pieces, 0
            completion = (chunk.get("usage") or {}).get("completion_tokens", completion)
            for c in chunk["choices"]:
                pieces += bool(c["delta"].get("content"))
                reason = c["finish_reason"] or reason
    return 200, reason, pieces, completion


def test_32_concurrent_streams_of_256_tokens_all_complete(tiny_node: NodeProcess) -> None:
    async def burst() -> list[tuple[int, str | None, int, int]]:
        async with httpx.AsyncClient(
            base_url=tiny_node.url, timeout=240, limits=httpx.Limits(max_connections=64)
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(STREAMS)))

    results = asyncio.run(burst())
    assert [r[0] for r in results] == [200] * STREAMS, results
    assert all(reason in ("stop", "length") and pieces > 0 for _, reason, pieces, _ in results), results
    # the tiny model cannot end a turn early (see tiny.py): every stream runs its full budget
    assert [(reason, completion) for _, reason, _, completion in results] == [("length", TOKENS)] * STREAMS
    assert not tiny_node.get("/state").json()["tasks"]  # every task left State
