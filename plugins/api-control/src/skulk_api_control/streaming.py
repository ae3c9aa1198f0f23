"""One inference call seen from one HTTP request: the body, the wait for the first chunk, disconnects,
closing. Shared by every API adapter that registers routes on this host (api-openai, api-anthropic,
api-ollama); it knows no adapter's wire format or error shape.

* `read_body` reads the body under the host's size limit (`server.MAX_BODY_BYTES` unless told
  otherwise); chunked uploads carry no content-length for the host's `limit_body` middleware to
  check. Over the limit it raises `BodyTooLarge`, which each adapter answers as a 413 in its own
  error shape.
* `Dispatch` runs `generate()` / `embed()` as a task, so a route can wait for the first chunk while
  watching for the client leaving (and, for a stream, stop waiting after `keepalive_s` to start
  sending keep-alives / pings). `close()` always ends in `handle.close()` (or cancels the call still
  starting), exactly once, shielded from the cancellation a disconnect causes.
* `InferenceStreamResponse` is a StreamingResponse that runs a close callback however it ends
  (Starlette cancels the streaming task when the client goes; a generator suspended at a `yield`
  would otherwise only be finalized by the garbage collector).
* `spawn` keeps a background task referenced until it ends; `ClientGone` is raised when the client
  disconnects before the answer was ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .dispatch import InferenceHandle
from .server import MAX_BODY_BYTES

__all__ = [
    "BodyTooLarge",
    "ClientGone",
    "Dispatch",
    "InferenceStreamResponse",
    "read_body",
    "spawn",
    "wait_disconnect",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
_background: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task kept referenced until it ends (it survives its creator being cancelled)."""
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class BodyTooLarge(Exception):
    """The request body went over `limit` bytes (`size`: the bytes read when reading stopped).

    Generic on purpose: each adapter answers it as a 413 in its own error shape.
    """

    def __init__(self, limit: int, size: int) -> None:
        super().__init__(f"the request body is over the limit of {limit} bytes")
        self.limit = limit
        self.size = size


async def read_body(request: Request, limit: int | None = None) -> bytes:
    """The whole body; raises BodyTooLarge as soon as more than `limit` (default: the host's) arrived."""
    if limit is None:
        limit = MAX_BODY_BYTES
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BodyTooLarge(limit, size)
        parts.append(part)
    return b"".join(parts)


async def wait_disconnect(request: Request) -> None:
    """Returns when the client has gone (call only after the body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class Dispatch:
    """`generate(...)` / `embed(...)` running for one request."""

    def __init__(self, call: Coroutine[Any, Any, InferenceHandle]) -> None:
        self.task: asyncio.Task[InferenceHandle] = asyncio.ensure_future(call)
        self._closed = False

    async def wait(self, request: Request, timeout: float | None = None) -> bool:
        """True once the handle (or generate's InferenceError) is there; False after `timeout`.

        Raises ClientGone, after cancelling the call, if the client disconnects first.
        """
        watcher = asyncio.ensure_future(wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({self.task, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if self.task in done:
            return True
        if watcher in done:
            await self.close()
            raise ClientGone
        return False

    def handle(self) -> InferenceHandle:
        """The handle once `wait` said so; re-raises what generate()/embed() raised."""
        return self.task.result()

    async def run(self, request: Request, work: Awaitable[T]) -> T:
        """Await `work` (reading the chunks) unless the client leaves first (then ClientGone)."""
        job = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            job.cancel()
            raise
        finally:
            watcher.cancel()
        if job in done:
            return job.result()
        job.cancel()
        await self.close()
        raise ClientGone

    async def close(self) -> None:
        """Cancel the call if it is still starting, else close its handle; once, and shielded."""
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(spawn(self._close()))

    async def _close(self) -> None:
        if not self.task.done():
            self.task.cancel()  # generate()/embed() cancel the task they submitted on the way out
        try:
            handle = await self.task
        except BaseException:
            return
        try:
            await handle.close()
        except Exception:
            log.exception("closing the stream of command %s failed", handle.command_id)


class InferenceStreamResponse(StreamingResponse):
    """A streaming response whose `on_close` runs however the response ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_close()
