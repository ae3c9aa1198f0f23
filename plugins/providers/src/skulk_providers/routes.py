"""GET /v1/capabilities, POST /v1/capabilities/call (unary), WebSocket /v1/capabilities/stream.

Every failure is a typed error `{"error": {"message", "type", "param", "code"}}` with the status
of its code (frames.ERRORS): 4xx for what the caller must fix (with `x-should-retry: false`), 5xx
for the provider's or the cluster's faults. The WebSocket speaks JSON messages:

    -> {"node_id", "capability": "id@version", "revision", "timeout_s"?, "input"?}   (opens the call)
    -> {"type": "input", "data": ...}    -> {"type": "end"} (half-close)    -> {"type": "cancel"}
    <- {"type": "started", ...}   <- {"type": "output", "seq", "data"}   <- {"type": "end"} | {"type": "error", ...}

Closing the socket cancels the call at the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from skulk_api_control.openapi_body import body_schema
from skulk_kernel.api import NodeSurface
from starlette.websockets import WebSocket, WebSocketDisconnect

from .api import IoMode
from .config import PROVIDERS
from .frames import CallError, End, Output, Started
from .service import ProviderService


class CallRequest(BaseModel):
    """The body of a call (and the WebSocket's first message)."""

    model_config = ConfigDict(extra="forbid")
    node_id: str = Field(min_length=1, description="the node to call (GET /v1/capabilities says who offers what)")
    capability: str = Field(pattern=r"^[a-z][a-z0-9_.-]*@\S+$", description="id@version")
    revision: str = Field(min_length=1, description="the descriptor revision read at discovery")
    input: Any = None
    timeout_s: float | None = Field(default=None, gt=0, description="the call's deadline (the node's default if unset)")


def error_body(code: str, message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: CallError, param: str | None = None) -> JSONResponse:
    headers = {"x-should-retry": "false"} if exc.status < 500 and exc.status != 429 else None
    return JSONResponse(error_body(exc.code, exc.message, exc.status, param), status_code=exc.status, headers=headers)


def _parse(raw: Any, service: ProviderService) -> tuple[CallRequest, IoMode, float]:
    try:
        req = CallRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise CallError(
            "invalid_request",
            f"{where}: {first['msg']} (body: {{node_id, capability: 'id@version', revision, input, timeout_s?}}}})",
        ) from None
    deadline = min(req.timeout_s or service.config.call_timeout_s, service.config.max_timeout_s)
    return req, IoMode.UNARY, deadline


def check_target(service: ProviderService, req: CallRequest) -> None:
    """Refuse at once a call no node would answer (rather than at its deadline)."""
    if req.node_id not in service.node.reachable_nodes():
        raise CallError("unknown_node", f"node {req.node_id} is not a reachable member (GET /v1/capabilities)")
    offered = service.advertised().get(req.node_id, ())
    if req.capability not in offered:
        raise CallError(
            "unknown_capability",
            f"node {req.node_id} advertises no {req.capability} "
            f"(it advertises: {', '.join(offered) or 'none'}; a capability is advertised while it is ready; "
            "GET /v1/capabilities)",
        )


async def _mode_of(service: ProviderService, req: CallRequest) -> IoMode:
    """The mode from this node's knowledge of the target's descriptors (asked on a miss)."""
    for descriptor in await service.describe(req.node_id):
        if descriptor.ref == req.capability:
            return descriptor.mode
    raise CallError("unknown_capability", f"node {req.node_id} offers no {req.capability} (GET /v1/capabilities)")


def add_routes(app: FastAPI, node: NodeSurface) -> None:
    def service() -> ProviderService:
        return node.services.require(PROVIDERS)

    @app.get("/v1/capabilities", tags=["capabilities"])
    async def capabilities(node_id: str | None = None) -> Any:
        """Capability descriptors: every node's that advertises some, or one node's (`?node_id=`)."""
        try:
            found, failed = await service().discover(node_id)
        except CallError as exc:
            return error_response(exc, "node_id")
        return {"object": "list", "data": found, "unreachable": failed}

    @app.get("/v1/extensions", tags=["capabilities"])
    async def extensions() -> Any:
        """This node's extensions: loaded, refused, failed (and why), as `extensions list` prints them."""
        svc = service()
        records = [r.model_dump(mode="json") for r in svc.records]
        return {"object": "list", "data": records, "active_calls": svc.server.active, "served_calls": svc.server.served}

    @app.post("/v1/capabilities/call", tags=["capabilities"], openapi_extra=body_schema(CallRequest))
    async def call(request: Request) -> Any:
        """A unary capability call on one node, pinned to the revision read at discovery."""
        svc = service()
        started = time.perf_counter()
        raw = await request.body()
        if len(raw) > svc.config.max_payload_bytes + 1024:
            return error_response(
                CallError(
                    "payload_too_large",
                    f"a body of {len(raw)} bytes is over the cap of {svc.config.max_payload_bytes} bytes",
                )
            )
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return error_response(CallError("invalid_request", "the body is not JSON"))
        try:
            req, mode, deadline = _parse(body, svc)
            check_target(svc, req)
            handle = await svc.caller.open(
                req.node_id, req.capability, req.revision, mode, deadline, data=req.input, has_input=True
            )
            watcher = asyncio.ensure_future(_disconnected(request))
            try:
                result = asyncio.ensure_future(handle.result())
                done, _ = await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if result not in done:
                    result.cancel()
                    await handle.cancel("the HTTP client went away")
                    return JSONResponse({}, status_code=499)
                output = result.result()
            finally:
                watcher.cancel()
        except CallError as exc:
            return error_response(exc)
        elapsed = (time.perf_counter() - started) * 1000
        return {
            "object": "capability.result",
            "node_id": req.node_id,
            "capability": req.capability,
            "revision": req.revision,
            "call_id": handle.call_id,
            "output": output,
            "elapsed_ms": round(elapsed, 3),
        }

    @app.websocket("/v1/capabilities/stream")
    async def stream(ws: WebSocket) -> None:
        """A streaming call; api-control's gate has checked the handshake (an operator key from
        another host, as for `/v1/capabilities/call`)."""
        await ws.accept()
        await StreamSession(ws, service()).run()


async def _disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.5)


