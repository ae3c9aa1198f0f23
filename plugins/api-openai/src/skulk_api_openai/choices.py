"""Several generations answered as one response: a text completion's choices (prompts x n).

Each choice is an ordinary `generate()` call (its own command, routed, admitted, resumed and traced
like any request), all started together. `ChoiceHandles` stands for them where the route template
(`adapter_routes.answer`) expects one handle: its `first` is the first error any choice began with
(so a bad request is still one HTTP status), and closing it closes every choice, cancelling those
not finished. `merged()` interleaves the choices' chunks as they come, each tagged with its index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from skulk_api_control.dispatch import InferenceHandle, generate
from skulk_kernel.api import Chunk, ErrorChunk, NodeSurface, TextGenerationParams, is_terminal


@dataclass
class ChoiceHandles(InferenceHandle):
    handles: list[InferenceHandle] = field(default_factory=list)
    pumps: list[asyncio.Task[None]] = field(default_factory=list)

    async def close(self) -> None:
        """Close every choice (cancelling the unfinished) and stop reading them, however the answer ended."""
        if self.closed:
            return
        self.closed = True
        for pump in self.pumps:
            pump.cancel()
        await asyncio.gather(*(h.close() for h in self.handles), *self.pumps, return_exceptions=True)

    async def merged(self) -> AsyncIterator[tuple[int, Chunk]]:
        """`(index, chunk)` of every choice as it arrives, until each has ended (its terminal chunk)."""
        queue: asyncio.Queue[tuple[int, Chunk] | None] = asyncio.Queue()

        async def pump(index: int, handle: InferenceHandle) -> None:
            try:
                async for chunk in handle.chunks():
                    await queue.put((index, chunk))
            finally:
                await queue.put(None)

        pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(self.handles)]
        self.pumps.extend(pumps)  # a reader that stops early leaves them to close()
        running = len(pumps)
        try:
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                    continue
                yield item
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self.finished = all(h.finished for h in self.handles)


async def start_choices(node: NodeSurface, choices: Sequence[TextGenerationParams]) -> ChoiceHandles:
    """Start every choice; raises the first InferenceError any of them raised (closing the rest)."""
    tasks = [asyncio.ensure_future(generate(node, params)) for params in choices]
    try:
        await asyncio.wait(tasks)
    except BaseException:  # the client left while they started
        for t in tasks:
            t.cancel()
        await _close_started(tasks)
        raise
    failed = next((t.exception() for t in tasks if t.exception() is not None), None)
    if failed is not None:
        await _close_started(tasks)
        raise failed
    handles = [t.result() for t in tasks]
    for h in handles:
        if is_terminal(h.first):
            h.finished = True
    first = next((h.first for h in handles if isinstance(h.first, ErrorChunk)), handles[0].first)
    lead = handles[0]
    return ChoiceHandles(node, lead.command_id, lead.iterator, first, command=lead.command, handles=handles)


async def _close_started(tasks: list[asyncio.Task[InferenceHandle]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is None:
            await t.result().close()
