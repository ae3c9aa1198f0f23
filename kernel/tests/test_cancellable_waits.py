"""Waits that a cancel must reach: the telemetry loop's round and an API stream's next chunk.

Python 3.11's ``asyncio.wait_for`` returns the awaited result and drops a cancel that lands in the
same tick: a telemetry loop then ran on after ``node.stop()`` cancelled it (a CI run's node hung
300 s), and a stream's reader read on after its request was cancelled. These waits use
``asyncio.wait`` and ``asyncio.timeout`` instead; each test fails on the wait_for version.
"""

from __future__ import annotations

import asyncio

from skulk_kernel.streams import ChunkStream
from skulk_kernel.tasks import TokenChunk


async def test_a_reset_send_filter_sends_at_once_not_next_round() -> None:
    """A new master hears every follower's readings as soon as they hear of it (not up to a round later)."""
    from skulk_kernel.readings import SendFilter

    sent = SendFilter()
    waited = asyncio.ensure_future(sent.next_round(30.0))
    await asyncio.sleep(0.05)
    assert not waited.done()
    sent.reset()
    await asyncio.wait_for(waited, 1.0)
    start = asyncio.get_running_loop().time()
    await sent.next_round(0.1)  # the wake is used up: the next round waits its interval
    assert asyncio.get_running_loop().time() - start >= 0.09


async def test_a_cancel_that_lands_with_a_reset_stops_the_telemetry_loop() -> None:
    """A node stopping while its master changes (a reset and the stop's cancel in one tick) must not
    run its telemetry loop on: Python 3.11's wait_for returned the wake's result and lost the cancel,
    and node.stop() waited for the loop forever (a CI run's node hung 300 s)."""
    from skulk_kernel.readings import SendFilter

    sent = SendFilter()

    async def rounds() -> None:
        while True:
            await sent.next_round(30.0)

    loop = asyncio.ensure_future(rounds())
    await asyncio.sleep(0.05)
    sent.reset()
    loop.cancel()
    done, _ = await asyncio.wait((loop,), timeout=2.0)
    assert done and loop.cancelled(), "the cancel was lost: the loop runs on"


async def test_a_cancel_that_lands_with_a_chunk_stops_the_streams_reader() -> None:
    stream = ChunkStream("c1", idle_timeout=30.0)
    read: list[str] = []

    async def reader() -> None:
        async for chunk in stream:
            assert isinstance(chunk, TokenChunk)
            read.append(chunk.text)

    task = asyncio.ensure_future(reader())
    await asyncio.sleep(0.05)  # the reader waits for its next chunk
    stream.put(TokenChunk(command_id="c1", seq=0, text="a"))
    task.cancel()
    stream.put(TokenChunk(command_id="c1", seq=1, text="b"))
    done, _ = await asyncio.wait((task,), timeout=2.0)
    assert done and task.cancelled(), f"the cancel was lost: the reader read on ({read})"


async def test_a_stream_silent_past_its_idle_timeout_ends_with_an_error() -> None:
    stream = ChunkStream("c1", idle_timeout=0.1)
    stream.put(TokenChunk(command_id="c1", seq=0, text="a"))
    chunks = [chunk async for chunk in stream]
    assert [type(c).__name__ for c in chunks] == ["TokenChunk", "ErrorChunk"]
    assert chunks[-1].code == "idle_timeout" and stream.closed
