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
    InstanceId,
    NodeSurface,
    Request,
    ServiceKey,
    TextEmbedding,
    TextGeneration,
    TextGenerationParams,
    catalog,
    instance_ready,
    is_terminal,
    new_id,
    resolve_card,
)

from .access_log import note_chunk, note_model
from .continuation import RESUMABLE_CODES, Resumer
from .ended_requests import ended_requests
from .middleware import middleware_of
from .routing import router_for

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
    resumer: Resumer | None = None  # text generation: continues the stream elsewhere if its node dies
    live_id: CommandId | None = None  # the command now streaming (differs from command_id once resumed)

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every chunk, the already-awaited first one included; ends after the terminal one.

        Middleware observers see each chunk; a raising observer is logged and dropped for this
        request, never allowed to break the stream.
        """
        chunk = self.first
        while True:
            if self.resumer is not None:
                chunk = self.resumer.track(await self.continued(chunk))
            if is_terminal(chunk):
                self.finished = True
                note_chunk(chunk)  # the request's log line: its tokens or error code
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

    async def continued(self, chunk: Chunk) -> Chunk:
        """`chunk`, or, when it says the serving instance is gone, the first chunk of a resume."""
        assert self.resumer is not None
        if isinstance(chunk, ErrorChunk) and chunk.code in RESUMABLE_CODES:
            failed = self.live_id or self.command_id
            opened = await self.resumer.resume(chunk)
            if opened is not None:
                await self.resumer.abandon(failed)
                self.live_id, self.iterator, chunk = opened.command_id, opened.iterator, opened.first
        return chunk

    async def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            live = self.live_id or self.command_id
            await self.node.post(CancelTask(command_id=CommandId(new_id()), task_command_id=live))

    async def close(self) -> None:
        """Always called (idempotent): cancels an unfinished task (client gone), frees the stream."""
        if self.closed:
            return
        self.closed = True
        live = self.live_id or self.command_id
        if not self.finished:
            await self.cancel()
        else:
            await self.node.post(FinishTask(command_id=CommandId(new_id()), task_command_id=live))
        self.node.streams.close(live)
        ended_requests(self.node).add(self.command_id, live)
        if self.resumer is not None:
            self.resumer.release()


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
_EARLY_NOT_RESUMABLE = {code: status for code, status in _EARLY_ERRORS.items() if code not in RESUMABLE_CODES}
DEFAULT_MAX_RESUMES = 2


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
        await node.post(command)
        if while_waiting is not None:
            beside = asyncio.ensure_future(while_waiting())
        async with asyncio.timeout(FIRST_CHUNK_TIMEOUT_S):  # not wait_for: 3.11's can drop a cancel
            first = await iterator.__anext__()
    except (TimeoutError, StopAsyncIteration):
        node.streams.close(command.command_id)
        await node.post(CancelTask(command_id=CommandId(new_id()), task_command_id=command.command_id))
        raise InferenceError(504, "the model produced no output in time", error_type="timeout") from None
    except BaseException:
        node.streams.close(command.command_id)
        await node.post(CancelTask(command_id=CommandId(new_id()), task_command_id=command.command_id))
        raise
    finally:
        if beside is not None and not beside.done():
            beside.cancel()
    observers = list(middleware_of(node)) if observe else []
    handle = InferenceHandle(node, command.command_id, iterator, first, command=command, observers=observers)
    await _raise_early(handle, early_errors)
    return handle


async def _raise_early(handle: InferenceHandle, early_errors: Mapping[str, int]) -> None:
    """A first chunk that is an error belonging before the response: close, and raise its status."""
    first = handle.first
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


ModelServer = Callable[[TextGeneration], Awaitable[None]]
"""A plugin that answers a model id itself: it feeds the command's stream (`node.send_chunk` to this
node) with the same chunks an instance would, ending with a terminal chunk; an ErrorChunk first
(e.g. code `instance_not_ready`) becomes the adapter's early HTTP error."""
SERVED_MODELS: ServiceKey[dict[str, ModelServer]] = ServiceKey("api-control.served-models")  # by lowercased ref


def serve_model(node: NodeSurface, model_ref: str, server: ModelServer) -> None:
    """Answer `model_ref` on every chat API of this node with `server` (the steward's `skulk/steward`)
    instead of a placed instance; the adapters, streaming and errors stay the API host's."""
    served = node.services.get(SERVED_MODELS)
    if served is None:
        served = node.services.publish(SERVED_MODELS, {})
    served[model_ref.strip().lower()] = server


def _served(node: NodeSurface, model_ref: str) -> ModelServer | None:
    served = node.services.get(SERVED_MODELS) or {}
    found = served.get(model_ref.strip().lower())
    return found if callable(found) else None


