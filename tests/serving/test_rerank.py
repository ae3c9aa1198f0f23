"""Issue [surface] acceptance 2: `/v1/rerank` on a node, through llama.cpp's rank pooling.

The real path: a node process, the store's card for a GGUF with rank pooling (tasks `TextRerank`),
the runner, llama.cpp's server started for reranking. The model is a tiny random BERT cross-encoder
(:mod:`skulk_engine_llamacpp.tiny_rerank`): no registry reachable here ships a trained reranker
(FACTS.md lists none), so relevance itself is not checked; what is checked is the shape of each API,
that results are sorted by the scores the engine gave each document (the same scores whatever the
documents' order, and `/v1/score`'s in the request's order), and every error path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RERANKER, CHAT, ON_DEMAND = "test/tiny-reranker", "test/tiny-chat-card", "test/tiny-reranker-on-demand"
QUERY = "what is the capital of france"
DOCS = ["the cat is blue", "paris is the capital of france", "dogs and cats"]


@pytest.fixture(scope="module")
def rerank_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.tiny import write_tiny_chatml_gguf
    from skulk_engine_llamacpp.tiny_rerank import write_tiny_reranker_gguf

    reranker = write_tiny_reranker_gguf(models_dir / "local" / "tiny-reranker.gguf")
    chat = write_tiny_chatml_gguf(models_dir / "local" / "tiny-random-chatml-4k.gguf", context_length=4096)
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"rerank-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", "--no-default-models", home=tmp_path_factory.mktemp("rerank"), env=env)
    try:
        node.wait_api(timeout=60)
        for path, model_id in ((reranker, RERANKER), (chat, CHAT), (reranker, ON_DEMAND)):
            added = node.post("/models/add", json={"path": str(path), "model_id": model_id}, timeout=30)
            assert added.status_code == 200, added.text
        place_until_listed(node, RERANKER)
        node.wait_ready(RERANKER, timeout=120)
        yield node
    finally:
        node.stop()


def test_the_store_reads_a_rank_pooling_gguf_as_a_reranker(rerank_node: NodeProcess) -> None:
    listed = {m["id"]: m for m in rerank_node.get("/models").json()["data"]}
    assert listed[RERANKER]["tasks"] == ["TextRerank"]


def test_rerank_orders_documents_by_the_engines_scores(rerank_node: NodeProcess) -> None:
    body = {"model": RERANKER, "query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2]]}
    r = rerank_node.post("/v1/rerank", json=body, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["model"] == RERANKER and got["usage"]["total_tokens"] > 0
    results = got["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert all(x["document"]["text"] == DOCS[x["index"]] for x in results)
    by_doc = {DOCS[x["index"]]: x["relevance_score"] for x in results}

    # the same documents in another order score the same (the model reads each pair alone)
    reversed_docs = list(reversed(DOCS))
    again = rerank_node.post(
        "/rerank",
        json={"model": RERANKER, "query": QUERY, "documents": reversed_docs, "top_n": 2, "return_documents": False},
        timeout=30,
    ).json()
    assert len(again["results"]) == 2 and all("document" not in x for x in again["results"])
    for x in again["results"]:
        assert x["relevance_score"] == pytest.approx(by_doc[reversed_docs[x["index"]]], abs=1e-4)
    assert [reversed_docs[x["index"]] for x in again["results"]] == sorted(by_doc, key=lambda d: -by_doc[d])[:2]

    # vLLM's score API: the scores in text_2's order
    score = rerank_node.post("/v1/score", json={"model": RERANKER, "text_1": QUERY, "text_2": DOCS}, timeout=30)
    assert score.status_code == 200, score.text
    data = score.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert [d["score"] for d in data] == pytest.approx([by_doc[d] for d in DOCS], abs=1e-4)


def test_the_cohere_sdk_reranks_as_written(rerank_node: NodeProcess) -> None:
    """Cohere's clients as their users write them: v2 posts to /v2/rerank, v1 to /v1/rerank."""
    cohere = pytest.importorskip("cohere")
    v2 = cohere.ClientV2(api_key="unused-on-loopback", base_url=rerank_node.url)
    got = v2.rerank(model=RERANKER, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in got.results] != [] and len(got.results) == 2
    assert got.results[0].relevance_score >= got.results[1].relevance_score
    v1 = cohere.Client(api_key="unused-on-loopback", base_url=rerank_node.url)
    old = v1.rerank(model=RERANKER, query=QUERY, documents=DOCS, return_documents=True)
    assert {r.index for r in old.results} == {0, 1, 2}
    assert all(r.document is not None and r.document.text == DOCS[r.index] for r in old.results)


def test_a_reranker_with_no_instance_is_placed_on_request(rerank_node: NodeProcess) -> None:
    body = {"model": ON_DEMAND, "query": QUERY, "documents": DOCS}
    r = rerank_node.post("/v1/rerank", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 3 and rerank_node.ready_instances(ON_DEMAND)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": CHAT, "query": QUERY, "documents": DOCS}, 400, f"model {CHAT!r} does not support TextRerank"),
        ({"model": RERANKER, "query": QUERY, "documents": []}, 400, "documents: the list is empty"),
        ({"model": RERANKER, "query": QUERY, "documents": ["x"] * 1001}, 400, "over the 1000 one request may rank"),
        ({"model": RERANKER, "query": QUERY, "documents": ["ok", "y" * 3000]}, 400, "documents[1]: the query and"),
        ({"model": RERANKER, "query": QUERY, "documents": ["a", ""]}, 400, "documents[1]: an empty document"),
        ({"model": RERANKER, "documents": DOCS}, 400, "query"),
        ({"model": "no/such-model", "query": QUERY, "documents": DOCS}, 404, "not known to this cluster"),
    ],
)
def test_rerank_refuses_what_it_cannot_rank_with_a_reason(
    rerank_node: NodeProcess, body: dict[str, object], status: int, says: str
) -> None:
    r = rerank_node.post("/v1/rerank", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


def test_score_takes_one_query(rerank_node: NodeProcess) -> None:
    r = rerank_node.post("/v1/score", json={"model": RERANKER, "text_1": ["a", "b"], "text_2": ["c", "d"]}, timeout=30)
    assert r.status_code == 400 and "one non-empty query" in r.json()["error"]["message"]
