"""The Anthropic routes: Messages (JSON and SSE), count_tokens, models.

Every inference goes through the kernel's one dispatch path (`skulk_kernel.inference.generate`);
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

import asyncio
import logging
import re
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from skulk_api_control.streaming import BodyTooLarge, ClientGone, Dispatch, InferenceStreamResponse, read_body
from skulk_kernel.ids import new_id
from skulk_kernel.inference import InferenceError, catalog, generate, resolve_card
from skulk_kernel.tasks import ErrorChunk
from starlette.types import ASGIApp, Receive, Scope, Send

from . import messages
from .requests import RequestError, estimate_tokens, parse_json_object, parse_messages_request

log = logging.getLogger("skulk.api.anthropic")
CLIENT_CLOSED = 499
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
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
    return anthropic_error(messages.error_status(chunk), chunk.message)


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


def add_anthropic_routes(app: FastAPI, node: Any, *, keepalive_s: float = 10.0) -> None:
    app.add_middleware(AnthropicModelsDispatch)

    def canonical(ref: str) -> str:
        try:
            card = resolve_card(node, ref)
        except Exception:
            return ref
        return card.model_id if card is not None else ref

    async def read_request(request: Request, require_max_tokens: bool = True) -> Any:
        try:
            body = await read_body(request)
        except BodyTooLarge as exc:
            raise RequestError(str(exc), status=413, error_type="request_too_large") from None
        return parse_messages_request(parse_json_object(body), require_max_tokens=require_max_tokens)

    # --- messages --------------------------------------------------------------------------------

    @app.post("/v1/messages", tags=["anthropic"])
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
        dispatch = Dispatch(generate(node, req.params, command_id=command_id))
        handing_over = False
        try:
            ready = await dispatch.wait(request, keepalive_s if req.stream else None)
            handle = None
            if ready:
                handle = dispatch.handle()  # raises InferenceError: an HTTP status
                if isinstance(handle.first, ErrorChunk):
                    handle.finished = True  # terminal: nothing to cancel
                    return chunk_error(handle.first)
            if req.stream:
                encoder = messages.MessageStreamEncoder(message_id=message_id, model=model, input_estimate=estimate)
                handing_over = True
                return InferenceStreamResponse(
                    _message_sse(dispatch, encoder, keepalive_s),
                    dispatch.close,
                    media_type="text/event-stream",
                    headers=SSE_HEADERS,
                )
            assert handle is not None
            got = await dispatch.run(request, messages.collect(handle.chunks()))
            if got.error is not None:
                return chunk_error(got.error)
            return JSONResponse(
                messages.message_body(got, message_id=message_id, model=model, input_estimate=estimate),
                headers={"request-id": request_id()},
            )
        except InferenceError as exc:
            return inference_error(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            if not handing_over:
                await dispatch.close()

    # --- count_tokens ----------------------------------------------------------------------------

    @app.post("/v1/messages/count_tokens", tags=["anthropic"])
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
        dispatch = Dispatch(generate(node, params))
        count: int | None = None
        try:
            await dispatch.wait(request)
            handle = dispatch.handle()
            got = await dispatch.run(request, messages.collect(handle.chunks()))
            if got.error is not None:
                return chunk_error(got.error)
            if got.usage is not None and got.usage.prompt_tokens > 0:
                count = got.usage.prompt_tokens
        except InferenceError as exc:
            found = _OVERFLOW_COUNT.search(exc.message) if exc.code == "context_length_exceeded" else None
            if found is not None:
                count = int(found.group(1))
            elif exc.code != "context_length_exceeded":
                return inference_error(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            await dispatch.close()
        if count is not None:
            return JSONResponse({"input_tokens": count}, headers={"x-skulk-token-count": "exact"})
        return JSONResponse({"input_tokens": estimate_tokens(req.params)}, headers={"x-skulk-token-count": "estimate"})

    # --- models ----------------------------------------------------------------------------------

    def model_entries() -> list[dict[str, Any]]:
        created = rfc3339(0)  # release dates are unknown: the epoch, as Anthropic's spec allows
        try:
            cards = catalog(node)
        except Exception:
            cards = {}
        ids: list[str] = []
        for inst in list(node.state.instances.values()):
            model_id = inst.shard_assignments.model_id
            if model_id not in ids:
                ids.append(model_id)
        ids += sorted(m for m in cards if m not in ids)
        entries = []
        for model_id in ids:
            card = cards.get(model_id)
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


async def _message_sse(dispatch: Dispatch, encoder: messages.MessageStreamEncoder, keepalive_s: float) -> Any:
    """The SSE body: message_start (and pings while the first chunk is awaited), then the events."""
    try:
        yield encoder.message_start()
        while not dispatch.task.done():
            done, _ = await asyncio.wait({dispatch.task}, timeout=keepalive_s)
            if not done:
                yield messages.PING
        try:
            handle = dispatch.handle()
        except InferenceError as exc:
            yield messages.error_event(messages.error_type_for(exc.status), exc.message)
            return
        except Exception as exc:
            log.exception("starting a message stream failed")
            yield messages.error_event("api_error", f"internal error: {type(exc).__name__}")
            return
        async for text in encoder.events(handle.chunks()):
            yield text
    finally:
        await dispatch.close()
