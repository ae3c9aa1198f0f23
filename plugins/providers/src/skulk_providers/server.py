"""Serving capability calls on this node: the provider side of the provider data-plane topic.

Skulk, not the extension, owns the lifecycle: it checks the pinned revision, the mode, the
concurrency cap and every input against the input schema; sends `started`; runs the handler under
the call's deadline; checks every output against the output schema; and sends exactly one `end`
whatever the handler did (returned, raised, hung past the deadline, was cancelled). A call whose
caller's node left the cluster is cancelled: nobody is there to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from . import frames
from .api import Capability, IoMode, ProviderError
from .config import ProvidersConfig
from .frames import CallError, Cancel, End, Input, InputEnd, Open, Output, Reorder, Started

log = logging.getLogger("skulk.providers.server")
SWEEP_S = 1.0
_END = object()


def schema_error(validator: Draft202012Validator, value: Any, what: str) -> str | None:
    """None when `value` matches; else a message naming the field and what was wrong."""
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(the whole message)"
    return f"{what} does not match the schema at {where}: {error.message}"


@dataclass
class _Served:
    caller: str
    call_id: str
    capability: Capability
    inputs: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    reorder: Reorder = field(default_factory=lambda: Reorder(first=1))
    task: asyncio.Task[Any] | None = None
    out_seq: int = 0
    ended: bool = False
    error: CallError | None = None


class CallServer:
    """Answers `open` frames for the capabilities loaded here."""

    def __init__(
        self,
        capabilities: dict[str, Capability],
        config: ProvidersConfig,
        send: Callable[[str, bytes], Awaitable[None]],
        spawn: Callable[[Any, str], asyncio.Task[Any]],
        reachable: Callable[[], set[str]],
    ) -> None:
        self.capabilities = capabilities
        self.config = config
        self._send = send
        self._spawn = spawn
        self._reachable = reachable
        self._calls: dict[tuple[str, str], _Served] = {}
        self._validators = {
            ref: (Draft202012Validator(c.descriptor.input_schema), Draft202012Validator(c.descriptor.output_schema))
            for ref, c in capabilities.items()
        }
        self.served = 0

    @property
    def active(self) -> int:
        return len(self._calls)

    async def on_frame(self, sender: str, frame: Any, size: int) -> None:
        if isinstance(frame, Open):
            await self._open(sender, frame, size)
            return
        call = self._calls.get((sender, frame.call_id))
        if call is None or call.ended:
            return
        if isinstance(frame, Cancel):
            self._fail(call, CallError("cancelled", frame.reason))
            return
        if size > self.config.max_payload_bytes:
            self._fail(
                call,
                CallError(
                    "payload_too_large",
                    f"an input of {size} bytes is over this node's cap of {self.config.max_payload_bytes} bytes",
                ),
            )
            return
        for item in call.reorder.push(frame):
            if isinstance(item, InputEnd):
                call.inputs.put_nowait(_END)
            elif isinstance(item, Input):
                problem = schema_error(self._validators[call.capability.descriptor.ref][0], item.data, "input")
                if problem:
                    self._fail(call, CallError("invalid_input", f"input {item.seq}: {problem}"))
                    return
                call.inputs.put_nowait(item.data)

    def _fail(self, call: _Served, error: CallError) -> None:
        if call.error is None:
            call.error = error
        if call.task is not None:
            call.task.cancel()

    async def _open(self, caller: str, frame: Open, size: int) -> None:
        async def refuse(code: str, message: str) -> None:
            await self._post(caller, End(call_id=frame.call_id, seq=0, ok=False, code=code, message=message))

        cap = self.capabilities.get(frame.capability)
        if cap is None:
            offered = ", ".join(sorted(self.capabilities)) or "none"
            return await refuse("unknown_capability", f"this node offers no {frame.capability} (it offers: {offered})")
        if frame.revision != cap.descriptor.revision:
            return await refuse(
                "revision_mismatch",
                f"{frame.capability} is at revision {cap.descriptor.revision}, "
                f"not {frame.revision}: read its descriptor again (GET /v1/capabilities)",
            )
        if frame.mode != cap.descriptor.mode:
            hint = ": call it through the WebSocket /v1/capabilities/stream" if frame.mode == IoMode.UNARY else ""
            return await refuse(
                "wrong_mode", f"{frame.capability} is {cap.descriptor.mode.value}, not {frame.mode}{hint}"
            )
        if size > self.config.max_payload_bytes:
            return await refuse(
                "payload_too_large",
                f"the input of {size} bytes is over this node's cap of {self.config.max_payload_bytes} bytes",
            )
        if (caller, frame.call_id) in self._calls:
            return await refuse("invalid_request", f"call {frame.call_id} is already open")
        if len(self._calls) >= self.config.max_concurrent_calls:
            return await refuse(
                "busy",
                f"this node serves {self.config.max_concurrent_calls} calls at once; "
                "retry shortly or call another node offering it",
            )
        first: Any = None
        if not cap.descriptor.mode.streams_input:
            if not frame.has_input:
                return await refuse("invalid_request", f"{frame.capability} takes one input with the call")
            problem = schema_error(self._validators[frame.capability][0], frame.input, "input")
            if problem:
                return await refuse("invalid_input", problem)
            first = frame.input
        call = _Served(caller=caller, call_id=frame.call_id, capability=cap)
        self._calls[(caller, frame.call_id)] = call
        await self._post(caller, Started(call_id=frame.call_id, revision=cap.descriptor.revision))
        deadline = min(frame.deadline_s, self.config.max_timeout_s)
        call.task = self._spawn(self._run(call, first, deadline), f"provider-call-{frame.call_id}")
        call.task.add_done_callback(lambda _t: self._settle(call))

    def _settle(self, call: _Served) -> None:
        """A task cancelled before it ran never reaches `_run`'s own terminal: send it here."""
        if not call.ended:
            self._calls.pop((call.caller, call.call_id), None)
            self._spawn(self._end(call, call.error or CallError("cancelled", "the call was cancelled")), "provider-end")

    async def _run(self, call: _Served, first: Any, deadline: float) -> None:
        ref, mode = call.capability.descriptor.ref, call.capability.descriptor.mode
        error: CallError | None = None
        try:
            async with asyncio.timeout(deadline):
                if mode == IoMode.UNARY:
                    await self._output(call, await call.capability.call(first))
                else:
                    async for out in call.capability.stream(self._inputs(call, first)):
                        if mode == IoMode.CLIENT_STREAMING and call.out_seq >= 1:
                            raise CallError("invalid_output", f"{ref} yielded a second output (client_streaming: one)")
                        await self._output(call, out)
                    if mode == IoMode.CLIENT_STREAMING and call.out_seq != 1:
                        raise CallError("invalid_output", f"{ref} ended without its one output")
        except CallError as exc:
            error = exc
        except TimeoutError:
            late = f"{ref} did not finish within its {deadline:g}s deadline"
            error = call.error or CallError("deadline_exceeded", late)
        except asyncio.CancelledError:
            error = call.error or CallError("cancelled", "the call was cancelled")
        except ProviderError as exc:
            error = CallError(exc.code if exc.code in frames.ERRORS else "provider_error", str(exc))
        except Exception as exc:  # the extension's fault: a typed error for the caller, the node goes on
            log.warning("capability %s raised on call %s: %r", ref, call.call_id, exc)
            error = CallError("provider_error", f"{ref} raised {type(exc).__name__}: {exc}"[:1000])
        error = call.error or error
        self._calls.pop((call.caller, call.call_id), None)
        self.served += 1
        await self._end(call, error)

    async def _inputs(self, call: _Served, first: Any) -> AsyncIterator[Any]:
        if not call.capability.descriptor.mode.streams_input:
            yield first
            return
        while True:
            item = await call.inputs.get()
            if item is _END:
                return
            yield item

    async def _output(self, call: _Served, data: Any) -> None:
        problem = schema_error(self._validators[call.capability.descriptor.ref][1], data, "the provider's output")
        if problem:
            raise CallError("invalid_output", problem)
        frame = Output(call_id=call.call_id, seq=call.out_seq + 1, data=data)
        payload = frames.encode(frame)
        if len(payload) > self.config.max_payload_bytes + 1024:
            raise CallError("invalid_output", f"an output of {len(payload)} bytes is over the node's cap")
        call.out_seq += 1
        await self._send_raw(call.caller, payload)

    async def _end(self, call: _Served, error: CallError | None) -> None:
        if call.ended:
            return
        call.ended = True
        end = End(
            call_id=call.call_id,
            seq=call.out_seq + 1,
            ok=error is None,
            code=error.code if error else "",
            message=error.message if error else "",
        )
        await self._post(call.caller, end)

    async def _post(self, node: str, frame: Any) -> None:
        await self._send_raw(node, frames.encode(frame))

    async def _send_raw(self, node: str, payload: bytes) -> None:
        try:
            await self._send(node, payload)
        except Exception as exc:  # the caller's node is gone: the sweep cancels what is left
            log.info("provider frame to %s not sent: %r", node, exc)

    async def sweep(self, stopping: Callable[[], bool]) -> None:
        """Cancel calls whose caller's node is no longer reachable (abandoned calls)."""
        while not stopping():
            await asyncio.sleep(SWEEP_S)
            alive = self._reachable()
            for call in list(self._calls.values()):
                if call.caller not in alive:
                    self._fail(call, CallError("cancelled", f"the caller's node {call.caller} left"))

    async def close(self) -> None:
        for call in list(self._calls.values()):
            self._fail(call, CallError("node_unreachable", "the serving node is shutting down"))
        tasks = [c.task for c in self._calls.values() if c.task is not None]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
