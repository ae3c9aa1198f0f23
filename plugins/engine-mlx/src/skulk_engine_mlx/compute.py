"""One thread owns every MLX call of a runner, and callers wait for it with a timeout.

Why: a collective with a dead peer raises, but one with a hung peer blocks forever inside
MLX's C++ code, where no Python signal reaches it. Running the work on a daemon thread and
waiting with a deadline turns "wedged" into an exception the runner can report. MLX keeps
per-thread default streams, so keeping every graph build and eval on the same thread also
avoids cross-thread stream surprises. After a timeout the thread is considered lost (it may be
blocked forever): the executor refuses further work, and the runner should fail the instance.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class CollectiveTimeout(TimeoutError):
    """An MLX call (usually a collective) did not finish in time: a peer is hung or gone."""


class ComputeLost(RuntimeError):
    """An earlier call timed out; the compute thread may be blocked forever."""


class ComputeThread:
    """A single daemon worker thread with timed, synchronous calls."""

    def __init__(self, name: str = "mlx-compute") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] = queue.SimpleQueue()
        self._lost: str | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def lost(self) -> str | None:
        """Why the thread is unusable, or None."""
        return self._lost

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def call(self, fn: Callable[[], T], timeout_s: float | None, what: str) -> T:
        """Run fn on the compute thread; raise CollectiveTimeout after timeout_s seconds."""
        if self._lost is not None:
            raise ComputeLost(self._lost)
        future: Future[object] = Future()
        self._jobs.put((fn, future))
        try:
            result = future.result(timeout=timeout_s)
        except TimeoutError:
            if future.cancel():  # never started: the thread is busy with something older
                pass
            self._lost = f"{what} did not finish within {timeout_s:g} s"
            raise CollectiveTimeout(self._lost) from None
        return result  # type: ignore[return-value]

    def close(self) -> None:
        if self._lost is None:
            self._jobs.put(None)
