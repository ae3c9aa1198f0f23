"""The always-on flight recorder: the last phase changes of every runner, with its memory.

When a runner wedges, its last phases say where: a task that reached `prefill` and never
`first_token` is stuck in the engine's prompt processing. Each change carries the runner process's
resident memory (psutil RSS) at that moment, so a leak or a load that ate the machine shows too.
In memory only, bounded per runner (`depth`, 128 by default): recording is a deque append.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict


class PhaseChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    at: float  # wall clock, seconds
    runner_id: str
    phase: str
    pid: int | None = None
    rss_bytes: int | None = None
    task_id: str | None = None
    detail: str = ""

    def wire(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "runnerId": self.runner_id,
            "phase": self.phase,
            "pid": self.pid,
            "rssBytes": self.rss_bytes,
            "taskId": self.task_id,
            "detail": self.detail,
        }


def rss_of(pid: int | None) -> int | None:
    """Resident memory of `pid` in bytes, or None when it is gone or unreadable."""
    if pid is None:
        return None
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


class FlightRecorder:
    def __init__(self, depth: int = 128, max_runners: int = 64) -> None:
        self.depth = depth
        self.max_runners = max_runners
        self._runners: dict[str, deque[PhaseChange]] = {}
        self._models: dict[str, str] = {}

    def record(
        self,
        runner_id: str,
        phase: str,
        *,
        pid: int | None = None,
        task_id: str | None = None,
        detail: str = "",
        model_id: str | None = None,
        at: float | None = None,
    ) -> PhaseChange:
        ring = self._runners.get(runner_id)
        if ring is None:
            if len(self._runners) >= self.max_runners:  # forget the runner heard from least recently
                oldest = min(self._runners, key=lambda r: self._runners[r][-1].at if self._runners[r] else 0.0)
                self._runners.pop(oldest)
                self._models.pop(oldest, None)
            ring = self._runners[runner_id] = deque(maxlen=self.depth)
        if model_id:
            self._models[runner_id] = model_id
        change = PhaseChange(
            at=at if at is not None else time.time(),
            runner_id=runner_id,
            phase=phase,
            pid=pid,
            rss_bytes=rss_of(pid),
            task_id=task_id,
            detail=detail,
        )
        ring.append(change)
        return change

    def phases(self, runner_id: str) -> list[PhaseChange]:
        return list(self._runners.get(runner_id, ()))

    def all_phases(self) -> list[PhaseChange]:
        return sorted((c for ring in self._runners.values() for c in ring), key=lambda c: c.at)

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        """Per runner: its last phases, and how long since the last change (a wedge shows here)."""
        now = now if now is not None else time.time()
        out = []
        for runner_id, ring in self._runners.items():
            last = ring[-1] if ring else None
            out.append(
                {
                    "runnerId": runner_id,
                    "modelId": self._models.get(runner_id),
                    "lastPhase": last.phase if last else None,
                    "sinceLastChangeS": round(now - last.at, 3) if last else None,
                    "phases": [c.wire() for c in ring],
                }
            )
        return out
