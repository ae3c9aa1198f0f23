"""Bytes a request brings along (an audio file to transcribe, an input image to edit), carried from
the API node to the node that runs the task over the data plane: one protocol, several kinds.

The bytes never enter a command, State or the event log: the task's params carry only their SHA-256
and size. The bytes follow once the master has decided where the task runs:

1. The API node keeps the bytes, submits the command, and waits until the task is `Running` in its
   State (`send_when_running`). By then the runner acknowledged the task, so its node has applied
   `TaskCreated` and opened the stream: no piece can arrive unrouted. A task that ended before it
   ran gets nothing.
2. It sends the bytes as chunks of 256 KiB (`pieces`: `seq` 0, 1, ..., `finish_reason` on the last,
   an empty upload is one empty piece) to every node holding a runner of the task's instance, on
   the node-addressed `CHUNKS` topic, under the stream id `<command id>/<kind suffix>`.
3. On the runner's node a `Receiver` opens that stream on `TaskCreated`, takes the pieces in
   sequence order (the stream reorders them), refuses more bytes than the task declared (before
   holding them), verifies the size and the SHA-256, and writes the file atomically into the spool
   folder; any failure writes a `.error` note saying why instead, so the runner never waits out
   its timeout for bytes that will not come.
4. Inside the runner subprocess `wait_for_file` polls for the file or the note, bounded by a timeout
   and the task's cancel flag, reads the file, checks its digest again and deletes it.

The spool folder is `<root>/<instance id>/<first 32 hex of sha256(command id)>.<suffix>`: both
processes of a node derive it from ids alone (the runner is the node's own subprocess on the same
filesystem), so no path travels anywhere, and a command id cannot name a path. The root comes from
an environment variable or defaults to a per-user folder in the temp directory; the instance's
folder goes when the instance is deleted.

What differs between kinds (the chunk type and its fields, which tasks bring bytes and where they
declare them, the spool names, the wording and the exception class) is an `UploadKind`; the speech
plugin's `uploads.py` and api-media's `inputs.py` each define one and keep their public names.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from skulk_kernel.api import Chunk, CommandId, ErrorChunk, NodeSurface, ServiceKey, TaskId

log = logging.getLogger("skulk.api_control.uploads")
PIECE_BYTES = 256 * 1024
C = TypeVar("C", bound=Chunk)


class UploadError(Exception):
    """The bytes did not arrive whole (a wrong size or digest, a timeout, a cancelled task); each
    kind raises its own subclass so a plugin catches only its own."""


@dataclass(frozen=True)
class UploadKind(Generic[C]):
    """One kind of upload: what travels, for which tasks, where it is spooled, how it is worded."""

    suffix: str
    """The stream id is `<command id>/<suffix>`."""
    task_kinds: frozenset[str]
    """Class names of the tasks whose runner receives this kind."""
    declared: Callable[[Any], tuple[str, int] | None]
    """A task's declared (SHA-256, size), or None when it brings no bytes."""
    make_piece: Callable[..., C]
    """`make_piece(command_id=, seq=, data=, finish_reason=, whole=, **piece_args)`: one piece (`data`
    is its base64, `whole` all the bytes, for fields only the last piece carries)."""
    accepts: Callable[[Any], bool]
    """Whether a received (non-error) chunk is a piece of this kind."""
    spool_env: str
    """The environment variable that names the spool root."""
    spool_folder: str
    """The default root is `<temp dir>/<spool_folder>-<uid>`."""
    file_suffix: str
    """The verified file's suffix, e.g. `.audio`."""
    error: type[UploadError]
    noun: str
    """How messages call the bytes ("the upload declares ...")."""
    waited_noun: str = ""
    """How the runner's timeout and cancel messages call them (default: `noun`)."""
    digest: Callable[[bytes], str] = lambda data: hashlib.sha256(data).hexdigest()
    """What the declared digest is of the bytes (a bundle of several files digests its parts)."""

    def stream_id(self, command_id: str) -> CommandId:
        return CommandId(f"{command_id}/{self.suffix}")

    def spool_dir(self, instance_id: str) -> Path:
        default = Path(tempfile.gettempdir()) / f"{self.spool_folder}-{os.getuid()}"
        return Path(os.environ.get(self.spool_env) or default) / instance_id

    def spool_paths(self, instance_id: str, command_id: str) -> tuple[Path, Path]:
        """(the verified file, the error note) of one task, the same in the node and its runner."""
        name = hashlib.sha256(command_id.encode()).hexdigest()[:32]
        folder = self.spool_dir(instance_id)
        return folder / f"{name}{self.file_suffix}", folder / f"{name}.error"


