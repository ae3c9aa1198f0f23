"""Calling a capability on a node: the caller side of the provider data-plane topic.

A call is addressed to one node and pinned to the descriptor revision the caller read at
discovery. Frames go node to node on the data plane (same node: no network), never through the
master, State or the event log. The caller's half-close ends only its input; the provider's `end`
ends the call. A call that hears nothing within its deadline (plus a grace for the network) ends
in `deadline_exceeded`; one whose caller goes away is cancelled at the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from skulk_kernel.api import new_id

from . import frames
from .api import IoMode
from .frames import CallError, Cancel, End, Input, InputEnd, Open, Reorder

GRACE_S = 5.0  # the provider's own deadline fires first; this covers a node that went silent


class CallHandle:
    """One open call: send inputs, half-close, cancel; iterate the provider's frames in order."""

    def __init__(self, caller: Caller, node_id: str, call_id: str, mode: IoMode, deadline_s: float) -> None:
        self._caller = caller
        self.node_id = node_id
        self.call_id = call_id
        self.mode = mode
        self._frames: asyncio.Queue[Any] = asyncio.Queue()
        self._reorder = Reorder(first=0)
        self._in_seq = 0
        self.input_closed = False
        self.ended = False
        self.cancelled = False
        self._deadline = time.monotonic() + deadline_s + GRACE_S

    def deliver(self, frame: Any) -> None:
        for item in self._reorder.push(frame):
            self._frames.put_nowait(item)

    async def send_input(self, data: Any) -> None:
        if self.input_closed or self.ended or self.cancelled:
            raise CallError("invalid_request", "the input of this call is closed (half-closed or ended)")
        if not self.mode.streams_input:
            raise CallError("wrong_mode", f"a {self.mode.value} call takes its one input when it opens")
        self._in_seq += 1
        await self._caller.post(self.node_id, Input(call_id=self.call_id, seq=self._in_seq, data=data))

    async def half_close(self) -> None:
        """End this side's input; outputs keep coming until the provider's terminal."""
        if self.input_closed or self.ended:
            return
        self.input_closed = True
        self._in_seq += 1
        await self._caller.post(self.node_id, InputEnd(call_id=self.call_id, seq=self._in_seq))

    async def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel at the provider; `frames()` then ends with a `cancelled` terminal."""
        if self.ended or self.cancelled:
            return
        self.cancelled = True
        self._caller.forget(self.call_id)
        self._frames.put_nowait(End(call_id=self.call_id, seq=0, ok=False, code="cancelled", message=reason))
        with contextlib.suppress(Exception):
            await self._caller.post(self.node_id, Cancel(call_id=self.call_id, reason=reason))

    async def frames(self) -> AsyncIterator[Any]:
        """Started, outputs, then exactly one End (a synthesized one if the provider went silent)."""
        while not self.ended:
            left = self._deadline - time.monotonic()
            try:  # asyncio.timeout: Python 3.11's wait_for can return a frame and drop a cancel with it
                async with asyncio.timeout(max(left, 0.001)):
                    frame = await self._frames.get()
            except TimeoutError:
                frame = End(
                    call_id=self.call_id,
                    seq=0,
                    ok=False,
                    code="deadline_exceeded",
                    message=f"no answer from node {self.node_id} within the call's deadline",
                )
                with contextlib.suppress(Exception):
                    await self._caller.post(self.node_id, Cancel(call_id=self.call_id, reason="deadline passed"))
            if isinstance(frame, End):
                self.ended = True
                self._caller.forget(self.call_id)
            yield frame

    async def result(self) -> Any:
        """Unary: the one output, or raise the call's typed error."""
        output: Any = None
        async for frame in self.frames():
            if isinstance(frame, frames.Output):
                output = frame.data
            elif isinstance(frame, End):
                if not frame.ok:
                    raise CallError(frame.code, frame.message)
        return output


class Caller:
    """Opens calls from this node and routes the provider frames that come back to them."""

    def __init__(self, node_id: str, send: Callable[[str, bytes], Awaitable[None]], max_payload_bytes: int) -> None:
        self.node_id = node_id
        self._send = send
        self._open: dict[str, CallHandle] = {}
        self.max_payload_bytes = max_payload_bytes

    def on_frame(self, sender: str, frame: Any) -> None:
        handle = self._open.get(frame.call_id)
        if handle is not None and handle.node_id == sender:  # only the addressed node speaks for a call
            handle.deliver(frame)

    async def post(self, node_id: str, frame: Any) -> None:
        payload = frames.encode(frame)
        if len(payload) > self.max_payload_bytes + 1024:
            raise CallError(
                "payload_too_large",
                f"a message of {len(payload)} bytes is over the cap of {self.max_payload_bytes} bytes",
            )
        try:
            await self._send(node_id, payload)
        except CallError:
            raise
        except Exception as exc:
            raise CallError("node_unreachable", f"node {node_id} cannot be reached: {exc}") from exc

    def forget(self, call_id: str) -> None:
        self._open.pop(call_id, None)

    async def open(
        self,
        node_id: str,
        capability: str,
        revision: str,
        mode: IoMode,
        deadline_s: float,
        *,
        data: Any = None,
        has_input: bool = False,
    ) -> CallHandle:
        call_id = new_id()
        handle = CallHandle(self, node_id, call_id, mode, deadline_s)
        self._open[call_id] = handle
        frame = Open(
            call_id=call_id,
            capability=capability,
            revision=revision,
            mode=mode,
            deadline_s=deadline_s,
            input=data,
            has_input=has_input,
        )
        try:
            await self.post(node_id, frame)
        except CallError:
            self.forget(call_id)
            raise
        return handle
