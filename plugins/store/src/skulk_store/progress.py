"""Download progress: a line in the node's log and a `DownloadProgress` telemetry reading.

The reading carries the total in `downloaded_bytes`/`total_bytes` and each file's bytes in
`phase` (`name done/total` items, at most eight, so a reading stays small); it is published on the
telemetry plane, so every node's `/state` shows it under `downloadProgress`. The log line comes
at most every five seconds (and at the end), with the rate since the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("skulk.store.progress")
MAX_FILES_IN_PHASE = 8
LOG_EVERY_S = 5.0


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


class ProgressReporter:
    def __init__(
        self, model_id: str, total: dict[str, int], emit: Callable[[int, int, str], None], verb: str = "downloading"
    ) -> None:
        self.model_id = model_id
        self.total = total
        self.total_bytes = sum(total.values())
        self.emit = emit
        self.verb = verb
        self.began = time.monotonic()
        self._last_log = 0.0

    def phase(self, per_file: dict[str, int]) -> str:
        items = [
            f"{name} {per_file.get(name, 0)}/{size}" for name, size in list(self.total.items())[:MAX_FILES_IN_PHASE]
        ]
        more = len(self.total) - MAX_FILES_IN_PHASE
        return f"{self.verb}: " + "; ".join(items) + (f"; +{more} files" if more > 0 else "")

    def update(self, per_file: dict[str, int], extra: Callable[..., Any] | None = None, done: bool = False) -> None:
        got = min(sum(per_file.values()), self.total_bytes) if self.total_bytes else sum(per_file.values())
        phase = self.phase(per_file)
        self.emit(got, self.total_bytes, phase)
        if extra is not None:  # the worker logs each new phase: give it one that changes per stage only
            extra(got, self.total_bytes, f"{self.verb} {', '.join(list(self.total)[:MAX_FILES_IN_PHASE])}")
        now = time.monotonic()
        if done or now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            pct = 100.0 * got / self.total_bytes if self.total_bytes else 100.0
            rate = got / max(now - self.began, 1e-6)
            bar = "#" * int(pct / 5) + "." * (20 - int(pct / 5))
            log.info(
                "%s %s [%s] %5.1f%% %s/%s MB (%s MB/s)%s",
                self.verb,
                self.model_id,
                bar,
                pct,
                _mb(got),
                _mb(self.total_bytes),
                _mb(int(rate)),
                " done" if done else "",
            )
