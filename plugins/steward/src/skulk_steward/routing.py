"""How a `skulk/steward` chat request reaches the harness: the API host's served-model seam.

`skulk_api_control.dispatch.serve_model` lets a plugin answer one model id itself on every chat API
of the node. The steward's server feeds the request's stream from the harness; while the steward is
not ready its first chunk is an `instance_not_ready` error, which every adapter answers as a 503
with the reason in its own error shape (a 404 would say "no such model").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from skulk_kernel.api import ErrorChunk, NodeSurface, TextGeneration

from .config import MODEL_REF, STEWARD

FIRST_USE_WAIT_S = 540.0  # under the API's 600 s wait for a first chunk


def is_steward_ref(ref: str) -> bool:
    return ref.strip().lower() == MODEL_REF


async def wait_ready(service: Any, wait_s: float = FIRST_USE_WAIT_S) -> None:
    """Until the steward is ready, it fits nowhere, or `wait_s` passed (the API keeps the client's
    connection alive meanwhile: keep-alives on a stream, a plain wait otherwise)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        ready, reason = service.readiness()
        if ready or "no node can hold" in reason:
            return
        await asyncio.sleep(0.5)


def serve_steward(node: NodeSurface) -> None:
    """Register `skulk/steward` with the API host of this node (when it has one)."""
    try:
        from skulk_api_control.dispatch import serve_model
    except ImportError:  # a node without the API host serves no chat requests
        return

    async def server(command: TextGeneration) -> None:
        service = node.services.get(STEWARD)
        if service is not None and service.config.place == "on_first_use":
            service.want()  # this request is the first use: it waits for the steward (placed, loaded)
            await wait_ready(service)
        ready, reason = service.readiness() if service is not None else (False, "the steward plugin is stopping")
        inst = service.instance() if service is not None and ready else None
        if service is None or inst is None:
            message = f"the steward is not ready: {reason}"
            error = ErrorChunk(command_id=command.command_id, seq=0, message=message, code="instance_not_ready")
            await node.send_chunk(node.node_id, error)
            return
        from .harness import run_turn

        # the answer keeps `skulk/steward` as its model; the harness calls the instance's own model
        await run_turn(node, command, inst.instance_id, service.config)

    serve_model(node, MODEL_REF, server)
