"""Supervises one runner subprocess: spawn, relay, restart with backoff, give up with a reason.

The supervisor is the only thing that talks to the process. It relays statuses and acks to the
master (LOCAL_EVENTS) and chunks straight to the owning API node (data plane). When the process
dies unexpectedly every in-flight task is failed at once so no stream hangs, and the runner is
restarted with exponential backoff until it has crashed `max_restarts` times inside the window;
then the instance is failed with the reason, which shows in /state.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from skulk_kernel.api import (
    CommandId,
    ErrorChunk,
    FailInstance,
    NodeSurface,
    Profile,
    RunnerFailed,
    RunnerIdle,
    RunnerShutdown,
    RunnerSpec,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskFailed,
    TaskStatusUpdated,
    is_terminal,
    new_id,
)

from .runner import runner_main

log = logging.getLogger("skulk.worker")
_SPAWN = multiprocessing.get_context("spawn")


def _optional_observe() -> Any:
    """The observe plugin's helpers (flight recorder, spans), or None: the worker does not need it."""
    try:
        import skulk_observe
    except ImportError:
        return None
    return skulk_observe


_OBSERVE = _optional_observe()


@dataclass
class _InFlight:
    task: Any
    next_seq: int = 0
    traced: bool = False  # tracing was on when the task arrived: spans are recorded for it
    queued_ns: int = 0


