"""The job store of one API node: a record per video job, its file, and their expiry.

A render takes minutes, so the API answers `POST /v1/videos` at once with a job and runs the request
in the background (`runner.run_job`). The store is the only place a job's state changes:

    queued -> in_progress -> completed            (the file is verified and in place)
                          -> failed | cancelled   (through `finish`, the one cleanup path)

`finish` is where every ending goes, whichever part failed first: it deletes a partial or
unverified file, records the reason, and stamps the time. Jobs (and their files) expire
`job_ttl_s` after they were created; `sweep` removes them, and the oldest finished jobs make room
when the store is full. Records live in memory: a restarted API node starts with no jobs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .assembly import MediaAssembler

JobStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]
ENDED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@dataclass
class JobError:
    code: str
    message: str

    def wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass
class Job:
    id: str
    model: str
    prompt: str
    size: str
    seconds: float
    frames: int
    fps: int
    created_at: float
    expires_at: float
    status: JobStatus = "queued"
    progress: int = 0
    stage: str = ""
    completed_at: float | None = None
    error: JobError | None = None
    file: Path | None = None
    file_bytes: int = 0
    sha256: str = ""
    first_progress_at: float | None = None
    task: asyncio.Task[Any] | None = field(default=None, repr=False)
    assembler: MediaAssembler | None = field(default=None, repr=False)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def wire(self) -> dict[str, Any]:
        """OpenAI's `Video` object (plus Skulk's `stage` and `frames`)."""
        seconds = int(self.seconds) if float(self.seconds).is_integer() else self.seconds
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "completed_at": int(self.completed_at) if self.completed_at else None,
            "expires_at": int(self.expires_at),
            "prompt": self.prompt,
            "seconds": str(seconds),
            "size": self.size,
            "remixed_from_video_id": None,
            "error": self.error.wire() if self.error else None,
            "stage": self.stage,
            "frames": self.frames,
        }


class StoreFull(Exception):
    """No room for another active job (the message says how many run)."""


class JobStore:
    def __init__(self, root: Path, ttl_s: float, max_jobs: int, max_active: int) -> None:
        self.root = root
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self.max_active = max_active
        self.jobs: dict[str, Job] = {}

    def add(self, job: Job) -> None:
        active = sum(1 for j in self.jobs.values() if not j.ended)
        if active >= self.max_active:
            raise StoreFull(f"{active} video jobs are already queued or running here (the limit); retry later")
        while len(self.jobs) >= self.max_jobs:
            oldest = min((j for j in self.jobs.values() if j.ended), key=lambda j: j.created_at, default=None)
            if oldest is None:
                raise StoreFull(f"the job store holds {len(self.jobs)} jobs (the limit); delete some")
            self.remove(oldest.id)
        self.jobs[job.id] = job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def listing(self, *, order: str = "desc", after: str | None = None, limit: int = 20) -> tuple[list[Job], bool]:
        jobs = sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id), reverse=order == "desc")
        if after is not None:
            ids = [j.id for j in jobs]
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        return jobs[:limit], len(jobs) > limit

    def path_for(self, job_id: str) -> Path:
        return self.root / f"{job_id}.mp4"

    def progress(self, job: Job, done: int, total: int, stage: str) -> None:
        """Progress 0-99 while rendering (100 only once the file is verified); never goes back."""
        if job.ended:
            return
        if job.first_progress_at is None:
            job.first_progress_at = time.time()
        job.status = "in_progress"
        job.stage = stage
        if total > 0:
            job.progress = max(job.progress, min(99, int(99 * done / total)))

    def complete(self, job: Job, path: Path, size: int, sha256: str) -> None:
        job.status = "completed"
        job.progress = 100
        job.stage = "done"
        job.file, job.file_bytes, job.sha256 = path, size, sha256
        job.completed_at = time.time()
        job.assembler = None

    def finish(self, job: Job, status: JobStatus, code: str = "", message: str = "") -> None:
        """The one cleanup path of every job that did not complete: the file goes, the reason stays."""
        if job.ended:
            return
        if job.assembler is not None:
            job.assembler.discard()
            job.assembler = None
        self.path_for(job.id).unlink(missing_ok=True)
        job.status = status
        job.stage = status
        job.completed_at = time.time()
        if status == "failed":
            job.error = JobError(code=code or "generation_failed", message=message or "the render failed")

    def remove(self, job_id: str) -> Job | None:
        """Forget a job and delete its file; a running job's task is cancelled (see `runner`)."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        if job.task is not None and not job.task.done():
            job.task.cancel()
        if job.assembler is not None:
            job.assembler.discard()
        self.path_for(job_id).unlink(missing_ok=True)
        return job

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove every job past its expiry (with its file); the ids removed."""
        now = time.time() if now is None else now
        expired = [j.id for j in self.jobs.values() if j.expires_at <= now]
        for job_id in expired:
            self.remove(job_id)
        return expired
