"""Reranking through a Skulk node vs llama.cpp's server alone, and `ollama pull` vs the store's own download.

    python bench/bench_rerank.py [--rounds 40] [--docs 8]

* Rerank latency: `--rounds` requests of `--docs` documents through the node's /v1/rerank (profile
  cpu-llamacpp, the tiny random cross-encoder, `skulk_engine_llamacpp.tiny_rerank`) against the same
  GGUF on a ``LlamaServer`` started here with the same settings (the engine alone), alternated
  request by request. Reported: the median of each and node / engine (what the node adds: HTTP,
  the TextRerank task through the master, the runner, the chunk stream).
* Pull: the same 93 MB GGUF (SmolLM2, from the package index) served by a loopback hub, fetched
  by `ollama pull` (the Ollama route: progress polled and streamed) and by `POST /models/add`
  (the store's download alone), into two fresh model ids, alternated; seconds and pull / add.

Everything is a ratio against a baseline measured in the same run; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--no-pull", action="store_true")
    args = parser.parse_args()

    import httpx
    import ollama
    from skulk_engine_llamacpp.server_backend import LlamaServer
    from skulk_engine_llamacpp.tiny_rerank import write_tiny_reranker_gguf
    from skulk_testing.nodes import start_node

    from tests.serving.placing import place_until_listed
    from tests.store.hub_server import HubRepo, LoopbackHub

    tmp = Path(tempfile.mkdtemp(prefix="bench-rerank-"))
    models = tmp / "models"
    (models / "local").mkdir(parents=True)
    gguf = write_tiny_reranker_gguf(models / "local" / "tiny-reranker.gguf")
    query = "what is the capital of france"
    docs = [f"document {i} says paris is the capital of france and the sky is blue" for i in range(args.docs)]
    hub = LoopbackHub()
    big: Path | None = None
    if not args.no_pull:
        from skulk_engine_llamacpp.models import provision_smollm2

        cache = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
        big = Path(provision_smollm2(cache))
        hub.add(HubRepo.from_files("bench/smollm2-GGUF", {big.name: big}))
    out: dict[str, object] = {"load_before": os.getloadavg()[0], "docs": args.docs, "rounds": args.rounds}
    with hub:
        env = {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_OFFLINE": "0",
            "SKULK_MODELS_DIR": str(models),
            "SKULK_NETWORK_VERSION": f"bench-rerank-{uuid.uuid4().hex[:6]}",
        }
        node = start_node("cpu-llamacpp", "--no-default-models", home=tmp / "home", env=env)
        engine = LlamaServer(gguf, reranking=True, n_parallel=4, n_threads=1)
        try:
            node.wait_api(60)
            node.post("/models/add", json={"path": str(gguf), "model_id": "tiny-reranker"}, timeout=30)
            place_until_listed(node, "tiny-reranker")
            node.wait_ready("tiny-reranker", 120)
            engine.start()
            body = {"model": "tiny-reranker", "query": query, "documents": docs}
            via_node, alone = [], []
            with httpx.Client(base_url=node.url, timeout=60) as client:
                for _ in range(3):  # warm both
                    client.post("/v1/rerank", json=body)
                    engine.rerank(query, docs)
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    assert client.post("/v1/rerank", json=body).status_code == 200
                    via_node.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    engine.rerank(query, docs)
                    alone.append(time.perf_counter() - t)
            node_ms, engine_ms = statistics.median(via_node) * 1000, statistics.median(alone) * 1000
            out["rerank"] = {
                "node_median_ms": round(node_ms, 2),
                "engine_median_ms": round(engine_ms, 2),
                "node_over_engine": round(node_ms / engine_ms, 2),
                "node_added_ms": round(node_ms - engine_ms, 2),
            }
            if big is not None:
                pulls, adds = [], []
                oc = ollama.Client(host=node.url, timeout=300)
                for i in range(2):  # alternated; each into a fresh model id, deleted after
                    t = time.perf_counter()
                    assert oc.pull("hf.co/bench/smollm2-GGUF").status == "success"
                    pulls.append(time.perf_counter() - t)
                    oc.delete("hf.co/bench/smollm2-GGUF")
                    model_id = f"bench/add-{i}"
                    t = time.perf_counter()
                    node.post("/models/add", json={"repo_id": "bench/smollm2-GGUF", "model_id": model_id}, timeout=60)
                    while node.get(f"/store/models/{model_id}/download").json()["status"] != "installed":
                        time.sleep(0.05)
                    adds.append(time.perf_counter() - t)
                    oc.delete(model_id)
                out["pull"] = {
                    "bytes": big.stat().st_size,
                    "ollama_pull_s": [round(x, 2) for x in pulls],
                    "models_add_s": [round(x, 2) for x in adds],
                    "pull_over_add": round(statistics.median(pulls) / statistics.median(adds), 2),
                }
        finally:
            engine.close()
            node.stop()
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
