"""Reranking: `/v1/rerank` (Jina and Cohere's shape, vLLM's `/rerank` and `/v2/rerank` aliases) and vLLM's `/v1/score`.

A cross-encoder reads the query and one document together and gives the pair a relevance score, which
retrieval pipelines use to reorder what a vector search found. The request becomes one `TextRerank`
task (kernel `RerankParams`): the engine answers a score per document in the request's order (one
`ScoreChunk`), and this module sorts, cuts to `top_n` and writes the wire shape. Reranking models
are cards whose tasks include `TextRerank` (a llama.cpp GGUF with rank pooling); any other model is
refused with a 400 that names it, before a task is made.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field
from skulk_api_control.adapter_routes import ErrorAnswers, answer, read_json
from skulk_api_control.dispatch import InferenceError, InferenceHandle, start
from skulk_api_control.on_demand import model_for, replaced_meanwhile
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.requests_common import StrictBody as _In
from skulk_kernel.api import Chunk, CommandId, ErrorChunk, NodeSurface, RerankParams, ScoreChunk, TextRerank, new_id

from .requests import RequestError, _validate

#: Cohere's limit per request; more is a 400 that says to split the list
MAX_DOCUMENTS = 1000
#: characters in the query plus every document (the engine also refuses a pair over its context)
MAX_TOTAL_CHARS = 4_000_000


class DocumentIn(_In):
    text: str


class RerankRequestIn(_In):
    model: str = Field(min_length=1)
    query: str = Field(min_length=1)
    documents: list[str | DocumentIn] = Field(description="strings, or objects with `text` (Jina, Cohere)")
    top_n: int | None = Field(default=None, ge=1, description="keep the best n (default: all)")
    return_documents: bool = Field(default=True, description="include each document's text in its result")


class ScoreRequestIn(_In):
    model: str = Field(min_length=1)
    text_1: str | list[str] = Field(description="the query (one string, or a list of one)")
    text_2: str | list[str] = Field(description="the documents scored against it")


@dataclass(frozen=True)
class Rerank:
    params: RerankParams
    top_n: int
    return_documents: bool


def _checked(model: str, query: str, documents: list[str], param: str) -> RerankParams:
    if not documents:
        raise RequestError(f"{param}: the list is empty; send at least one document to rank", param=param)
    if len(documents) > MAX_DOCUMENTS:
        raise RequestError(
            f"{param}: {len(documents)} documents, over the {MAX_DOCUMENTS} one request may rank; split the list",
            param=param,
        )
    for i, doc in enumerate(documents):
        if not doc:
            raise RequestError(f"{param}[{i}]: an empty document cannot be ranked", param=param)
    if len(query) + sum(map(len, documents)) > MAX_TOTAL_CHARS:
        raise RequestError(
            f"{param}: the query and documents are over {MAX_TOTAL_CHARS} characters together; send fewer or "
            "shorter documents",
            param=param,
            code="request_too_large",
        )
    return RerankParams(model_id=model, query=query, documents=tuple(documents))


def parse_rerank(data: dict[str, Any]) -> Rerank:
    req: RerankRequestIn = _validate(RerankRequestIn, data)
    docs = [d if isinstance(d, str) else d.text for d in req.documents]
    params = _checked(req.model, req.query, docs, "documents")
    return Rerank(params, min(req.top_n or len(docs), len(docs)), req.return_documents)


def parse_score(data: dict[str, Any]) -> RerankParams:
    req: ScoreRequestIn = _validate(ScoreRequestIn, data)
    queries = [req.text_1] if isinstance(req.text_1, str) else req.text_1
    if len(queries) != 1 or not queries[0]:
        raise RequestError(
            "text_1: one non-empty query per request here (pairwise lists are not supported); send the "
            "documents as text_2",
            param="text_1",
        )
    docs = [req.text_2] if isinstance(req.text_2, str) else req.text_2
    return _checked(req.model, queries[0], docs, "text_2")


async def rerank(node: NodeSurface, params: RerankParams) -> InferenceHandle:
    """One TextRerank task on a ready reranker, placed first when on demand, as embeddings are (an
    InferenceError when the model cannot rerank, or is removed between the two and cannot be placed)."""
    model_id = await model_for(node, params.model_id, "TextRerank")
    if model_id != params.model_id:
        params = params.model_copy(update={"model_id": model_id})
    for again in (False, True):
        command = TextRerank(command_id=CommandId(new_id()), owner_node_id=node.node_id, params=params)
        try:
            return await start(node, command)
        except InferenceError as exc:
            if again or not replaced_meanwhile(node, exc):
                raise
            await model_for(node, model_id, "TextRerank")  # removed (keep_alive) in between: placed again
    raise AssertionError("unreachable")


@dataclass
class Scores:
    scores: tuple[float, ...] = ()
    tokens: int = 0
    error: ErrorChunk | None = None


async def collect_scores(chunks: AsyncIterator[Chunk]) -> Scores:
    out = Scores()
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            out.error = chunk
            break
        if isinstance(chunk, ScoreChunk):
            out.scores += chunk.scores
        if chunk.usage is not None:
            out.tokens = chunk.usage.prompt_tokens
    return out


def rerank_body(req: Rerank, got: Scores, model: str, command_id: str) -> dict[str, Any]:
    order = sorted(range(len(got.scores)), key=lambda i: -got.scores[i])[: req.top_n]
    results = [
        {"index": i, "relevance_score": got.scores[i]}
        | ({"document": {"text": req.params.documents[i]}} if req.return_documents else {})
        for i in order
    ]
    usage = {"prompt_tokens": got.tokens, "total_tokens": got.tokens}
    return {"id": f"rerank-{command_id}", "model": model, "results": results, "usage": usage}


def score_body(got: Scores, model: str, command_id: str) -> dict[str, Any]:
    return {
        "id": f"score-{command_id}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(got.scores)],
        "usage": {"prompt_tokens": got.tokens, "total_tokens": got.tokens, "completion_tokens": 0},
    }


def add_rerank_routes(
    app: FastAPI,
    node: NodeSurface,
    *,
    canonical: Callable[[str], str],
    errors: ErrorAnswers,
    request_error: Callable[[RequestError], JSONResponse],
) -> None:
    async def scored(request: Request, params: RerankParams, body: Callable[[Scores, str, str], Any]) -> Response:
        async def complete(handle: InferenceHandle) -> Response:
            got = await collect_scores(handle.chunks())
            if got.error is not None:
                return errors.chunk(got.error)
            if len(got.scores) != len(params.documents):
                message = f"the engine returned {len(got.scores)} scores for {len(params.documents)} documents"
                return errors.chunk(ErrorChunk(command_id=handle.command_id, seq=0, message=message))
            return JSONResponse(body(got, canonical(params.model_id), handle.command_id))

        return await answer(request, rerank(node, params), errors, complete)

    @app.post("/v1/rerank", tags=["openai"], openapi_extra=body_schema(RerankRequestIn))
    @app.post("/rerank", include_in_schema=False)
    @app.post("/v2/rerank", include_in_schema=False)
    async def post_rerank(request: Request) -> Response:
        """Rerank `documents` by relevance to `query` (Jina/Cohere/vLLM shape), best first."""
        try:
            req = parse_rerank(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        return await scored(request, req.params, lambda got, model, cid: rerank_body(req, got, model, cid))

    @app.post("/v1/score", tags=["openai"], openapi_extra=body_schema(ScoreRequestIn))
    @app.post("/score", include_in_schema=False)
    async def post_score(request: Request) -> Response:
        """vLLM's score API: `text_1` (the query) against each of `text_2`, scores in `text_2`'s order."""
        try:
            params = parse_score(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        return await scored(request, params, score_body)