@dataclass
class RunnerSupervisor:
    node: NodeSurface
    spec: RunnerSpec
    engine_name: str
    profile: Profile
    context_limit: int
    config: Any
    process: Any = None
    inq: Any = None
    outq: Any = None
    in_flight: dict[str, _InFlight] = field(default_factory=dict)
    crashes: deque[float] = field(default_factory=deque)
    stopping: bool = False
    ready: bool = False
    drafted: int = 0  # speculative decoding, over this runner's life: tokens the draft proposed ...
    draft_accepted: int = 0  # ... and how many of them the model kept (from the final chunks' stats)
    _reader: threading.Thread | None = None

    @property
    def runner_id(self) -> str:
        return self.spec.runner_id

    # ------------------------------------------------------------------ process

    def start(self) -> None:
        self.inq, self.outq = _SPAWN.Queue(), _SPAWN.Queue()
        self.process = _SPAWN.Process(
            target=runner_main,
            args=(self.profile, self.engine_name, self.spec, self.context_limit, self.inq, self.outq, os.getpid()),
            name=f"skulk-runner-{self.runner_id[:8]}",
            daemon=True,
        )
        self.process.start()
        self._phase("spawned")
        log.info(
            "runner %s for %s started (pid %s, engine %s)",
            self.runner_id,
            self.spec.card.model_id,
            self.process.pid,
            self.engine_name,
        )
        loop = asyncio.get_running_loop()
        self._reader = threading.Thread(
            target=self._read, args=(loop, self.process, self.outq), daemon=True, name=f"reader-{self.runner_id[:8]}"
        )
        self._reader.start()

    def _read(self, loop: asyncio.AbstractEventLoop, process: Any, outq: Any) -> None:
        """Blocking reads on a thread; every message is handed to the event loop in order."""
        while True:
            try:
                message = outq.get(timeout=0.25)
            except queue.Empty:
                if not process.is_alive():
                    loop.call_soon_threadsafe(self._spawn_on_loop, self._on_exit(process))
                    return
                continue
            except (EOFError, OSError):
                loop.call_soon_threadsafe(self._spawn_on_loop, self._on_exit(process))
                return
            loop.call_soon_threadsafe(self._spawn_on_loop, self._on_message(message))
            if message[0] == "stopped":
                return

    def _spawn_on_loop(self, coro: Any) -> None:
        self.node.spawn(coro, f"runner-{self.runner_id[:8]}-msg")

    # ------------------------------------------------------------------ messages

    @property
    def output_rank(self) -> bool:
        """Rank 0 of an instance streams; the other ranks' chunks are the same tokens, dropped here."""
        return self.spec.shard.device_rank == 0

    def _phase(self, phase: str, task_id: str | None = None, detail: str = "") -> None:
        if _OBSERVE is not None:
            pid = self.process.pid if self.process is not None else None
            _OBSERVE.record_phase(
                self.node,
                self.runner_id,
                phase,
                pid=pid,
                task_id=task_id,
                detail=detail,
                model_id=self.spec.card.model_id,
            )

    def _span(self, flight: _InFlight, name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
        if _OBSERVE is not None and flight.traced:
            parent = None if name == "worker.task" else "worker.task"
            span_id = "worker.task" if name == "worker.task" else None
            attributes = {"runner_id": self.runner_id, "rank": self.spec.shard.device_rank, **attrs}
            _OBSERVE.record_span(
                self.node,
                flight.task.command_id,
                name,
                start_ns,
                end_ns,
                parent=parent,
                span_id=span_id,
                attributes=attributes,
            )

    async def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "status":
            status = message[1]
            self.ready = type(status).__name__ in ("RunnerReady", "RunnerRunning")
            self._phase(type(status).__name__)
            await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=status))
        elif kind == "ack":
            flight = self.in_flight.get(message[1])
            if flight is not None:
                self._span(flight, "worker.runner_queue", flight.queued_ns, time.time_ns())
            if self.output_rank:
                await self.node.emit(TaskAcknowledged(task_id=message[1]))
        elif kind == "chunk":
            flight = self.in_flight.get(message[1])
            if flight is not None and (self.output_rank or isinstance(message[2], ErrorChunk)):
                flight.next_seq = message[2].seq + 1
                if (stats := message[2].stats) is not None and stats.draft_tokens:
                    self.drafted += stats.draft_tokens
                    self.draft_accepted += stats.draft_accepted
                hop = flight.traced and (message[2].seq == 0 or is_terminal(message[2]))
                sent_ns = time.time_ns() if hop else 0
                await self.node.send_chunk(flight.task.owner_node_id, message[2])
                if hop:
                    which = "last" if is_terminal(message[2]) else "first"
                    to = flight.task.owner_node_id
                    self._span(
                        flight, "data_plane.send", sent_ns, time.time_ns(), seq=message[2].seq, which=which, to=to
                    )
        elif kind == "phase":
            self._phase(message[2], task_id=message[1])
        elif kind == "span":
            flight = self.in_flight.get(message[1])
            if flight is not None:
                self._span(flight, message[2], message[3], message[4], **message[5])
        elif kind == "done":
            flight = self.in_flight.pop(message[1], None)
            if flight is not None:
                self._span(flight, "worker.task", flight.queued_ns, time.time_ns(), status=message[2])
            if flight is not None and (self.output_rank or message[2] == "Failed"):
                await self.node.emit(TaskStatusUpdated(task_id=message[1], status=message[2]))
        elif kind == "broken":
            log.error("runner %s lost its group: %s", self.runner_id, message[1])
            await self._give_up(f"the instance's rank group broke ({message[1]}); re-placing it", replace=True)
        elif kind == "fatal":
            log.error("runner %s could not load:\n%s", self.runner_id, message[1])
            self.stopping = True  # a load failure is not a crash loop: fail the instance at once
            await self._give_up(
                f"runner failed to load {self.spec.card.model_id}: {message[1].strip().splitlines()[-1]}"
            )

    async def _on_exit(self, process: Any) -> None:
        code = process.exitcode
        self._phase("exited", detail=f"exit code {code}")
        await self._fail_in_flight(f"the runner process exited unexpectedly (exit code {code})")
        if self.stopping or process is not self.process or self.node.stopping:
            return
        now = time.monotonic()
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.config.crash_window_s:
            self.crashes.popleft()
        reason = f"runner for {self.spec.card.model_id} crashed (exit code {code})"
        log.error("%s; %d crash(es) in the last %.0fs", reason, len(self.crashes), self.config.crash_window_s)
        await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=RunnerFailed(error_message=reason)))
        if len(self.crashes) > self.config.max_restarts:
            await self._give_up(
                f"{reason}; gave up after {len(self.crashes)} crashes within {self.config.crash_window_s:.0f}s"
            )
            return
        delay = self.config.restart_backoff_s * 2 ** (len(self.crashes) - 1)
        await asyncio.sleep(delay)
        if not self.stopping:
            await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=RunnerIdle()))
            self.start()

    async def _give_up(self, reason: str, *, replace: bool = False) -> None:
        if self.stopping and replace:
            return  # already given up (another task of the same broken group)
        self.stopping = True
        self.node.spawn(
            self.node.submit(
                FailInstance(
                    command_id=CommandId(new_id()), instance_id=self.spec.instance_id, reason=reason, replace=replace
                )
            ),
            "submit",
        )

    async def _fail_in_flight(self, reason: str) -> None:
        for task_id, flight in list(self.in_flight.items()):
            self.in_flight.pop(task_id, None)
            await self.node.send_chunk(
                flight.task.owner_node_id,
                ErrorChunk(command_id=flight.task.command_id, seq=0, message=reason, code="runner_crashed"),
            )
            await self.node.emit(TaskFailed(task_id=task_id, error_message=reason))

    # ------------------------------------------------------------------ tasks

    def submit(self, task: Any) -> None:
        traced = _OBSERVE is not None and _OBSERVE.tracing_on(self.node)
        self.in_flight[task.task_id] = _InFlight(task, traced=traced, queued_ns=time.time_ns())
        self._phase("task_queued", task_id=task.task_id)
        self.inq.put(("task", task, traced))

    def cancel(self, task_id: str) -> None:
        if task_id in self.in_flight:
            self.inq.put(("cancel", task_id))

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        await self._fail_in_flight("the instance is shutting down")
        process = self.process
        if process is None:
            return
        if process.is_alive():
            self.inq.put(("stop",))
            await asyncio.to_thread(process.join, timeout)
        if process.is_alive():
            process.terminate()
            await asyncio.to_thread(process.join, 2)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join, 2)
        for q in (self.inq, self.outq):
            q.close()
            q.cancel_join_thread()
        await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=RunnerShutdown()))
