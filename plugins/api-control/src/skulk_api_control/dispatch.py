"""The API side of a request: resolve the model, send the command, stream the chunks back.

Every API adapter (OpenAI, Anthropic, Ollama, ...) uses this one path, so none of them duplicates
dispatch, cancellation or failure handling. Adapters only translate wire formats.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skulk_kernel.api import (
    CancelTask,
    Chunk,
    CommandId,
    EmbeddingParams,
    ErrorChunk,
    FinishTask,
    NodeSurface,
    Request,
    TextEmbedding,
    TextGeneration,
    TextGenerationParams,
    catalog,
    instance_ready,
    is_terminal,
    new_id,
    resolve_card,
)

FIRST_CHUNK_TIMEOUT_S = 600.0
log = logging.getLogger("skulk.inference")


class InferenceError(Exception):
    """A request that cannot be served; `status` is the HTTP status an adapter should answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param


def serving_instances(node: NodeSurface, model_id: str) -> list[Any]:
    return [
        inst
        for inst in node.state.instances.values()
        if inst.shard_assignments.model_id == model_id and instance_ready(inst, node.state.runners)
    ]


def resolve_model_id(node: NodeSurface, ref: str, task: str = "TextGeneration") -> str:
    """The model id to run `ref` on, or an InferenceError that says how to fix the request."""
    card = resolve_card(node, ref)
    model_id = card.model_id if card else ref
    placed = [i for i in node.state.instances.values() if i.shard_assignments.model_id == model_id]
    if card is None and not placed:
        known = ", ".join(sorted(catalog(node))) or "none"
        raise InferenceError(
            404,
            f"model {ref!r} is not known to this cluster (known models: {known}); "
            'add a local model with POST /models/add {"path": ...}',
            code="model_not_found",
            param="model",
        )
    if card is not None and task not in card.tasks:
        raise InferenceError(
            400,
            f"model {model_id!r} does not support {task} (it supports {', '.join(card.tasks)})",
            code="unsupported_task",
            param="model",
        )
    if not placed:
        raise InferenceError(
            404,
            f"model {model_id!r} has no running instance; place one first with "
            f'POST /place_instance {{"model_id": "{model_id}"}} (or from the dashboard)',
            code="model_not_placed",
            param="model",
        )
    return model_id


@dataclass
class InferenceHandle:
    node: NodeSurface
    command_id: CommandId
    iterator: AsyncIterator[Chunk]
    first: Chunk
    command: Any = None
    observers: list[Any] = field(default_factory=list)
    finished: bool = False
    closed: bool = False

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every chunk, the already-awaited first one included; ends after the terminal one.

        Middleware observers see each chunk; a raising observer is logged and dropped for this
        request, never allowed to break the stream.
        """
        chunk = self.first
        while True:
            if is_terminal(chunk):
                self.finished = True
            for middleware in list(self.observers):
                try:
                    middleware.observe(self.command, chunk)
                except Exception:
                    log.exception("inference middleware %r raised in observe(); dropped for this request", middleware)
                    self.observers.remove(middleware)
            yield chunk
            if self.finished:
                return
            chunk = await self.iterator.__anext__()

    async def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            await self.node.submit(CancelTask(command_id=CommandId(new_id()), task_command_id=self.command_id))

    async def close(self) -> None:
        """Always called (idempotent): cancels an unfinished task (client gone), frees the stream."""
        if self.closed:
            return
        self.closed = True
        if not self.finished:
            await self.cancel()
        else:
            await self.node.submit(FinishTask(command_id=CommandId(new_id()), task_command_id=self.command_id))
        self.node.streams.close(self.command_id)


# Errors that arrive as the first chunk but belong before the response: code -> HTTP status.
_EARLY_ERRORS = {
    "context_length_exceeded": 400,
    "invalid_request": 400,
    "model_not_placed": 404,
    "instance_not_ready": 503,
    "instance_gone": 503,
    "master_changed": 503,
    "node_gone": 503,
    "runner_crashed": 503,
}


async def start(
    node: NodeSurface,
    command: Request,
    *,
    early_errors: Mapping[str, int] = _EARLY_ERRORS,
    while_waiting: Callable[[], Awaitable[None]] | None = None,
    observe: bool = True,
) -> InferenceHandle:
    """Open the stream, send `command`, and wait for its first chunk: the one start path of every request.

    `while_waiting` runs beside the wait for the first chunk (speech sends its upload then) and is
    cancelled once the first chunk is in. `early_errors` maps first-chunk error codes to the HTTP
    statuses that belong before a response starts.
    """
    stream = node.streams.open(command.command_id)
    iterator = stream.__aiter__()
    beside: asyncio.Task[None] | None = None
    try:
        await node.submit(command)
        if while_waiting is not None:
            beside = asyncio.ensure_future(while_waiting())
        first = await asyncio.wait_for(iterator.__anext__(), FIRST_CHUNK_TIMEOUT_S)
    except (TimeoutError, StopAsyncIteration):
        node.streams.close(command.command_id)
        await node.submit(CancelTask(command_id=CommandId(new_id()), task_command_id=command.command_id))
        raise InferenceError(504, "the model produced no output in time", error_type="timeout") from None
    except BaseException:
        node.streams.close(command.command_id)
        await node.submit(CancelTask(command_id=CommandId(new_id()), task_command_id=command.command_id))
        raise
    finally:
        if beside is not None and not beside.done():
            beside.cancel()
    observers = list(node.middleware) if observe else []
    handle = InferenceHandle(node, command.command_id, iterator, first, command=command, observers=observers)
    status = early_errors.get(first.code or "") if isinstance(first, ErrorChunk) else None
    if isinstance(first, ErrorChunk) and status is not None:
        handle.finished = True
        await handle.close()
        raise InferenceError(
            status,
            first.message,
            code=first.code,
            error_type="invalid_request_error" if status < 500 else "server_error",
        )
    return handle


async def generate(node: NodeSurface, params: TextGenerationParams, command_id: str | None = None) -> InferenceHandle:
    """Send a TextGeneration command and wait for its first chunk.

    Errors that belong before the response starts (unknown model, no instance, context overflow)
    raise InferenceError so the adapter can answer with a 4xx instead of a broken stream.
    """
    model_id = resolve_model_id(node, params.model_id)
    if model_id != params.model_id:
        params = params.model_copy(update={"model_id": model_id})
    command = TextGeneration(command_id=CommandId(command_id or new_id()), owner_node_id=node.node_id, params=params)
    return await start(node, _transform(node, command))


async def embed(node: NodeSurface, params: EmbeddingParams, command_id: str | None = None) -> InferenceHandle:
    model_id = resolve_model_id(node, params.model_id, task="TextEmbedding")
    if model_id != params.model_id:
        params = params.model_copy(update={"model_id": model_id})
    command = TextEmbedding(command_id=CommandId(command_id or new_id()), owner_node_id=node.node_id, params=params)
    return await start(node, _transform(node, command))


def _transform(node: NodeSurface, command: Any) -> Any:
    """Each middleware's transform in order; a raising one is logged and skipped."""
    for middleware in node.middleware:
        try:
            command = middleware.transform(command)
        except Exception:
            log.exception("inference middleware %r raised in transform(); skipped", middleware)
    return command
