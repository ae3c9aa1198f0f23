"""Issue [capacity] acceptance 2 on a real node: placements committed but not loaded count against it.

One echo node (no default model). A card added with a storage size of about 60 % of the node's
free memory fits once: two POST /place_instance in a row give one 200 and one 400 (the first
runner has not loaded when the second is decided, so the node's telemetry does not show it yet).
The previews show context, KV and weights bytes per node, and a context above the card's is a 400.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from skulk_testing.echo_node import CORE_PLUGINS, echo_node

MODEL = "local/big-echo"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    with echo_node(Path(tmp_path_factory.mktemp("admission")), (), [*CORE_PLUGINS, "store"]) as proc:
        yield proc


def free_bytes(node) -> int:  # type: ignore[no-untyped-def]
    memory = node.get("/state").json()["nodeMemory"]
    return int(next(iter(memory.values()))["ramAvailable"]["inBytes"])


def test_two_placements_in_a_row_never_share_the_same_free_memory(node) -> None:  # type: ignore[no-untyped-def]
    node.wait_until(lambda: free_bytes(node) > 0, 10, "the node's memory reading")
    size = int(free_bytes(node) * 0.6 / 1.25)  # weights x overhead: 60 % of what is free
    card = {"model_id": MODEL, "n_layers": 4, "hidden_size": 64, "context_length": 512, "storage_size": size}
    added = node.post("/models/add-card", json={"card": {**card, "compatible_backends": ["echo-cpu"]}})
    assert added.status_code == 200, added.text

    first = node.post("/place_instance", json={"model_id": MODEL})
    second = node.post("/place_instance", json={"model_id": MODEL})
    assert first.status_code == 200, first.text
    assert second.status_code == 400, second.text
    assert second.json()["error"]["code"] == "memory_shortfall"
    assert "committed to instances not loaded yet" in second.json()["error"]["message"]
    httpx.delete(f"{node.url}/instance/{first.json()['instance_id']}", timeout=30)


def test_previews_show_context_kv_and_weights_per_node(node) -> None:  # type: ignore[no-untyped-def]
    answer = node.get("/instance/placement", params={"model_id": "skulk/echo", "context_tokens": 1024})
    assert answer.status_code == 200, answer.text
    (memory,) = answer.json()["memory_by_node"].values()
    assert memory["context_tokens"] == 1024 and memory["kv_cache_type"] == "f16"
    assert {"weights_bytes", "kv_bytes", "need_bytes"} <= set(memory)
    assert answer.json()["instance"]["MlxRingInstance"]["contextLimit"] == 1024

    previews = node.get("/instance/previews", params={"model_id": "skulk/echo"}).json()["previews"]
    placed = [p for p in previews if p["instance"] is not None]
    assert placed and all(p["memory_by_node"] for p in placed)

    too_long = node.post("/place_instance", json={"model_id": "skulk/echo", "context_tokens": 10**6})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_too_long"
    q4 = node.post("/place_instance", json={"model_id": "skulk/echo", "kv_cache_type": "q4_0"})
    assert q4.status_code == 400 and "quantizes its KV cache" in q4.json()["error"]["message"]
    bad = node.post("/place_instance", json={"model_id": "skulk/echo", "kv_cache_type": "q3"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kv_cache_type"
