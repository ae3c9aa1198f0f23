"""Audio uploads from the API node to the node that runs the transcription, over the data plane.

The audio never enters a command, State or the event log: a `Transcription` command carries only
the upload's SHA-256 and size. The bytes follow on the data plane once the master has decided where
the task runs:

1. The API node keeps the upload, submits the command, and waits until the task is `Running` in its
   State (the runner acknowledged it; by then the runner's node applied `TaskCreated` and opened the
   upload stream, so no piece can arrive unrouted).
2. It sends the bytes as `AudioChunk`s (`format="upload"`, 256 KiB each, `seq` 0, 1, ... and a
   terminal piece) addressed to that node on the node-addressed `CHUNKS` topic, under the stream id
   `<command id>/upload` (same node: straight into its stream router).
3. The runner's node (`UploadReceiver`, opened on `TaskCreated`) takes the pieces in sequence
   order, refuses more bytes than the command declared, verifies the size and the SHA-256, and
   writes the file into the instance's spool folder atomically. A failure writes a `.error` file
   saying why instead.
4. The runner subprocess (`wait_for_upload`) waits for one of the two, bounded by
   `upload_timeout_s` and the task's cancel flag, reads the file and deletes it.

The spool is a folder both processes of a node derive from the instance id alone (the runner is the
node's own subprocess on the same filesystem), so no path travels anywhere.
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

from skulk_kernel.api import AudioChunk, CommandId, ErrorChunk, NodeSurface, TaskId, TranscriptionTask

log = logging.getLogger("skulk.speech.uploads")
PIECE_BYTES = 256 * 1024
UPLOAD_FORMAT = "upload"


class UploadError(Exception):
    """The upload did not arrive whole (a wrong size or digest, a timeout, a cancelled task)."""


def upload_stream_id(command_id: str) -> CommandId:
    return CommandId(f"{command_id}/upload")


def spool_dir(instance_id: str) -> Path:
    root = Path(os.environ.get("SKULK_SPEECH_SPOOL") or Path(tempfile.gettempdir()) / f"skulk-speech-{os.getuid()}")
    return root / instance_id


def spool_paths(instance_id: str, command_id: str) -> tuple[Path, Path]:
    """(the verified audio, the error note) for one task."""
    name = hashlib.sha256(command_id.encode()).hexdigest()[:32]
    folder = spool_dir(instance_id)
    return folder / f"{name}.audio", folder / f"{name}.error"


# ------------------------------------------------------------------ the API node's side


def pieces(command_id: str, data: bytes) -> list[AudioChunk]:
    stream = upload_stream_id(command_id)
    count = max(1, -(-len(data) // PIECE_BYTES))
    return [
        AudioChunk(
            command_id=stream,
            seq=i,
            data=base64.b64encode(data[i * PIECE_BYTES : (i + 1) * PIECE_BYTES]).decode("ascii"),
            format=UPLOAD_FORMAT,
            finish_reason="stop" if i == count - 1 else None,
        )
        for i in range(count)
    ]


async def send_when_running(node: NodeSurface, command_id: str, data: bytes, timeout: float) -> None:
    """Wait until the task runs, then send the upload to every node holding one of its runners."""

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
        for piece in pieces(command_id, data):
            await node.send_chunk(target, piece)


# ------------------------------------------------------------------ the runner node's side


class UploadReceiver:
    """Takes the uploads of transcription tasks whose runner is on this node and spools them."""

    def __init__(self, node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        self.node = node
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.receiving: dict[str, asyncio.Task[None]] = {}

    def on_task_created(self, task: Any) -> None:
        if not isinstance(task, TranscriptionTask):
            return
        instance = self.node.state.instances.get(task.instance_id)
        if instance is None or self.node.node_id not in instance.shard_assignments.node_to_runner:
            return
        stream = self.node.streams.open(upload_stream_id(task.command_id), idle_timeout=self.timeout_s)
        self.receiving[task.task_id] = self.node.spawn(self._receive(task, stream), f"upload-{task.task_id[:8]}")

    def on_task_deleted(self, task_id: str) -> None:
        receiving = self.receiving.pop(task_id, None)
        if receiving is not None and not receiving.done():
            receiving.cancel()

    def on_instance_deleted(self, instance_id: str) -> None:
        shutil.rmtree(spool_dir(instance_id), ignore_errors=True)

    async def _receive(self, task: TranscriptionTask, stream: Any) -> None:
        audio, error = spool_paths(task.instance_id, task.command_id)
        expected = task.params.audio_bytes
        try:
            data = await self._collect(stream, expected)
            digest = hashlib.sha256(data).hexdigest()
            if digest != task.params.audio_sha256:
                raise UploadError(f"the upload's SHA-256 is {digest}, the request declared {task.params.audio_sha256}")
            await asyncio.to_thread(_write_atomically, audio, data)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                audio.unlink(missing_ok=True)
            raise
        except UploadError as exc:
            log.warning("upload of task %s refused: %s", task.task_id, exc)
            await asyncio.to_thread(_write_atomically, error, str(exc).encode())
        finally:
            self.node.streams.close(upload_stream_id(task.command_id))
            self.receiving.pop(task.task_id, None)

    async def _collect(self, stream: Any, expected: int) -> bytes:
        if expected > self.max_bytes:
            raise UploadError(f"the upload declares {expected} bytes; this node accepts at most {self.max_bytes}")
        hold: list[bytes] = []
        size = 0
        async for chunk in stream:
            if isinstance(chunk, ErrorChunk):
                raise UploadError(f"the upload did not arrive: {chunk.message}")
            if not isinstance(chunk, AudioChunk) or chunk.format != UPLOAD_FORMAT:
                raise UploadError(f"unexpected {type(chunk).__name__} in an upload stream")
            piece = base64.b64decode(chunk.data)
            size += len(piece)
            if size > expected:
                raise UploadError(f"the upload is longer than the {expected} bytes it declared")
            hold.append(piece)
            if chunk.finish_reason is not None:
                break
        if size != expected:
            raise UploadError(f"the upload ended after {size} of {expected} bytes")
        return b"".join(hold)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ------------------------------------------------------------------ inside the runner


def wait_for_upload(
    instance_id: str, command_id: str, sha256: str, timeout_s: float, cancelled: Callable[[], bool]
) -> bytes:
    """The verified upload of one task (deleted once read); raises UploadError on anything else."""
    audio, error = spool_paths(instance_id, command_id)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        if audio.is_file():
            data = audio.read_bytes()
            audio.unlink(missing_ok=True)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise UploadError("the spooled upload does not match its SHA-256")
            return data
        if error.is_file():
            message = error.read_text(errors="replace")
            error.unlink(missing_ok=True)
            raise UploadError(message)
        if cancelled():
            raise UploadError("cancelled while waiting for the upload")
        if time.monotonic() > deadline:
            raise UploadError(f"the upload did not arrive within {timeout_s:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
