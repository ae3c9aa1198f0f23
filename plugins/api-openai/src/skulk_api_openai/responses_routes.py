"""`POST /v1/responses` (and the un-prefixed `/responses`): the OpenAI Responses API.

Same dispatch as Chat Completions (`routes.py`): the body is parsed by `responses_requests.py`, the
request goes through `skulk_kernel.inference.generate`, the host's `skulk_api_control.streaming`
waits for the first chunk (keep-alives after `keepalive_s` for streams), watches for the client
leaving (which cancels the task) and closes the handle exactly once; `responses.py` writes the wire
format.

Errors known before the first byte are HTTP statuses in OpenAI's error shape (4xx with
`x-should-retry: false`). A stream that had to wait sends `: keep-alive` comments, then
`: command_id <id>` and the events; an error that comes that late is `response.created`,
`response.in_progress`, `error` and `response.failed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from skulk_api_control.streaming import ClientGone, Dispatch, InferenceStreamResponse
from skulk_kernel.ids import new_id
from skulk_kernel.inference import InferenceError, generate
from skulk_kernel.tasks import ErrorChunk

from .requests import RequestError, parse_json_object
from .responses import KEEPALIVE, ResponsesEncoder
from .responses_requests import parse_responses_request
from .routes import (
    CLIENT_CLOSED,
    SSE_HEADERS,
    chunk_error,
    inference_error,
    read_request_body,
    request_error,
)

log = logging.getLogger("skulk.api.openai")


def add_responses_routes(
    app: FastAPI, node: Any, *, keepalive_s: float, canonical: Callable[[str], str]
) -> None:
    async def create_response(request: Request) -> Response:
        try:
            req = parse_responses_request(parse_json_object(await read_request_body(request)))
        except RequestError as exc:
            return request_error(exc)
        model = canonical(req.model)
        created = int(time.time())
        command_id = new_id()

        def encoder(cid: str, emit: bool = True) -> ResponsesEncoder:
            return ResponsesEncoder(req, command_id=cid, created_at=created, model=model, emit=emit)

        dispatch = Dispatch(generate(node, req.params, command_id=command_id))
        handing_over = False
        try:
            ready = await dispatch.wait(request, keepalive_s if req.stream else None)
            if ready:
                handle = dispatch.handle()  # raises InferenceError: an HTTP status
                if isinstance(handle.first, ErrorChunk):
                    handle.finished = True  # terminal: close() reports it finished, nothing to cancel
                    return chunk_error(handle.first)
            if req.stream:
                handing_over = True
                return InferenceStreamResponse(
                    _responses_sse(dispatch, encoder, command_id, keepalive_s),
                    dispatch.close,
                    media_type="text/event-stream",
                    headers=SSE_HEADERS,
                )
            enc = encoder(handle.command_id, emit=False)
            error = await dispatch.run(request, enc.collect(handle.chunks()))
            if error is not None:
                return chunk_error(error)
            return JSONResponse(enc.response())
        except InferenceError as exc:
            return inference_error(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            if not handing_over:
                await dispatch.close()

    @app.post("/v1/responses", tags=["openai"])
    @app.post("/responses", include_in_schema=False)
    async def post_responses(request: Request) -> Response:
        """OpenAI Responses API (a `response` object, or SSE `response.*` events with `stream: true`)."""
        return await create_response(request)


async def _responses_sse(
    dispatch: Dispatch,
    encoder: Callable[[str], ResponsesEncoder],
    command_id: str,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The SSE body: keep-alives while the first chunk is awaited, then the `response.*` events."""
    try:
        if not dispatch.task.done():
            yield KEEPALIVE
            while not dispatch.task.done():
                done, _ = await asyncio.wait({dispatch.task}, timeout=keepalive_s)
                if not done:
                    yield KEEPALIVE
        try:
            handle = dispatch.handle()
        except InferenceError as exc:
            enc = encoder(command_id)
            yield enc.start() + enc.fail(exc.message, exc.error_type, exc.code)
            return
        except Exception as exc:
            log.exception("starting a responses stream failed")
            enc = encoder(command_id)
            yield enc.start() + enc.fail(f"internal error: {type(exc).__name__}")
            return
        enc = encoder(handle.command_id)
        yield f": command_id {handle.command_id}\n\n" + enc.start()
        async for text in enc.events(handle.chunks()):
            yield text
    finally:
        await dispatch.close()
