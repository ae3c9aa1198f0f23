"""Audio uploads from the API node to the node that runs the transcription, over the data plane.

A `Transcription` command carries only the audio's SHA-256 and size (`params.audio_sha256`,
`params.audio_bytes`); the bytes follow as `AudioChunk`s with `format="upload"` under the stream id
`<command id>/upload`, are spooled as `<hash>.audio` under `$SKULK_SPEECH_SPOOL` (default
`<temp>/skulk-speech-<uid>`) and read by the runner with `wait_for_upload`. The protocol (when the
API node sends, how the receiver verifies and spools, how the runner waits) is
`skulk_api_control.uploads`; this module is its audio kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_api_control import uploads
from skulk_kernel.api import AudioChunk, CommandId, NodeSurface

PIECE_BYTES = uploads.PIECE_BYTES
UPLOAD_FORMAT = "upload"


class UploadError(uploads.UploadError):
    """The upload did not arrive whole (a wrong size or digest, a timeout, a cancelled task)."""


def _piece(*, whole: bytes, **fields: Any) -> AudioChunk:
    return AudioChunk(format=UPLOAD_FORMAT, **fields)


AUDIO = uploads.UploadKind(
    suffix="upload",
    task_kinds=frozenset({"TranscriptionTask"}),
    declared=lambda task: (task.params.audio_sha256 or "", task.params.audio_bytes),
    make_piece=_piece,
    accepts=lambda chunk: isinstance(chunk, AudioChunk) and chunk.format == UPLOAD_FORMAT,
    spool_env="SKULK_SPEECH_SPOOL",
    spool_folder="skulk-speech",
    file_suffix=".audio",
    error=UploadError,
    noun="upload",
)


def upload_stream_id(command_id: str) -> CommandId:
    return AUDIO.stream_id(command_id)


def spool_dir(instance_id: str) -> Path:
    return AUDIO.spool_dir(instance_id)


def spool_paths(instance_id: str, command_id: str) -> tuple[Path, Path]:
    """(the verified audio, the error note) for one task."""
    return AUDIO.spool_paths(instance_id, command_id)


def pieces(command_id: str, data: bytes) -> list[AudioChunk]:
    return uploads.pieces(AUDIO, command_id, data)


async def send_when_running(node: NodeSurface, command_id: str, data: bytes, timeout: float) -> None:
    """Wait until the task runs, then send the upload to every node holding one of its runners."""
    await uploads.send_when_running(AUDIO, node, command_id, data, timeout)


class UploadReceiver(uploads.Receiver):
    """Takes the uploads of transcription tasks whose runner is on this node and spools them."""

    def __init__(self, node: NodeSurface, max_bytes: int, timeout_s: float) -> None:
        super().__init__(AUDIO, node, max_bytes, timeout_s)


def wait_for_upload(
    instance_id: str, command_id: str, sha256: str, timeout_s: float, cancelled: Callable[[], bool]
) -> bytes:
    """The verified upload of one task (deleted once read); raises UploadError on anything else."""
    return uploads.wait_for_file(AUDIO, instance_id, command_id, sha256, timeout_s, cancelled)
