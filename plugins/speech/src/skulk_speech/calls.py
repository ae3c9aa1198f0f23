"""The API side of one speech request: send the command, ship the upload, await the first chunk.

Mirrors api-control's `dispatch.generate` (the stream is opened before the command is sent; early
errors become HTTP statuses; the handle is api-control's own `InferenceHandle`, so closing,
cancelling and FinishTask work exactly as for text) and adds the one thing speech needs: a
transcription's audio follows its command on the data plane (`uploads.send_when_running`).
Middleware (`wrap_inference`) is written against text requests and is not applied to speech.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from skulk_api_control.dispatch import InferenceError, InferenceHandle, start
from skulk_api_control.on_demand import model_for
from skulk_kernel.api import (
    CommandId,
    NodeSurface,
    SpeechParams,
    SpeechSynthesis,
    Transcription,
    new_id,
)

from .uploads import send_when_running

FIRST_CHUNK_TIMEOUT_S = 600.0
log = logging.getLogger("skulk.speech")

# error codes that arrive as the first chunk but belong before the response: code -> HTTP status
EARLY_ERRORS = {
    "invalid_request": 400,
    "unknown_voice": 400,
    "empty_input": 400,
    "invalid_audio": 400,
    "unsupported_task": 400,
    "model_not_placed": 404,
    "instance_not_ready": 503,
    "instance_gone": 503,
    "master_changed": 503,
    "node_gone": 503,
    "runner_crashed": 503,
    "upload_failed": 502,
}


async def _start(node: NodeSurface, command: SpeechSynthesis | Transcription, upload: bytes | None) -> InferenceHandle:
    """The API host's start path; an upload is sent to the runner's node once the task runs."""

    async def send_upload() -> None:
        assert upload is not None
        await send_when_running(node, command.command_id, upload, FIRST_CHUNK_TIMEOUT_S)

    return await start(
        node,
        command,
        early_errors=EARLY_ERRORS,
        while_waiting=send_upload if upload is not None else None,
        observe=False,
    )


async def synthesize(node: NodeSurface, params: SpeechParams, place_on_request: bool = False) -> InferenceHandle:
    model_id = await model_for(node, params.model_id, "SpeechSynthesis", place_on_request)
    command = SpeechSynthesis(
        command_id=CommandId(new_id()),
        owner_node_id=node.node_id,
        params=params.model_copy(update={"model_id": model_id}),
    )
    return await _start(node, command, None)


async def transcribe(
    node: NodeSurface, params: SpeechParams, audio: bytes, place_on_request: bool = False
) -> InferenceHandle:
    """Send a Transcription whose command names the audio by digest and size; the bytes follow."""
    model_id = await model_for(node, params.model_id, "Transcription", place_on_request)
    params = params.model_copy(
        update={"model_id": model_id, "audio_sha256": hashlib.sha256(audio).hexdigest(), "audio_bytes": len(audio)}
    )
    command = Transcription(command_id=CommandId(new_id()), owner_node_id=node.node_id, params=params)
    return await _start(node, command, audio)


def describe(exc: BaseException) -> dict[str, Any]:
    """An exception as an OpenAI-style error object (for SSE and WebSocket error events)."""
    if isinstance(exc, InferenceError):
        return {"message": exc.message, "type": exc.error_type, "code": exc.code, "param": exc.param}
    return {"message": f"internal error: {type(exc).__name__}", "type": "server_error", "code": None, "param": None}
