"""The OpenAI routes: chat completions (JSON and SSE), bench chat completions, embeddings, models
(and the Responses API, added from `responses_routes.py`).

Every route goes through the API host's one dispatch path (`skulk_api_control.dispatch.generate/embed`);
this module only reads the request, picks the HTTP answer and hands chunks to the wire encoders.

Errors known before the first byte (bad body, unknown model, no instance, context overflow, a first
chunk that is an error) are HTTP statuses in OpenAI's error shape; 4xx carry `x-should-retry: false`.

Streams and the first chunk: a stream waits up to `keepalive_s` for `generate()` (which returns
with the first chunk). Most requests get their first chunk, or their error, well within that, so the
decision is an ordinary HTTP status. A request still waiting after `keepalive_s` (queued behind
others, instance still loading, a long prefill) gets its 200 and SSE headers at once, a
`: keep-alive` comment every `keepalive_s`, then `: command_id <id>` and the normal stream; an
error that comes that late is sent as a `data: {"error": ...}` event. So `: command_id` is the first
line of every stream that did not have to wait.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from skulk_api_control.adapter_routes import (
    ErrorAnswers,
    answer,
    canonical_model,
    cards,
    listed_models,
    read_json,
    stream_body,
)
from skulk_api_control.dispatch import InferenceError, InferenceHandle, embed, generate
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.server import openai_error  # the host's, so every OpenAI-style error looks the same
from skulk_api_control.streaming import Dispatch
from skulk_api_control.wire_common import collect_embeddings
from skulk_kernel.api import ErrorChunk, NodeSurface

from . import chat, embeddings
from .requests import (
    ChatCompletionRequest,
    EmbeddingsRequestIn,
    RequestError,
    parse_chat_request,
    parse_embeddings_request,
)


def request_error(exc: RequestError) -> JSONResponse:
    return openai_error(exc.status, exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)


def inference_error(exc: InferenceError) -> JSONResponse:
    return openai_error(exc.status, exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)


def chunk_error(chunk: ErrorChunk) -> JSONResponse:
    return openai_error(chat.error_status(chunk), chunk.message, error_type=chunk.error_type, code=chunk.code)


ERRORS = ErrorAnswers(inference=inference_error, chunk=chunk_error)


def add_openai_routes(app: FastAPI, node: NodeSurface, *, keepalive_s: float = 10.0) -> None:
    fingerprint = f"skulk-{node.runtime_info().get('skulkVersion', '0')}"

    def canonical(ref: str) -> str:
        return canonical_model(node, ref)

    # --- chat ------------------------------------------------------------------------------------

    async def chat_completions(request: Request, bench: bool = False) -> Response:
        try:
            req = parse_chat_request(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        model = canonical(req.model)
        created = int(time.time())

        def encoder(command_id: str) -> chat.ChatStreamEncoder:
            return chat.ChatStreamEncoder(
                completion_id=f"chatcmpl-{command_id}",
                created=created,
                model=model,
                fingerprint=fingerprint,
                want_logprobs=req.logprobs,
                include_usage=req.include_usage,
            )

        async def complete(handle: InferenceHandle) -> Response:
            got = await chat.collect(handle.chunks(), req.logprobs)
            if got.error is not None:
                return chunk_error(got.error)
            return JSONResponse(
                chat.completion_body(
                    got,
                    completion_id=f"chatcmpl-{handle.command_id}",
                    created=created,
                    model=model,
                    fingerprint=fingerprint,
                    want_logprobs=req.logprobs,
                    with_stats=bench,
                )
            )

        def stream(dispatch: Dispatch) -> AsyncIterator[str]:
            return _chat_sse(dispatch, encoder, keepalive_s)

        call = generate(node, req.params)
        return await answer(
            request, call, ERRORS, complete, stream=stream if req.stream else None, keepalive_s=keepalive_s
        )

    @app.post("/v1/chat/completions", tags=["openai"], openapi_extra=body_schema(ChatCompletionRequest))
    @app.post("/chat/completions", include_in_schema=False)
    async def post_chat_completions(request: Request) -> Response:
        """OpenAI Chat Completions (JSON or SSE with `stream: true`)."""
        return await chat_completions(request)

    @app.post("/bench/chat/completions", tags=["openai"], openapi_extra=body_schema(ChatCompletionRequest))
    async def post_bench_chat_completions(request: Request) -> Response:
        """Chat Completions whose JSON answer adds `generation_stats` (streams carry it as a comment)."""
        return await chat_completions(request, bench=True)

    # --- responses (responses_routes.py) ---------------------------------------------------------

    from .responses_routes import add_responses_routes

    add_responses_routes(app, node, keepalive_s=keepalive_s, canonical=canonical)

    # --- text completions, tokenize (completions_routes.py) -------------------------------------

    from .completions_routes import add_completion_routes

    add_completion_routes(
        app,
        node,
        keepalive_s=keepalive_s,
        canonical=canonical,
        fingerprint=fingerprint,
        errors=ERRORS,
        request_error=request_error,
    )

    # --- reranking (rerank.py) -------------------------------------------------------------------

    from .rerank import add_rerank_routes

    add_rerank_routes(app, node, canonical=canonical, errors=ERRORS, request_error=request_error)

    # --- embeddings ------------------------------------------------------------------------------

    @app.post("/v1/embeddings", tags=["openai"], openapi_extra=body_schema(EmbeddingsRequestIn))
    @app.post("/embeddings", include_in_schema=False)
    async def post_embeddings(request: Request) -> Response:
        """OpenAI Embeddings: `input` is a string or a list of strings; float or base64 output."""
        try:
            req = parse_embeddings_request(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        model = canonical(req.model)

        async def complete(handle: InferenceHandle) -> Response:
            got = await collect_embeddings(handle.chunks())
            if got.error is not None:
                return chunk_error(got.error)
            if len(got.vectors) != len(req.params.inputs):
                return openai_error(
                    500,
                    f"the engine returned {len(got.vectors)} embeddings for {len(req.params.inputs)} inputs",
                    error_type="server_error",
                )
            if req.dimensions is not None and got.vectors and len(got.vectors[0]) != req.dimensions:
                return openai_error(
                    400,
                    f"dimensions: {model} produces {len(got.vectors[0])}-dimensional "
                    f"embeddings and cannot return {req.dimensions}",
                    param="dimensions",
                    code="unsupported_parameter",
                )
            return JSONResponse(
                embeddings.embeddings_body(
                    got.vectors,
                    model=model,
                    encoding_format=req.encoding_format,
                    prompt_tokens=got.prompt_tokens,
                )
            )

        return await answer(request, embed(node, req.params), ERRORS, complete)

    # --- models ----------------------------------------------------------------------------------

    def model_entries() -> list[dict[str, Any]]:
        """Every accepted name; an alias (a short name, `whisper-1`) says which model it is (`alias_of`);
        `capabilities` (an extension: `vision`, `tools`, ...) as the card says."""
        created = int(node.started_at)
        known = cards(node)
        return [
            {"id": name, "object": "model", "created": created, "owned_by": "skulk"}
            | ({"alias_of": model_id} if name != model_id else {})
            | {"capabilities": list(known[model_id].capabilities) if model_id in known else []}
            for name, model_id in listed_models(node, known)
        ]

    @app.get("/v1/models", tags=["openai"])
    async def get_models() -> dict[str, Any]:
        """Models with a running instance first, then every catalog model."""
        return {"object": "list", "data": model_entries()}

    @app.get("/v1/models/{model_id:path}", tags=["openai"])
    async def get_model(model_id: str) -> Response:
        entries = model_entries()
        wanted = canonical(model_id)
        for entry in sorted(entries, key=lambda e: e["id"] != model_id):  # the exact name first
            if entry["id"] in (model_id, wanted):
                return JSONResponse(entry)
        return openai_error(
            404, f"model {model_id!r} is not known to this cluster", param="model", code="model_not_found"
        )


def _chat_sse(
    dispatch: Dispatch, encoder: Callable[[str], chat.ChatStreamEncoder], keepalive_s: float
) -> AsyncIterator[str]:
    """The SSE body: keep-alives while the first chunk is awaited, then the chat chunk events."""

    async def events(handle: InferenceHandle) -> AsyncIterator[str]:
        yield f": command_id {handle.command_id}\n\n"
        async for line in encoder(handle.command_id).events(handle.chunks()):
            yield line

    def failed(exc: InferenceError) -> str:
        return chat.ChatStreamEncoder.error(exc.message, exc.error_type, exc.code)

    return stream_body(dispatch, events, failed, keepalive=chat.KEEPALIVE, keepalive_s=keepalive_s)
