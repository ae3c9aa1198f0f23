"""Per-command chunk streams on the API node: opened before the command is sent, fed from the data
plane by command id, reordered by sequence number, and ended with a typed error after an idle
timeout when the terminal chunk never comes, so no request ever hangs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from .tasks import Chunk, ErrorChunk, is_terminal


class ChunkStream:
    def __init__(self, command_id: str, idle_timeout: float) -> None:
        self.command_id = command_id
        self.idle_timeout = idle_timeout
        self._queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self._pending: dict[int, Chunk] = {}
        self._next_seq = 0
        self.closed = False

    def put(self, chunk: Chunk) -> None:
        """Accept a chunk in any order; release them to the reader in sequence order."""
        if self.closed:
            return
        if isinstance(chunk, ErrorChunk) and chunk.seq < self._next_seq:
            self._queue.put_nowait(chunk)  # out-of-band failure (task failed, node died)
            return
        self._pending[chunk.seq] = chunk
        while self._next_seq in self._pending:
            self._queue.put_nowait(self._pending.pop(self._next_seq))
            self._next_seq += 1

    def fail(self, message: str, error_type: str = "server_error", code: str | None = None) -> None:
        """End the stream with an error whatever arrived before (bypasses ordering)."""
        if not self.closed:
            self._queue.put_nowait(
                ErrorChunk(command_id=self.command_id, seq=0, message=message, error_type=error_type, code=code)
            )

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        while not self.closed:
            try:  # a queued chunk needs no timer; asyncio.timeout, unlike 3.11's wait_for, never drops a cancel
                async with asyncio.timeout(None if self._queue.qsize() else self.idle_timeout):
                    chunk = await self._queue.get()
            except TimeoutError:
                self.closed = True
                yield ErrorChunk(
                    command_id=self.command_id,
                    seq=self._next_seq,
                    message=f"no output from the runner for {self.idle_timeout:.0f}s; the request was abandoned",
                    error_type="timeout",
                    code="idle_timeout",
                )
                return
            if is_terminal(chunk):
                self.closed = True
            yield chunk


class StreamRouter:
    """Routes chunks to open streams; unknown command ids are dropped (the client left)."""

    def __init__(self, idle_timeout: float = 120.0) -> None:
        self.idle_timeout = idle_timeout
        self._streams: dict[str, ChunkStream] = {}

    def open(self, command_id: str, idle_timeout: float | None = None) -> ChunkStream:
        stream = ChunkStream(command_id, idle_timeout or self.idle_timeout)
        self._streams[command_id] = stream
        return stream

    def close(self, command_id: str) -> None:
        stream = self._streams.pop(command_id, None)
        if stream:
            stream.closed = True

    def deliver(self, chunk: Chunk) -> None:
        if (stream := self._streams.get(chunk.command_id)) is not None:
            stream.put(chunk)

    def fail(self, command_id: str, message: str, **kwargs: Any) -> None:
        stream = self._streams.get(command_id)
        if stream is not None:
            stream.fail(message, **kwargs)

    def fail_all(self, message: str, code: str | None = None) -> None:
        for stream in list(self._streams.values()):
            stream.fail(message, code=code)

    def open_ids(self) -> list[str]:
        return list(self._streams)
