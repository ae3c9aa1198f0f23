"""An input image (`input_reference`) from the API node to the node that renders, on the data plane.

The image never enters a command, State or the event log: `MediaParams` carries only its SHA-256
and size. Once the master has placed the task (it is `Running` in State), the API node sends the
bytes as `MediaChunk` pieces (256 KiB, `seq` 0, 1, ..., the digest and `finish_reason` on the last)
under the stream id `<command id>/input` to each node holding a runner of the instance. There an
`InputReceiver` (started by the engine plugin) takes them in order, refuses more bytes than were
declared, verifies size and digest, and writes the file atomically into a spool folder both the node
and its runner subprocess derive from the instance id; a failure writes a `.error` note instead.
The runner's engine waits for one of the two with `wait_for_input`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import CommandId, ErrorChunk, MediaChunk, NodeSurface, TaskId

log = logging.getLogger("skulk.media.inputs")
PIECE_BYTES = 256 * 1024
MEDIA_TASKS = ("ImageGenerationTask", "VideoGenerationTask")


class InputError(Exception):
    """The input did not arrive whole (size, digest, timeout, cancelled)."""


def input_stream_id(command_id: str) -> CommandId:
    return CommandId(f"{command_id}/input")


def spool_paths(instance_id: str, command_id: str) -> tuple[Path, Path]:
    """(the verified input, the error note) of one task, the same in the node and its runner."""
    root = Path(os.environ.get("SKULK_MEDIA_SPOOL") or Path(tempfile.gettempdir()) / f"skulk-media-{os.getuid()}")
    name = hashlib.sha256(command_id.encode()).hexdigest()[:32]
    return root / instance_id / f"{name}.input", root / instance_id / f"{name}.error"


def pieces(command_id: str, data: bytes, mime: str) -> list[MediaChunk]:
    stream = input_stream_id(command_id)
    count = max(1, -(-len(data) // PIECE_BYTES))
    digest = hashlib.sha256(data).hexdigest()
    return [
        MediaChunk(
            command_id=stream,
            seq=i,
            data=base64.b64encode(data[i * PIECE_BYTES : (i + 1) * PIECE_BYTES]).decode("ascii"),
            mime=mime,
            sha256=digest if i == count - 1 else "",
            finish_reason="stop" if i == count - 1 else None,
        )
        for i in range(count)
    ]


async def send_when_running(node: NodeSurface, command_id: str, data: bytes, mime: str, timeout: float) -> None:
    """Wait until the task runs, then send the input to every node holding one of its runners."""

    def placed(state: Any) -> bool:
        task = state.tasks.get(TaskId(command_id))
        return task is not None and task.status != "Pending"

    state = await node.wait_for(placed, timeout)
    task = state.tasks[TaskId(command_id)]
    if task.status != "Running":
        return  # already over: nothing to send
    instance = state.instances.get(task.instance_id)
    for target in list(instance.shard_assignments.node_to_runner) if instance is not None else []:
        for piece in pieces(command_id, data, mime):
            await node.send_chunk(target, piece)


RECEIVER_KEY = "api-media.inputs"


def shared_receiver(node: NodeSurface, max_bytes: int, timeout_s: float) -> InputReceiver:
    """The node's one receiver of media inputs: every media engine plugin on the node shares it (two
    receivers would both open a task's input stream)."""
    found = node.extensions.get(RECEIVER_KEY)
    if not isinstance(found, InputReceiver):
        found = node.extensions[RECEIVER_KEY] = InputReceiver(node, max_bytes, timeout_s)
    return found


def forward_event(node: NodeSurface, event: Any) -> None:
    """An engine plugin's on_event_applied: the events the receiver follows (idempotent, so every
    media plugin on the node may forward them)."""
    receiver = node.extensions.get(RECEIVER_KEY)
    if not isinstance(receiver, InputReceiver):
        return
    kind = type(event).__name__
    if kind == "TaskCreated":
        receiver.on_task_created(event.task)
    elif kind == "TaskDeleted":
        receiver.on_task_deleted(event.task_id)
    elif kind == "InstanceDeleted":
        receiver.on_instance_deleted(event.instance_id)


