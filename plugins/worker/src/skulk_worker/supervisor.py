"""Supervises one runner subprocess: spawn, relay, restart with backoff, give up with a reason.

The supervisor is the only thing that talks to the process. It relays statuses and acks to the
master (LOCAL_EVENTS) and chunks straight to the owning API node (data plane). When the process
dies unexpectedly every in-flight task is failed at once so no stream hangs, and the runner is
restarted with exponential backoff until it has crashed `max_restarts` times inside the window;
then the instance is failed with the reason, which shows in /state.

A runner must report loaded within its load deadline (`load_deadline_s`: the worker's
`load_timeout_s` floor, or `load_s_per_gib` per GiB of its weights share if that is longer, plus
the group's formation deadline for a rank of a multi-rank instance). One that does not is killed
(its process, at once) and the instance is failed and placed again; after `load_retries` misses in
a row for the same model on this node, it is placed again without this node.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from skulk_kernel.api import (
    CommandId,
    ErrorChunk,
    FailInstance,
    NodeId,
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
    TensorShardMetadata,
    is_terminal,
    new_id,
)

from .runner import runner_main

log = logging.getLogger("skulk.worker")
_SPAWN = multiprocessing.get_context("spawn")
GIB = 2**30


def weights_share(card: Any, shard: Any) -> float:
    """Bytes of the model's weights a shard holds (a tensor rank 1/world, a pipeline rank its
    layers' share)."""
    if isinstance(shard, TensorShardMetadata):
        share = 1 / shard.world_size
    else:
        share = (shard.end_layer - shard.start_layer) / shard.n_layers
    return float(card.storage_size) * share


def load_deadline_s(spec: RunnerSpec, config: Any) -> float:
    """How long a runner may take from spawn to loaded: the floor, or scaled by its weights share,
    plus the group's formation deadline when it is a rank of a multi-rank instance."""
    scaled = config.load_s_per_gib * weights_share(spec.card, spec.shard) / GIB
    formation = spec.group.formation_deadline_s if spec.group is not None else 0.0
    return max(config.load_timeout_s, scaled) + formation


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
    load_misses: dict[str, int] = field(default_factory=dict)  # the worker's: model id -> deadlines missed in a row
    loaded: bool = False
    load_started: float = 0.0  # monotonic, when the current process was spawned
    _deadline: asyncio.TimerHandle | None = None
    drafted: int = 0  # speculative decoding, over this runner's life: tokens the draft proposed ...
    draft_accepted: int = 0  # ... and how many of them the model kept (from the final chunks' stats)
    _reader: threading.Thread | None = None

    @property
    def runner_id(self) -> str:
        return self.spec.runner_id

    # ------------------------------------------------------------------ process

    def start(self) -> None:
        self.inq = _SPAWN.Queue()
        self.outq, writer = _SPAWN.Pipe(duplex=False)  # the runner's batches (runner.Outbox)
        self.process = _SPAWN.Process(
            target=runner_main,
            args=(self.profile, self.engine_name, self.spec, self.context_limit, self.inq, writer, os.getpid()),
            name=f"skulk-runner-{self.runner_id[:8]}",
            daemon=True,
        )
        self.process.start()
        writer.close()  # the runner holds the only write end: its death is an EOF here at once
        self.loaded = False
        self.load_started = time.monotonic()
        self._phase("spawned")
        log.info(
            "runner %s for %s started (pid %s, engine %s)",
            self.runner_id,
            self.spec.card.model_id,
            self.process.pid,
            self.engine_name,
        )
        loop = asyncio.get_running_loop()
        process = self.process
        self._disarm()
        self._deadline = loop.call_later(
            load_deadline_s(self.spec, self.config),
            lambda: self._spawn_on_loop(self._load_overdue(process)),
        )
        self._reader = threading.Thread(
            target=self._read, args=(loop, self.process, self.outq), daemon=True, name=f"reader-{self.runner_id[:8]}"
        )
        self._reader.start()

    def _read(self, loop: asyncio.AbstractEventLoop, process: Any, conn: Any) -> None:
        """Blocking reads on a thread; each batch of messages is handed to the event loop in order,
        as one callback (not one per message: a token costs the loop no wake-up of its own). It
        sleeps until the pipe has a batch or the process has exited (its sentinel): an idle runner
        costs no wake-ups."""
        while True:
            try:
                if conn not in multiprocessing.connection.wait([conn, process.sentinel]):
                    raise EOFError  # exited, and nothing is left to read
                batch = conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(self._spawn_on_loop, self._on_exit(process))
                return
            loop.call_soon_threadsafe(self._spawn_on_loop, self._on_batch(batch))
            if any(message[0] == "stopped" for message in batch):
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

    async def _on_batch(self, batch: list[tuple[Any, ...]]) -> None:
        for message in batch:
            await self._on_message(message)

    async def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "status":
            status = message[1]
            self.ready = type(status).__name__ in ("RunnerReady", "RunnerRunning")
            if not self.loaded and type(status).__name__ in ("RunnerLoaded", "RunnerWarmingUp", "RunnerReady"):
                self.loaded = True
                self._disarm()
                self.load_misses.pop(self.spec.card.model_id, None)
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

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    async def _load_overdue(self, process: Any) -> None:
        """The load deadline passed: kill the process, fail the instance and have it placed again."""
        if process is not self.process or self.loaded or self.stopping or self.node.stopping:
            return
        self.stopping = True  # the exit that follows is not a crash to restart
        model_id = self.spec.card.model_id
        waited = time.monotonic() - self.load_started
        misses = self.load_misses.get(model_id, 0) + 1
        self.load_misses[model_id] = misses
        gib = weights_share(self.spec.card, self.spec.shard) / GIB
        again = "placing it again"
        if misses > self.config.load_retries:
            again += f" without node {self.node.node_id} (missed {misses} times in a row here)"
        reason = (
            f"runner {self.runner_id} of instance {self.spec.instance_id} did not finish loading {model_id} "
            f"within {load_deadline_s(self.spec, self.config):.0f} s (deadline scaled by its {gib:.3g} GiB "
            f"of weights); {again}"
        )
        log.error("%s (killing pid %s after %.1f s)", reason, process.pid, waited)
        self._phase("load_deadline", detail=reason)
        process.kill()  # a wedged load may ignore SIGTERM; nothing in it is worth saving
        await asyncio.to_thread(process.join, 5)
        if process.is_alive():
            log.error("runner %s (pid %s) did not die after SIGKILL", self.runner_id, process.pid)
        await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=RunnerFailed(error_message=reason)))
        if misses > self.config.load_retries:
            self._submit_fail(reason, excluding=self.node.node_id)
        else:
            self._submit_fail(reason, replace=True)

    async def _on_exit(self, process: Any) -> None:
        code = process.exitcode
        if process is self.process:
            self._disarm()  # a restart arms a new deadline
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
        self._disarm()
        self._submit_fail(reason, replace=replace)

    def _submit_fail(self, reason: str, *, replace: bool = False, excluding: str | None = None) -> None:
        command = FailInstance(
            command_id=CommandId(new_id()),
            instance_id=self.spec.instance_id,
            reason=reason,
            replace=replace,
            replace_excluding=NodeId(excluding) if excluding is not None else None,
        )
        self.node.spawn(self.node.submit(command), "submit")

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
        self._disarm()
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
        self.inq.close()
        self.inq.cancel_join_thread()
        self.outq.close()
        await self.node.emit(RunnerStatusUpdated(runner_id=self.runner_id, status=RunnerShutdown()))
