"""An input image (`input_reference`) from the API node to the node that renders, on the data plane.

`MediaParams` carries only the image's SHA-256 and size (`input_sha256`, `input_bytes`) of an
image or video task; the bytes follow as `MediaChunk` pieces (the digest on the last) under the
stream id `<command id>/input`, are spooled as `<hash>.input` under `$SKULK_MEDIA_SPOOL` (default
`<temp>/skulk-media-<uid>`) and read by the runner's engine with `wait_for_input`. The protocol is
`skulk_api_control.uploads`; this module is its input-image kind. One receiver per node
(`shared_receiver`) serves every media engine plugin there; each forwards its events
(`forward_event`) and the first to shut down closes it (`close_receiver`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_api_control import uploads
from skulk_kernel.api import CommandId, MediaChunk, NodeSurface

PIECE_BYTES = uploads.PIECE_BYTES
MEDIA_TASKS = ("ImageGenerationTask", "VideoGenerationTask")


class InputError(uploads.UploadError):
    """The input did not arrive whole (size, digest, timeout, cancelled)."""


def _piece(*, whole: bytes, mime: str, **fields: Any) -> MediaChunk:
    digest = hashlib.sha256(whole).hexdigest() if fields["finish_reason"] is not None else ""
    return MediaChunk(mime=mime, sha256=digest, **fields)


INPUT = uploads.UploadKind(
    suffix="input",
    task_kinds=frozenset(MEDIA_TASKS),
    declared=lambda task: (task.params.input_sha256, task.params.input_bytes) if task.params.input_sha256 else None,
    make_piece=_piece,
    accepts=lambda chunk: isinstance(chunk, MediaChunk),
    spool_env="SKULK_MEDIA_SPOOL",
    spool_folder="skulk-media",
    file_suffix=".input",
    error=InputError,
    noun="input",
    waited_noun="input image",
)


def input_stream_id(command_id: str) -> CommandId:
    return INPUT.stream_id(command_id)


def spool_paths(instance_id: str, command_id: str) -> tuple[Path, Path]:
    """(the verified input, the error note) of one task, the same in the node and its runner."""
    return INPUT.spool_paths(instance_id, command_id)


def pieces(command_id: str, data: bytes, mime: str) -> list[MediaChunk]:
    return uploads.pieces(INPUT, command_id, data, mime=mime)


async def send_when_running(node: NodeSurface, command_id: str, data: bytes, mime: str, timeout: float) -> None:
    """Wait until the task runs, then send the input to every node holding one of its runners."""
    await uploads.send_when_running(INPUT, node, command_id, data, timeout, mime=mime)


class InputReceiver(uploads.Receiver):
    """Takes the inputs of media tasks whose runner is on this node and spools them."""

    def __init__(self, node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        super().__init__(INPUT, node, max_bytes, timeout_s)


def shared_receiver(node: NodeSurface, max_bytes: int, timeout_s: float) -> uploads.Receiver:
    """The node's one receiver of media inputs, shared by every media engine plugin on the node."""
    return uploads.shared_receiver(INPUT, node, max_bytes, timeout_s)


def forward_event(node: NodeSurface, event: Any) -> None:
    """An engine plugin's on_event_applied (idempotent: every media plugin on the node may forward)."""
    uploads.forward_event(INPUT, node, event)


def close_receiver(node: NodeSurface) -> None:
    uploads.close_receiver(INPUT, node)


def wait_for_input(
    instance_id: str, command_id: str, sha256: str, timeout_s: float, cancelled: Callable[[], bool]
) -> bytes:
    """Inside the runner: the verified input of one task (deleted once read), or InputError."""
    return uploads.wait_for_file(INPUT, instance_id, command_id, sha256, timeout_s, cancelled)