class StreamSession:
    """One WebSocket: one streaming call. Reading the socket and forwarding outputs run side by side."""

    def __init__(self, ws: WebSocket, service: ProviderService) -> None:
        self.ws = ws
        self.service = service

    async def error(self, exc: CallError) -> None:
        with contextlib.suppress(Exception):
            await self.ws.send_json({"type": "error", "code": exc.code, "status": exc.status, "message": exc.message})
            await self.ws.close(1000)

    async def run(self) -> None:
        svc = self.service
        try:
            first = await asyncio.wait_for(self.ws.receive_text(), 30)
            if len(first) > svc.config.max_payload_bytes + 1024:
                raise CallError("payload_too_large", f"a message of {len(first)} bytes is over the cap")
            try:
                body = json.loads(first)
            except ValueError:
                raise CallError("invalid_request", "the first message is not JSON") from None
            req, _, deadline = _parse(body, svc)
            check_target(svc, req)
            mode = await _mode_of(svc, req)
            if mode == IoMode.UNARY:
                raise CallError("wrong_mode", f"{req.capability} is unary: POST /v1/capabilities/call")
            opens_with_input = not mode.streams_input
            handle = await svc.caller.open(
                req.node_id, req.capability, req.revision, mode, deadline, data=req.input, has_input=opens_with_input
            )
        except (WebSocketDisconnect, TimeoutError):
            return
        except CallError as exc:
            await self.error(exc)
            return
        reader = asyncio.ensure_future(self._read(handle))
        try:
            async for frame in handle.frames():
                if isinstance(frame, Started):
                    await self.ws.send_json(
                        {
                            "type": "started",
                            "call_id": handle.call_id,
                            "node_id": handle.node_id,
                            "capability": req.capability,
                            "revision": frame.revision,
                        }
                    )
                elif isinstance(frame, Output):
                    await self.ws.send_json({"type": "output", "seq": frame.seq, "data": frame.data})
                elif isinstance(frame, End):
                    if frame.ok:
                        await self.ws.send_json({"type": "end", "ok": True})
                        with contextlib.suppress(Exception):
                            await self.ws.close(1000)
                    else:
                        await self.error(CallError(frame.code, frame.message))
        except (WebSocketDisconnect, RuntimeError):
            await handle.cancel("the WebSocket closed")
        finally:
            reader.cancel()
            await handle.cancel("the WebSocket closed")  # nothing when it ended

    async def _read(self, handle: Any) -> None:
        """Caller -> provider: inputs, the half-close, cancel; a closed socket cancels the call."""
        try:
            while True:
                text = await self.ws.receive_text()
                if len(text) > self.service.config.max_payload_bytes + 1024:
                    await handle.cancel("an input over the payload cap")
                    await self.error(CallError("payload_too_large", f"a message of {len(text)} bytes is over the cap"))
                    return
                try:
                    msg = json.loads(text)
                    kind = msg.get("type") if isinstance(msg, dict) else None
                except ValueError:
                    kind = None
                if kind == "input":
                    await handle.send_input(msg.get("data"))
                elif kind == "end":
                    await handle.half_close()
                elif kind == "cancel":
                    await handle.cancel(str(msg.get("reason") or "cancelled by the caller"))
                    await self.error(CallError("cancelled", "cancelled by the caller"))
                    return
                else:
                    await handle.cancel("a malformed message")
                    await self.error(
                        CallError(
                            "invalid_request",
                            'messages are {"type": "input", "data": ...}, {"type": "end"} or {"type": "cancel"}',
                        )
                    )
                    return
        except CallError as exc:
            await handle.cancel(exc.message)
            await self.error(exc)
        except (WebSocketDisconnect, RuntimeError):
            await handle.cancel("the WebSocket closed")