def close_receiver(node: NodeSurface) -> None:
    receiver = node.extensions.pop(RECEIVER_KEY, None)
    if isinstance(receiver, InputReceiver):
        receiver.close()


class InputReceiver:
    """Takes the inputs of media tasks whose runner is on this node and spools them."""

    def __init__(self, node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        self.node = node
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.receiving: dict[str, asyncio.Task[None]] = {}

    def on_task_created(self, task: Any) -> None:
        if type(task).__name__ not in MEDIA_TASKS or not task.params.input_sha256 or task.task_id in self.receiving:
            return
        instance = self.node.state.instances.get(task.instance_id)
        if instance is None or self.node.node_id not in instance.shard_assignments.node_to_runner:
            return
        stream = self.node.streams.open(input_stream_id(task.command_id), idle_timeout=self.timeout_s)
        self.receiving[task.task_id] = self.node.spawn(self._receive(task, stream), f"input-{task.task_id[:8]}")

    def on_task_deleted(self, task_id: str) -> None:
        receiving = self.receiving.pop(task_id, None)
        if receiving is not None and not receiving.done():
            receiving.cancel()

    def on_instance_deleted(self, instance_id: str) -> None:
        shutil.rmtree(spool_paths(instance_id, "x")[0].parent, ignore_errors=True)

    def close(self) -> None:
        for task in list(self.receiving.values()):
            task.cancel()

    async def _receive(self, task: Any, stream: Any) -> None:
        done, error = spool_paths(task.instance_id, task.command_id)
        expected = int(task.params.input_bytes)
        try:
            data = await self._collect(stream, expected)
            digest = hashlib.sha256(data).hexdigest()
            if digest != task.params.input_sha256:
                raise InputError(f"the input's SHA-256 is {digest}, the request declared {task.params.input_sha256}")
            await asyncio.to_thread(_write_atomically, done, data)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                done.unlink(missing_ok=True)
            raise
        except InputError as exc:
            log.warning("input of task %s refused: %s", task.task_id, exc)
            await asyncio.to_thread(_write_atomically, error, str(exc).encode())
        finally:
            self.node.streams.close(input_stream_id(task.command_id))
            self.receiving.pop(task.task_id, None)

    async def _collect(self, stream: Any, expected: int) -> bytes:
        if expected > self.max_bytes:
            raise InputError(f"the input declares {expected} bytes; this node accepts at most {self.max_bytes}")
        hold: list[bytes] = []
        size = 0
        async for chunk in stream:
            if isinstance(chunk, ErrorChunk):
                raise InputError(f"the input did not arrive: {chunk.message}")
            if not isinstance(chunk, MediaChunk):
                raise InputError(f"unexpected {type(chunk).__name__} in an input stream")
            piece = base64.b64decode(chunk.data)
            size += len(piece)
            if size > expected:
                raise InputError(f"the input is longer than the {expected} bytes it declared")
            hold.append(piece)
            if chunk.finish_reason is not None:
                break
        if size != expected:
            raise InputError(f"the input ended after {size} of {expected} bytes")
        return b"".join(hold)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def wait_for_input(
    instance_id: str, command_id: str, sha256: str, timeout_s: float, cancelled: Callable[[], bool]
) -> bytes:
    """Inside the runner: the verified input of one task (deleted once read), or InputError."""
    done, error = spool_paths(instance_id, command_id)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        if done.is_file():
            data = done.read_bytes()
            done.unlink(missing_ok=True)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise InputError("the spooled input does not match its SHA-256")
            return data
        if error.is_file():
            message = error.read_text(errors="replace")
            error.unlink(missing_ok=True)
            raise InputError(message)
        if cancelled():
            raise InputError("cancelled while waiting for the input image")
        if time.monotonic() > deadline:
            raise InputError(f"the input image did not arrive within {timeout_s:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