async def _serve_here(node: NodeSurface, command: TextGeneration, server: ModelServer) -> InferenceHandle:
    """A served model's request: the same stream, first-chunk wait and early errors as an instance's."""
    stream = node.streams.open(command.command_id)
    iterator = stream.__aiter__()
    feeding = asyncio.ensure_future(server(command))
    try:
        async with asyncio.timeout(FIRST_CHUNK_TIMEOUT_S):
            first = await iterator.__anext__()
    except (TimeoutError, StopAsyncIteration):
        feeding.cancel()
        node.streams.close(command.command_id)
        raise InferenceError(504, "the model produced no output in time", error_type="timeout") from None
    except BaseException:
        feeding.cancel()
        node.streams.close(command.command_id)
        raise
    handle = InferenceHandle(node, command.command_id, iterator, first, command=command, observers=[])
    await _raise_early(handle, _EARLY_ERRORS)
    return handle


async def generate(node: NodeSurface, params: TextGenerationParams, command_id: str | None = None) -> InferenceHandle:
    """Send a TextGeneration command and wait for its first chunk.

    Errors that belong before the response starts (unknown model, no instance, context overflow)
    raise InferenceError so the adapter can answer with a 4xx instead of a broken stream.
    """
    note_model(params.model_id)
    if (server := _served(node, params.model_id)) is not None:
        if any(m.images for m in params.messages):
            raise InferenceError(400, f"model {params.model_id} does not accept images", code="model_not_vision")
        command = TextGeneration(
            command_id=CommandId(command_id or new_id()), owner_node_id=node.node_id, params=params
        )
        return await _serve_here(node, command, server)
    from .on_demand import model_for, replaced_meanwhile  # (it imports this module)
    from .vision import prepare  # images: checked and normalised once, sent on the data plane

    model_id = await model_for(node, params.model_id, "TextGeneration")  # placed first when on demand
    if model_id != params.model_id:
        params = params.model_copy(update={"model_id": model_id})
    params, images = await prepare(node, params)
    try:
        return await _generate(node, params, command_id, images)
    except InferenceError as exc:
        if not replaced_meanwhile(node, exc):
            raise
        await model_for(node, model_id, "TextGeneration")  # removed (keep_alive) between the two: again
        return await _generate(node, params, command_id, images)
    finally:
        if images is not None:
            images.release()  # sent by now (the runner waits for them before its first chunk)


async def _generate(
    node: NodeSurface, params: TextGenerationParams, command_id: str | None, images: Any = None
) -> InferenceHandle:
    model_id = params.model_id
    router = router_for(node)
    pinned = router.choose(node, model_id, params.messages)
    config = node.plugin_config("api-control")
    max_resumes = getattr(config, "max_resumes", DEFAULT_MAX_RESUMES)
    if max_resumes > 0 and not params.token_ids and len(router.candidates(node, model_id)) > 1:
        params = params.model_copy(update={"token_ids": True})  # somewhere to resume: make it exact
    command = TextGeneration(
        command_id=CommandId(command_id or new_id()),
        owner_node_id=node.node_id,
        params=params,
        instance_id=InstanceId(pinned) if pinned else None,
    )
    command = _transform(node, command)
    router.started(command.command_id, pinned, params.messages)
    resumer = Resumer(
        node,
        router,
        command.params,
        pinned,
        lambda again: start(
            node, again, early_errors={}, observe=False, while_waiting=images and images.sender(again.command_id)
        ),
        max_resumes,
    )
    try:
        beside = images.sender(command.command_id) if images is not None else None
        handle = await start(node, command, early_errors=_EARLY_NOT_RESUMABLE, while_waiting=beside)
    except BaseException:
        router.finished(command.command_id)
        raise
    handle.resumer = resumer
    if isinstance(handle.first, ErrorChunk) and handle.first.code in RESUMABLE_CODES:
        handle.first = await handle.continued(handle.first)  # gone before its first token: try another
        await _raise_early(handle, _EARLY_ERRORS)
    return handle


async def embed(node: NodeSurface, params: EmbeddingParams, command_id: str | None = None) -> InferenceHandle:
    from .on_demand import model_for, replaced_meanwhile  # (it imports this module)

    model_id = await model_for(node, params.model_id, "TextEmbedding")  # placed first when on demand
    if model_id != params.model_id:
        params = params.model_copy(update={"model_id": model_id})
    for again in (False, True):
        command = TextEmbedding(command_id=CommandId(command_id or new_id()), owner_node_id=node.node_id, params=params)
        try:
            return await start(node, _transform(node, command))
        except InferenceError as exc:
            if again or not replaced_meanwhile(node, exc):
                raise
            await model_for(node, model_id, "TextEmbedding")
    raise AssertionError("unreachable")


def _transform(node: NodeSurface, command: Any) -> Any:
    """Each middleware's transform in order; a raising one is logged and skipped."""
    for middleware in middleware_of(node):
        try:
            command = middleware.transform(command)
        except Exception:
            log.exception("inference middleware %r raised in transform(); skipped", middleware)
    return command
