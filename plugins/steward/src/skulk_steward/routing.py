"""How a `skulk/steward` chat request reaches the harness: the API host's served-model seam.

`skulk_api_control.dispatch.serve_model` lets a plugin answer one model id itself on every chat API
of the node. The steward's server feeds the request's stream from the harness; while the steward is
not ready its first chunk is an `instance_not_ready` error, which every adapter answers as a 503
with the reason in its own error shape (a 404 would say "no such model").
"""

from __future__ import annotations

from skulk_kernel.api import ErrorChunk, NodeSurface, TextGeneration

from .config import MODEL_REF, STEWARD


def is_steward_ref(ref: str) -> bool:
    return ref.strip().lower() == MODEL_REF


def serve_steward(node: NodeSurface) -> None:
    """Register `skulk/steward` with the API host of this node (when it has one)."""
    try:
        from skulk_api_control.dispatch import serve_model
    except ImportError:  # a node without the API host serves no chat requests
        return

    async def server(command: TextGeneration) -> None:
        service = node.services.get(STEWARD)
        if service is not None:
            service.want()  # place = on_first_use: this request is the first use
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
