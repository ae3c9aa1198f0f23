"""The HTTP app: one FastAPI instance per node, uvicorn inside the node's loop.

Errors are JSON, never a stack trace: caller mistakes are 4xx with `x-should-retry: false`, and an
unexpected exception is logged here and answered as a 500 whose message names the request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from skulk_kernel.api import NodeSurface
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from .access_log import AccessLog
from .auth import install_auth

log = logging.getLogger("skulk.api")
MAX_BODY_BYTES = 32 * 1024 * 1024
NO_RETRY = {"x-should-retry": "false"}


def openai_error(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    headers = NO_RETRY if 400 <= status < 500 else {}
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}},
        status_code=status,
        headers=headers,
    )


class LimitBody:
    """A declared body over MAX_BODY_BYTES is a 413 before any route reads it.

    Plain ASGI on purpose: Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) relays every
    chunk of a streamed answer through a memory stream and a task of its own, a cost per token.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
            if length.isdigit() and int(length) > MAX_BODY_BYTES:
                answer = openai_error(
                    413, f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}", code="request_too_large"
                )
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(node: NodeSurface) -> FastAPI:
    app = FastAPI(title="Skulk", version=str(node.runtime_info()["skulkVersion"]), docs_url="/docs")
    app.state.node = node

    app.add_middleware(LimitBody)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return openai_error(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return openai_error(
            exc.status_code,
            str(exc.detail),
            error_type="not_found_error" if exc.status_code == 404 else "invalid_request_error",
        )

    @app.exception_handler(Exception)
    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s %s", request.method, request.url.path)
        return openai_error(
            500, f"internal error serving {request.url.path}: {type(exc).__name__}", error_type="server_error"
        )

    node.hooks.call("register_api_routes", app=app, node=node)
    app.add_middleware(AccessLog)  # one INFO line per inference request (inside the auth gate)
    install_auth(app, node)  # API keys, scopes, quotas and HTTP hardening: one ASGI gate, outermost
    return app


class ApiServer:
    def __init__(self, server: Any, task: asyncio.Task[Any]) -> None:
        self.server = server
        self.task = task

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 5)
        except (TimeoutError, asyncio.CancelledError):
            self.task.cancel()


async def serve(node: NodeSurface) -> ApiServer:
    import uvicorn

    app = build_app(node)
    config = uvicorn.Config(
        app,
        host=node.options.api_host,
        port=node.options.api_port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=2,
    )

    class NodeServer(uvicorn.Server):
        """The node owns SIGINT/SIGTERM and stops the server itself: uvicorn must not take them."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = NodeServer(config)

    async def run() -> None:
        try:
            await server.serve()
        except SystemExit:  # uvicorn exits the process on a bind error; a node must not
            raise OSError(
                f"cannot listen on {node.options.api_host}:{node.options.api_port} "
                "(address in use? another node may be running: pass --api-port)"
            ) from None

    task = node.spawn(run(), "http")
    for _ in range(400):
        if server.started or task.done():
            break
        await asyncio.sleep(0.025)
    if task.done() and task.exception() is not None:
        raise RuntimeError(f"HTTP API not started: {task.exception()}")
    node.facts["api_available"] = True
    node.facts["api_port"] = node.options.api_port
    log.info("serving HTTP on http://%s:%d", node.options.api_host, node.options.api_port)
    return ApiServer(server, task)
