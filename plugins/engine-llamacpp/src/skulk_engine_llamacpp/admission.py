"""An aggregate token-reservation gate in front of llama.cpp's parallel slots.

Why: with a unified KV cache the slots share one pool of ``n_ctx`` cells. Each request may use all
of it alone, but a burst of long requests together would run the pool out mid-generation, and
llama.cpp then fails (or shifts the context of) requests that were already streaming. So each
request reserves its prompt plus its whole output budget before it starts, and waits, first come
first served, until that fits what the running requests have not reserved. FIFO order keeps a large
reservation from starving behind a stream of small ones. A request that alone needs more than the
pool reserves the whole pool (it runs by itself; the runner has already refused one over the
model's context limit).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: the output budget of a request that names no max_tokens (it is also sent to the engine as the
#: limit, so the reservation holds)
DEFAULT_MAX_TOKENS = 4096


class TokenGate:
    """FIFO admission by tokens: ``with gate.reserve(n, cancelled):`` blocks until ``n`` fit."""

    def __init__(self, pool: int, poll_s: float = 0.05) -> None:
        self.pool = max(1, pool)
        self.poll_s = poll_s
        self.reserved = 0
        self.running = 0
        self.peak = 0
        self._queue: deque[int] = deque()
        self._tickets = itertools.count()
        self._cond = threading.Condition()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @contextmanager
    def reserve(self, tokens: int, cancelled: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Hold ``tokens`` (capped at the pool) while the block runs; yields False (holding nothing)
        when ``cancelled()`` became true while waiting."""
        need = min(max(1, tokens), self.pool)
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                while self._queue[0] != ticket or self.reserved + need > self.pool:
                    if cancelled():
                        break
                    self._cond.wait(self.poll_s)
                else:
                    ticket = -1  # admitted
            finally:
                if ticket >= 0:
                    self._queue.remove(ticket)
                    self._cond.notify_all()
                else:
                    self._queue.popleft()
                    self.reserved += need
                    self.running += 1
                    self.peak = max(self.peak, self.reserved)
                    self._cond.notify_all()
        if ticket >= 0:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self.reserved -= need
                self.running -= 1
                self._cond.notify_all()
