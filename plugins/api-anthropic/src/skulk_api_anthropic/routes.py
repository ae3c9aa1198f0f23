"""The Anthropic routes: Messages (JSON and SSE), count_tokens, models.

Every inference goes through the API host's one dispatch path (`skulk_api_control.dispatch.generate`);
this module only reads the request, picks the HTTP answer and hands chunks to the wire encoders.

Errors known before the first byte (bad body, unknown model, no instance, context overflow, a first
chunk that is an error) are HTTP statuses in Anthropic's error shape
`{"type": "error", "error": {"type", "message"}, "request_id"}`; 4xx carry `x-should-retry: false`.

`GET /v1/models` is shared with the OpenAI adapter: `AnthropicModelsDispatch`, an ASGI middleware,
sends a `GET /v1/models[/{id}]` that carries `anthropic-version` or `x-api-key` (which the Anthropic
SDKs always send and OpenAI clients never do) to `/anthropic/v1/models[/{id}]`; everything else is
left alone.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
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
from skulk_api_control.dispatch import InferenceError, InferenceHandle, generate
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.streaming import Dispatch
from skulk_api_control.wire_common import StopWatch, error_status
from skulk_kernel.api import ErrorChunk, NodeSurface, new_id
from starlette.types import ASGIApp, Receive, Scope, Send

from . import messages
from .requests import MessagesCreateIn, MessagesIn, RequestError, estimate_tokens, parse_messages_request

MODELS_PATH = "/v1/models"
INTERNAL_MODELS_PATH = "/anthropic/v1/models"
_OVERFLOW_COUNT = re.compile(r"prompt has (\d+) tokens")


def request_id() -> str:
    return "req_" + new_id().replace("-", "")[:24]


def anthropic_error(status: int, message: str, error_type: str | None = None) -> JSONResponse:
    rid = request_id()
    headers = {"request-id": rid}
    if 400 <= status < 500:
        headers["x-should-retry"] = "false"
    return JSONResponse(
        messages.error_body(error_type or messages.error_type_for(status), message, rid),
        status_code=status,
        headers=headers,
    )


def inference_error(exc: InferenceError) -> JSONResponse:
    return anthropic_error(exc.status, exc.message)


def chunk_error(chunk: ErrorChunk) -> JSONResponse:
    return anthropic_error(error_status(chunk), chunk.message)


ERRORS = ErrorAnswers(inference=inference_error, chunk=chunk_error)


class AnthropicModelsDispatch:
    """Routes `GET /v1/models[/{id}]` from Anthropic clients to this plugin's model list."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD"):
            path: str = scope.get("path", "")
            if path == MODELS_PATH or path.startswith(MODELS_PATH + "/"):
                names = {name for name, _ in scope.get("headers", ())}
                if b"anthropic-version" in names or b"x-api-key" in names:
                    new_path = "/anthropic" + path
                    scope = {**scope, "path": new_path, "raw_path": new_path.encode()}
        await self.app(scope, receive, send)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_anthropic_routes(app: FastAPI, node: NodeSurface, *, keepalive_s: float = 10.0) -> None:
    app.add_middleware(AnthropicModelsDispatch)

    def canonical(ref: str) -> str:
        return canonical_model(node, ref)

    async def read_request(request: Request, require_max_tokens: bool = True) -> Any:
        body = await read_json(request, RequestError)
        return parse_messages_request(body, require_max_tokens=require_max_tokens)

    # --- messages --------------------------------------------------------------------------------

    @app.post("/v1/messages", tags=["anthropic"], openapi_extra=body_schema(MessagesCreateIn))
    async def post_messages(request: Request) -> Response:
        """Anthropic Messages (JSON, or SSE with `stream: true`)."""
        try:
            req = await read_request(request)
        except RequestError as exc:
            return anthropic_error(exc.status, exc.message, exc.error_type)
        model = canonical(req.model)
        estimate = estimate_tokens(req.params)
        command_id = new_id()
        message_id = f"msg_{command_id}"  # so POST /v1/cancel/{command_id} can be found from the message
        stops = StopWatch(req.stop_sequences)
        encoder = messages.MessageStreamEncoder(
            message_id=message_id, model=model, input_estimate=estimate, stops=stops
        )

        async def complete(handle: InferenceHandle) -> Response:
            got = await messages.collect(stops.watch(handle.chunks()))
            if got.error is not None:
                return chunk_error(got.error)
            return JSONResponse(
                messages.message_body(
                    got, message_id=message_id, model=model, input_estimate=estimate, stop_sequence=stops.matched
                ),
                headers={"request-id": request_id()},
            )

        def stream(dispatch: Dispatch) -> AsyncIterator[str]:
            return _message_sse(dispatch, encoder, keepalive_s)

        call = generate(node, req.params, command_id=command_id)
        return await answer(
            request, call, ERRORS, complete, stream=stream if req.stream else None, keepalive_s=keepalive_s
        )

    # --- count_tokens ----------------------------------------------------------------------------

    @app.post("/v1/messages/count_tokens", tags=["anthropic"], openapi_extra=body_schema(MessagesIn))
    async def post_count_tokens(request: Request) -> Response:
        """`{"input_tokens": N}`, counted by the model's own engine (a one-token generation).

        The prompt goes through the normal dispatch path with max_tokens=1, so the count is the
        engine's: tokenizer, chat template and tool definitions included. If the engine reports no
        usage, or the prompt is over the context limit and the limit error does not say the count,
        the answer is an estimate (about 4 characters a token) and says so in
        `x-skulk-token-count: estimate`.
        """
        try:
            req = await read_request(request, require_max_tokens=False)
        except RequestError as exc:
            return anthropic_error(exc.status, exc.message, exc.error_type)
        sampling = req.params.sampling.model_copy(update={"max_tokens": 1, "stop": ()})
        params = req.params.model_copy(update={"sampling": sampling})

        def counted(count: int | None) -> Response:
            if count is not None:
                return JSONResponse({"input_tokens": count}, headers={"x-skulk-token-count": "exact"})
            estimate = estimate_tokens(req.params)
            return JSONResponse({"input_tokens": estimate}, headers={"x-skulk-token-count": "estimate"})

        def too_long(exc: InferenceError) -> Response:
            """Over the context limit is still an answer: the count the error names, else the estimate."""
            if exc.code != "context_length_exceeded":
                return inference_error(exc)
            found = _OVERFLOW_COUNT.search(exc.message)
            return counted(int(found.group(1)) if found is not None else None)

        async def complete(handle: InferenceHandle) -> Response:
            got = await messages.collect(handle.chunks())
            if got.error is not None:
                return chunk_error(got.error)
            usage = got.usage
            return counted(usage.prompt_tokens if usage is not None and usage.prompt_tokens > 0 else None)

        errors = ErrorAnswers(inference=too_long, chunk=chunk_error)
        return await answer(request, generate(node, params), errors, complete)

    # --- models ----------------------------------------------------------------------------------

    def model_entries() -> list[dict[str, Any]]:
        created = rfc3339(0)  # release dates are unknown: the epoch, as Anthropic's spec allows
        known = cards(node)
        entries = []
        for model_id, canonical_id in listed_models(node, known):
            card = known.get(canonical_id)
            if card is not None and "TextGeneration" not in card.tasks:
                continue  # /v1/messages cannot use embedding models
            entries.append(
                {
                    "type": "model",
                    "id": model_id,
                    "display_name": model_id,
                    "created_at": created,
                    "lifecycle": "active",
                    "deprecated_at": None,
                    "retires_at": None,
                    "line": None,
                    "max_input_tokens": card.context_length if card is not None else None,
                    "max_tokens": card.context_length if card is not None else None,
                }
                | ({"alias_of": canonical_id} if model_id != canonical_id else {})  # a short name
            )
        return entries

    @app.get(INTERNAL_MODELS_PATH, tags=["anthropic"])
    async def get_models(request: Request) -> Response:
        """Anthropic's model list (`GET /v1/models` with Anthropic headers lands here).

        Paginated with `limit` (1-1000, default 20), `after_id` and `before_id`; `has_more` is always
        set, so SDK auto-pagination terminates.
        """
        entries = model_entries()
        q = request.query_params
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            return anthropic_error(400, "limit: must be an integer")
        if not 1 <= limit <= 1000:
            return anthropic_error(400, "limit: must be between 1 and 1000")
        ids = [e["id"] for e in entries]
        if q.get("after_id"):
            start = ids.index(q["after_id"]) + 1 if q["after_id"] in ids else len(ids)
            page = entries[start : start + limit]
            has_more = start + limit < len(entries)
        elif q.get("before_id"):
            end = ids.index(q["before_id"]) if q["before_id"] in ids else 0
            page = entries[max(0, end - limit) : end]
            has_more = end - limit > 0
        else:
            page = entries[:limit]
            has_more = limit < len(entries)
        return JSONResponse(
            {
                "data": page,
                "has_more": has_more,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
            }
        )

    @app.get(INTERNAL_MODELS_PATH + "/{model_id:path}", tags=["anthropic"])
    async def get_model(model_id: str) -> Response:
        wanted = canonical(model_id)
        for entry in model_entries():
            if entry["id"] in (model_id, wanted):
                return JSONResponse(entry)
        return anthropic_error(404, f"model: {model_id!r} is not known to this cluster")


def _message_sse(dispatch: Dispatch, encoder: messages.MessageStreamEncoder, keepalive_s: float) -> AsyncIterator[str]:
    """The SSE body: message_start (and pings while the first chunk is awaited), then the events."""

    def failed(exc: InferenceError) -> str:
        return messages.error_event(messages.error_type_for(exc.status), exc.message)

    return stream_body(
        dispatch,
        lambda handle: encoder.events(handle.chunks()),
        failed,
        keepalive=messages.PING,
        keepalive_s=keepalive_s,
        head=encoder.message_start(),
    )
