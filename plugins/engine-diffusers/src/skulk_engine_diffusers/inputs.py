"""An edit's input image, from the API node to the node whose runner makes the image.

The image never enters a command, State or the event log: the `ImageGeneration` command carries
only its SHA-256 and size (`MediaParams.input_sha256`, `input_bytes`). The same protocol as the
speech plugin's audio uploads, with media pieces:

1. The API node submits the command and waits until the task is `Running` (the runner acknowledged
   it; its node applied `TaskCreated` and opened the input stream before that, so no piece arrives
   unrouted), then sends the bytes as `MediaChunk`s (`pieces.split`) under the stream id
   `<command id>/input` to every node holding a runner of the instance.
2. That node (`InputReceiver`, opened on `TaskCreated`) takes the pieces, refuses more bytes than the
   command declared or than its bound, verifies size and digest, and writes the file into a spool
   folder atomically (or a `.error` file saying why).
3. The runner (`wait_for_input`) waits for one of the two, bounded by time and the cancel flag.

The spool folder is derived from the instance id alone: runner and node share the filesystem.
"""

from __future__ import annotations

import asyncio
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

from skulk_kernel.api import CommandId, ErrorChunk, ImageGenerationTask, MediaChunk, NodeSurface, TaskId

from .pieces import Assembler, PieceError, split

log = logging.getLogger("skulk.diffusers.inputs")
INPUT_MIME = "application/x-skulk-input"


class InputError(Exception):
    """The input image did not arrive whole (wrong size or digest, timeout, cancelled)."""


def input_stream_id(command_id: str) -> CommandId:
    return CommandId(f"{command_id}/input")


def spool_dir(instance_id: str) -> Path:
    default = Path(tempfile.gettempdir()) / f"skulk-diffusers-{os.getuid()}"
    return Path(os.environ.get("SKULK_DIFFUSERS_SPOOL") or default) / instance_id


def spool_paths(instance_id: str, command_id: str) -> tuple[Path, Path]:
    """(the verified image, the error note) of one task."""
    name = hashlib.sha256(command_id.encode()).hexdigest()[:32]
    return spool_dir(instance_id) / f"{name}.input", spool_dir(instance_id) / f"{name}.error"


# ------------------------------------------------------------------ the API node


async def send_when_running(node: NodeSurface, command_id: str, data: bytes, timeout: float) -> None:
    """Wait until the task runs, then send the image to every node holding one of its runners."""

    def placed(state: Any) -> bool:
        task = state.tasks.get(TaskId(command_id))
        return task is not None and task.status != "Pending"

    state = await node.wait_for(placed, timeout)
    task = state.tasks[TaskId(command_id)]
    if task.status != "Running":
        return  # already over (cancelled or failed): nothing to send
    instance = state.instances.get(task.instance_id)
    targets = list(instance.shard_assignments.node_to_runner) if instance is not None else []
    for target in targets:
        for piece in split(str(input_stream_id(command_id)), data, INPUT_MIME, 0, 0):
            await node.send_chunk(target, piece)


# ------------------------------------------------------------------ the runner's node


class InputReceiver:
    """Takes the input images of tasks whose runner is on this node and spools them."""

    def __init__(self, node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        self.node = node
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.receiving: dict[str, asyncio.Task[None]] = {}

    def on_task_created(self, task: Any) -> None:
        if not isinstance(task, ImageGenerationTask) or not task.params.input_sha256:
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
        shutil.rmtree(spool_dir(instance_id), ignore_errors=True)

    def close(self) -> None:
        for receiving in list(self.receiving.values()):
            receiving.cancel()

    async def _receive(self, task: ImageGenerationTask, stream: Any) -> None:
        image, error = spool_paths(task.instance_id, task.command_id)
        try:
            data = await self._collect(stream, task.params.input_bytes, task.params.input_sha256 or "")
            await asyncio.to_thread(_write_atomically, image, data)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                image.unlink(missing_ok=True)
            raise
        except InputError as exc:
            log.warning("input image of task %s refused: %s", task.task_id, exc)
            await asyncio.to_thread(_write_atomically, error, str(exc).encode())
        finally:
            self.node.streams.close(input_stream_id(task.command_id))
            self.receiving.pop(task.task_id, None)

    async def _collect(self, stream: Any, expected: int, sha256: str) -> bytes:
        if expected > self.max_bytes:
            raise InputError(f"the input image declares {expected} bytes; this node accepts at most {self.max_bytes}")
        assembler = Assembler(max_bytes=expected)
        try:
            async for chunk in stream:
                if isinstance(chunk, ErrorChunk):
                    raise InputError(f"the input image did not arrive: {chunk.message}")
                if not isinstance(chunk, MediaChunk) or chunk.mime != INPUT_MIME:
                    raise InputError(f"unexpected {type(chunk).__name__} in an input stream")
                assembler.add(chunk)
                if chunk.sha256:
                    break
            ((data, _mime),) = assembler.complete(1)
        except PieceError as exc:
            raise InputError(str(exc)) from None
        if len(data) != expected or hashlib.sha256(data).hexdigest() != sha256:
            raise InputError("the input image does not match the size and SHA-256 its request declared")
        return data


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ------------------------------------------------------------------ inside the runner


def wait_for_input(
    instance_id: str, command_id: str, sha256: str, timeout_s: float, cancelled: Callable[[], bool]
) -> bytes:
    """The verified input of one task (deleted once read); InputError on anything else."""
    image, error = spool_paths(instance_id, command_id)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        if image.is_file():
            data = image.read_bytes()
            image.unlink(missing_ok=True)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise InputError("the spooled input image does not match its SHA-256")
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
