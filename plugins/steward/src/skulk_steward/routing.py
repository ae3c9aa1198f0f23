"""How a `skulk/steward` chat request reaches the harness without a seam of its own in dispatch.

The chat APIs send every request through `skulk_api_control.dispatch.generate`, which resolves the
model (hook `resolve_model`), requires a placed instance of it, runs every InferenceMiddleware's
`transform` and then waits for the first chunk on the request's stream. The steward uses those
three steps:

1. `StewardGate`, an ASGI middleware on the chat routes, sees `"model": "skulk/steward"` in the
   body and marks the request in a context variable with the steward instance; the mark lives in
   the request's own asyncio task and the tasks it starts, so no other request can see it. Then
   `resolve_model("skulk/steward")` answers the steward instance's card (the hook has no node:
   the mark carries what it needs).
2. `StewardMiddleware.transform` finds the mark on a TextGeneration for the steward's model, starts
   the harness for that command id and returns the command made inert: its model is `skulk/steward`
   (no instance serves that id, so the master creates no task) and its owner is no node (so the
   master's refusal reaches nobody). The stream dispatch opened is fed by the harness alone.
   (dispatch has no seam for a model served by a plugin; see docs/steward.md.)
3. A request that arrives while the steward is not ready never reaches dispatch: the gate answers
   503 with the reason in the route's own error shape (404 would say "no such model").
"""

from __future__ import annotations

import contextvars
import json
import logging
from typing import Any

from skulk_kernel.api import Chunk, Command, ModelCard, ModelId, NodeId, NodeSurface, TextGeneration

from .config import MODEL_REF, PLUGIN

log = logging.getLogger("skulk.steward")
#: (instance id, model id) of the steward, set by the gate for one `skulk/steward` request
_TURN: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("skulk_steward_turn", default=None)

INERT_OWNER = "skulk-steward-harness"  # no node has this id
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/messages", "/v1/responses", "/responses", "/api/chat")


def is_steward_ref(ref: str) -> bool:
    return ref.strip().lower() == MODEL_REF


def resolve(ref: str, cards: dict[str, ModelCard]) -> ModelCard | None:
    """The steward instance's card for `skulk/steward`, inside a request the gate marked."""
    mark = _TURN.get()
    if mark is None or not is_steward_ref(ref):
        return None
    return cards.get(mark[1])


class StewardMiddleware:
    """Takes a marked `skulk/steward` TextGeneration over (see the module docstring)."""

    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    def transform(self, command: Command) -> Command:
        mark = _TURN.get()
        if mark is None or not isinstance(command, TextGeneration):
            return command
        _TURN.set(None)
        instance_id = mark[0]
        inst = self.node.state.instances.get(instance_id)  # type: ignore[call-overload]
        if inst is None or inst.shard_assignments.model_id != command.params.model_id:
            return command
        from .harness import run_turn

        service = self.node.extensions[PLUGIN]
        self.node.spawn(
            _unmarked(run_turn(self.node, command, instance_id, service.config)), f"steward-{command.command_id[:8]}"
        )
        # Inert for the master: no instance serves MODEL_REF, and its refusal goes to an owner that
        # is no node, so the request's stream is fed by the harness alone.
        params = command.params.model_copy(update={"model_id": ModelId(MODEL_REF)})
        return command.model_copy(update={"owner_node_id": NodeId(INERT_OWNER), "params": params, "instance_id": None})

    def observe(self, command: Command, chunk: Chunk) -> None:
        return None


async def _unmarked(turn: Any) -> None:
    _TURN.set(None)  # the harness's own model calls are ordinary requests
    await turn


class StewardGate:
    """ASGI middleware: a `skulk/steward` chat request while the steward is not ready gets a 503."""

    def __init__(self, app: Any, node: NodeSurface) -> None:
        self.app, self.node = app, node

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not scope.get("path", "").startswith(CHAT_PATHS):
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body") or len(body) > 16 * 1024 * 1024:
                break
        replay = iter(messages)

        async def replayed() -> Any:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        service = self.node.extensions.get(PLUGIN)
        if service is not None and b"steward" in body and _wants_steward(body):
            ready, reason = service.readiness()
            if not ready:
                await _unavailable(scope["path"], reason, send)
                return
            inst = service.instance()
            _TURN.set((inst.instance_id, inst.shard_assignments.model_id))  # seen by resolve and transform only
        await self.app(scope, replayed, send)


def _wants_steward(body: bytes) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("model"), str) and is_steward_ref(parsed["model"])


async def _unavailable(path: str, reason: str, send: Any) -> None:
    message = f"the steward is not ready: {reason}"
    if path.startswith("/v1/messages"):
        body: dict[str, Any] = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    elif path.startswith("/api/"):
        body = {"error": message}
    else:
        body = {"error": {"message": message, "type": "server_error", "param": "model", "code": "steward_not_ready"}}
    raw = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
        (b"retry-after", b"10"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": raw})