# ------------------------------------------------------------------ the API node's side


def pieces(kind: UploadKind[C], command_id: str, data: bytes, **piece_args: Any) -> list[C]:
    """The bytes as the kind's chunks, 256 KiB each; at least one piece, so the stream always ends."""
    stream = kind.stream_id(command_id)
    count = max(1, -(-len(data) // PIECE_BYTES))
    return [
        kind.make_piece(
            command_id=stream,
            seq=i,
            data=base64.b64encode(data[i * PIECE_BYTES : (i + 1) * PIECE_BYTES]).decode("ascii"),
            finish_reason="stop" if i == count - 1 else None,
            whole=data,
            **piece_args,
        )
        for i in range(count)
    ]


async def send_when_running(
    kind: UploadKind[Any], node: NodeSurface, command_id: str, data: bytes, timeout: float, **piece_args: Any
) -> None:
    """Wait until the task runs, then send the bytes to every node holding one of its runners."""

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
        for piece in pieces(kind, command_id, data, **piece_args):
            await node.send_chunk(target, piece)


# ------------------------------------------------------------------ the runner node's side


class Receiver:
    """Takes the uploads of one kind for the tasks whose runner is on this node and spools them.

    Fed the node's applied events (`on_task_created`, `on_task_deleted`, `on_instance_deleted`);
    idempotent, so several plugins may forward the same events to one shared receiver."""

    def __init__(self, kind: UploadKind[Any], node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        self.kind = kind
        self.node = node
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.receiving: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[str, CommandId] = {}  # task id -> its open stream

    def on_task_created(self, task: Any) -> None:
        if type(task).__name__ not in self.kind.task_kinds or task.task_id in self.receiving:
            return
        declared = self.kind.declared(task)
        if declared is None:
            return
        instance = self.node.state.instances.get(task.instance_id)
        if instance is None or self.node.node_id not in instance.shard_assignments.node_to_runner:
            return
        stream_id = self._streams[task.task_id] = self.kind.stream_id(task.command_id)
        stream = self.node.streams.open(stream_id, idle_timeout=self.timeout_s)
        receive = self._receive(task, stream, *declared)
        self.receiving[task.task_id] = self.node.spawn(receive, f"{self.kind.suffix}-{task.task_id[:8]}")

    def on_task_deleted(self, task_id: str) -> None:
        receiving = self.receiving.pop(task_id, None)
        if receiving is not None and not receiving.done():
            receiving.cancel()
        stream_id = self._streams.pop(task_id, None)
        if stream_id is not None:  # a receive cancelled before it started never closes its stream
            self.node.streams.close(stream_id)

    def on_instance_deleted(self, instance_id: str) -> None:
        shutil.rmtree(self.kind.spool_dir(instance_id), ignore_errors=True)

    def close(self) -> None:
        for task_id in list(self.receiving):
            self.on_task_deleted(task_id)

    async def _receive(self, task: Any, stream: Any, sha256: str, expected: int) -> None:
        kind = self.kind
        done, error = kind.spool_paths(task.instance_id, task.command_id)
        try:
            data = await self._collect(stream, expected)
            digest = kind.digest(data)
            if digest != sha256:
                raise kind.error(f"the {kind.noun}'s SHA-256 is {digest}, the request declared {sha256}")
            await asyncio.to_thread(_write_atomically, done, data)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                done.unlink(missing_ok=True)
            raise
        except UploadError as exc:
            log.warning("%s of task %s refused: %s", kind.noun, task.task_id, exc)
            await asyncio.to_thread(_write_atomically, error, str(exc).encode())
        finally:
            self.node.streams.close(kind.stream_id(task.command_id))
            self.receiving.pop(task.task_id, None)
            self._streams.pop(task.task_id, None)

    async def _collect(self, stream: Any, expected: int) -> bytes:
        kind = self.kind
        if expected > self.max_bytes:
            raise kind.error(f"the {kind.noun} declares {expected} bytes; this node accepts at most {self.max_bytes}")
        hold: list[bytes] = []
        size = 0
        async for chunk in stream:
            if isinstance(chunk, ErrorChunk):
                raise kind.error(f"the {kind.noun} did not arrive: {chunk.message}")
            if not kind.accepts(chunk):
                raise kind.error(f"unexpected {type(chunk).__name__} in an {kind.noun} stream")
            piece = base64.b64decode(chunk.data)
            size += len(piece)
            if size > expected:
                raise kind.error(f"the {kind.noun} is longer than the {expected} bytes it declared")
            hold.append(piece)
            if chunk.finish_reason is not None:
                break
        if size != expected:
            raise kind.error(f"the {kind.noun} ended after {size} of {expected} bytes")
        return b"".join(hold)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write beside and rename: the runner never reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


_RECEIVER_KEYS: dict[str, ServiceKey[Receiver]] = {}  # by kind suffix; keys compare by identity


def _receiver_key(kind: UploadKind[Any]) -> ServiceKey[Receiver]:
    key = _RECEIVER_KEYS.get(kind.suffix)
    if key is None:
        key = _RECEIVER_KEYS[kind.suffix] = ServiceKey(f"api-control.uploads/{kind.suffix}")
    return key


def shared_receiver(kind: UploadKind[Any], node: NodeSurface, max_bytes: int, timeout_s: float) -> Receiver:
    """The node's one receiver of a kind, a service of the node: several plugins on the node may
    take the same kind (every media engine plugin takes input images), and two receivers would both
    open a task's stream. The first caller's limits hold."""
    key = _receiver_key(kind)
    found = node.services.get(key)
    if found is None or found.kind is not kind:
        node.services.withdraw(key)
        found = node.services.publish(key, Receiver(kind, node, max_bytes, timeout_s))
    return found


def forward_event(kind: UploadKind[Any], node: NodeSurface, event: Any) -> None:
    """A plugin's on_event_applied: hand the shared receiver the events it follows (none before
    `shared_receiver` made it)."""
    receiver = node.services.get(_receiver_key(kind))
    if receiver is None:
        return
    name = type(event).__name__
    if name == "TaskCreated":
        receiver.on_task_created(event.task)
    elif name == "TaskDeleted":
        receiver.on_task_deleted(event.task_id)
    elif name == "InstanceDeleted":
        receiver.on_instance_deleted(event.instance_id)


def close_receiver(kind: UploadKind[Any], node: NodeSurface) -> None:
    """A plugin's shutdown: stop the shared receiver (the first plugin to shut down does)."""
    receiver = node.services.withdraw(_receiver_key(kind))
    if receiver is not None:
        receiver.close()


# ------------------------------------------------------------------ inside the runner


def wait_for_file(
    kind: UploadKind[Any],
    instance_id: str,
    command_id: str,
    sha256: str,
    timeout_s: float,
    cancelled: Callable[[], bool],
) -> bytes:
    """The verified bytes of one task (deleted once read); raises the kind's error on anything else.

    Blocking, for the runner's engine thread: it polls (5 ms, doubling to 50 ms) rather than watch
    the folder, which is cheap for one file and works on every filesystem."""
    done, error = kind.spool_paths(instance_id, command_id)
    waited = kind.waited_noun or kind.noun
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        if done.is_file():
            data = done.read_bytes()
            done.unlink(missing_ok=True)
            if kind.digest(data) != sha256:
                raise kind.error(f"the spooled {kind.noun} does not match its SHA-256")
            return data
        if error.is_file():
            message = error.read_text(errors="replace")
            error.unlink(missing_ok=True)
            raise kind.error(message)
        if cancelled():
            raise kind.error(f"cancelled while waiting for the {waited}")
        if time.monotonic() > deadline:
            raise kind.error(f"the {waited} did not arrive within {timeout_s:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
