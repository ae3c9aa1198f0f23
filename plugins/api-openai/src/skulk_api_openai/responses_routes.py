"""`POST /v1/responses` (and the un-prefixed `/responses`): the OpenAI Responses API.

Same dispatch as Chat Completions (`routes.py`): the body is parsed by `responses_requests.py`, the
request goes through `skulk_api_control.dispatch.generate`, the host's `skulk_api_control.adapter_routes`
waits for the first chunk (keep-alives after `keepalive_s` for streams), watches for the client
leaving (which cancels the task) and closes the handle exactly once; `responses.py` writes the wire
format.

Errors known before the first byte are HTTP statuses in OpenAI's error shape (4xx with
`x-should-retry: false`). A stream that had to wait sends `: keep-alive` comments, then
`: command_id <id>` and the events; an error that comes that late is `response.created`,
`response.in_progress`, `error` and `response.failed`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from skulk_api_control.adapter_routes import answer, read_json, stream_body
from skulk_api_control.dispatch import InferenceError, InferenceHandle, generate
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.streaming import Dispatch
from skulk_kernel.api import NodeSurface, new_id

from .chat import KEEPALIVE
from .requests import RequestError
from .responses import ResponsesEncoder
from .responses_requests import ResponsesRequestIn, parse_responses_request
from .routes import ERRORS, chunk_error, request_error


def add_responses_routes(
    app: FastAPI, node: NodeSurface, *, keepalive_s: float, canonical: Callable[[str], str]
) -> None:
    async def create_response(request: Request) -> Response:
        try:
            req = parse_responses_request(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        model = canonical(req.model)
        created = int(time.time())
        command_id = new_id()

        def encoder(cid: str, emit: bool = True) -> ResponsesEncoder:
            return ResponsesEncoder(req, command_id=cid, created_at=created, model=model, emit=emit)

        async def complete(handle: InferenceHandle) -> Response:
            enc = encoder(handle.command_id, emit=False)
            error = await enc.collect(handle.chunks())
            if error is not None:
                return chunk_error(error)
            return JSONResponse(enc.response())

        def stream(dispatch: Dispatch) -> AsyncIterator[str]:
            return _responses_sse(dispatch, encoder, command_id, keepalive_s)

        call = generate(node, req.params, command_id=command_id)
        return await answer(
            request, call, ERRORS, complete, stream=stream if req.stream else None, keepalive_s=keepalive_s
        )

    @app.post("/v1/responses", tags=["openai"], openapi_extra=body_schema(ResponsesRequestIn))
    @app.post("/responses", include_in_schema=False)
    async def post_responses(request: Request) -> Response:
        """OpenAI Responses API (a `response` object, or SSE `response.*` events with `stream: true`)."""
        return await create_response(request)


def _responses_sse(
    dispatch: Dispatch,
    encoder: Callable[[str], ResponsesEncoder],
    command_id: str,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """The SSE body: keep-alives while the first chunk is awaited, then the `response.*` events."""

    async def events(handle: InferenceHandle) -> AsyncIterator[str]:
        enc = encoder(handle.command_id)
        yield f": command_id {handle.command_id}\n\n" + enc.start()
        async for text in enc.events(handle.chunks()):
            yield text

    def failed(exc: InferenceError) -> str:
        enc = encoder(command_id)
        return enc.start() + enc.fail(exc.message, exc.error_type, exc.code)

    return stream_body(dispatch, events, failed, keepalive=KEEPALIVE, keepalive_s=keepalive_s)
