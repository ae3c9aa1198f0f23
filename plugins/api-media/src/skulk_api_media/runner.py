"""One video job in the background: send the command, follow its chunks, land the file.

This is api-control's one start path (`dispatch.start`, the same as every request), called from
here: it opens the stream before the command is sent and waits for the first chunk. Progress chunks
move the job's progress; the file's pieces go through a `MediaAssembler` (bounded, verified); an
error chunk, an early error, a wrong or oversized file all end in `JobStore.finish`. A cancel (or
delete) cancels this task: the handle's close then sends `CancelTask`, which reaches the runner as
its cancelled flag, and the job is marked cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from skulk_api_control.dispatch import InferenceError, start
from skulk_kernel.api import ErrorChunk, MediaChunk, NodeSurface, ProgressChunk, VideoGeneration

from .assembly import AssemblyError, MediaAssembler
from .jobs import Job, JobStore

log = logging.getLogger("skulk.media.jobs")

# first-chunk error codes answered as job failures (a job has no HTTP status once it is accepted)
EARLY_ERRORS: dict[str, int] = {
    "invalid_request": 400,
    "model_not_placed": 404,
    "instance_not_ready": 503,
    "instance_gone": 503,
    "master_changed": 503,
    "node_gone": 503,
    "runner_crashed": 503,
}


async def run_job(
    node: NodeSurface,
    store: JobStore,
    job: Job,
    command: VideoGeneration,
    max_bytes: int,
    upload: tuple[bytes, str] | None = None,
) -> None:
    handle: Any = None
    try:
        beside = None
        if upload is not None:
            from .inputs import send_when_running

            data, mime = upload

            async def beside_upload() -> None:
                await send_when_running(node, command.command_id, data, mime, 60.0)

            beside = beside_upload
        try:
            handle = await start(node, command, early_errors=EARLY_ERRORS, while_waiting=beside, observe=False)
        except InferenceError as exc:
            store.finish(job, "failed", exc.code or "generation_failed", exc.message)
            return
        job.assembler = MediaAssembler(store.path_for(job.id), max_bytes)
        async for chunk in handle.chunks():
            if isinstance(chunk, ProgressChunk):
                store.progress(job, chunk.done, chunk.total, chunk.stage)
            elif isinstance(chunk, MediaChunk):
                if job.status == "queued":
                    job.status = "in_progress"
                if job.assembler.add(chunk):
                    store.complete(job, job.assembler.target, job.assembler.size, job.assembler.sha256())
            elif isinstance(chunk, ErrorChunk):
                store.finish(job, "failed", chunk.code or "generation_failed", chunk.message)
            elif chunk.finish_reason == "cancelled":
                store.finish(job, "cancelled")
            elif chunk.finish_reason is not None and not job.ended:
                store.finish(job, "failed", "no_output", "the engine ended without sending a video")
        if not job.ended:
            store.finish(job, "failed", "no_output", "the stream ended without a video")
    except AssemblyError as exc:
        store.finish(job, "failed", "bad_output", str(exc))
    except asyncio.CancelledError:
        store.finish(job, "cancelled")
        raise
    except Exception as exc:  # a bug here must fail the job, not leave it in progress forever
        log.exception("video job %s failed", job.id)
        store.finish(job, "failed", "server_error", f"{type(exc).__name__}: {exc}")
    finally:
        if handle is not None:  # FinishTask after the terminal chunk, else CancelTask (the render stops)
            await asyncio.shield(handle.close())
