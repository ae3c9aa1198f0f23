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
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: the output budget of a request that names no max_tokens (it is also sent to the engine as the
#: limit, so the reservation holds)
DEFAULT_MAX_TOKENS = 4096


class TokenGate:
    """FIFO admission by tokens (and at most ``max_running`` at once: llama.cpp's slots, so nobody
    waits silently in llama.cpp's own queue). ``with gate.reserve(n, cancelled):`` blocks until
    ``n`` fit; ``enqueue`` / ``admit`` / ``leave`` / ``release`` let a caller wait in steps (and
    send keep-alives meanwhile)."""

    def __init__(self, pool: int, poll_s: float = 0.05, max_running: int | None = None) -> None:
        self.pool = max(1, pool)
        self.poll_s = poll_s
        self.max_running = max_running
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

    def need(self, tokens: int) -> int:
        return min(max(1, tokens), self.pool)

    def enqueue(self) -> int:
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            return ticket

    def _fits(self, ticket: int, need: int) -> bool:
        full = self.max_running is not None and self.running >= self.max_running
        return self._queue[0] == ticket and self.reserved + need <= self.pool and not full

    def admit(self, ticket: int, need: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for this ticket's turn; True: admitted (call ``release`` later)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._fits(ticket, need):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, self.poll_s))
            self._queue.popleft()
            self.reserved += need
            self.running += 1
            self.peak = max(self.peak, self.reserved)
            self._cond.notify_all()
            return True

    def leave(self, ticket: int) -> None:
        """Give up a ticket that was never admitted."""
        with self._cond:
            if ticket in self._queue:
                self._queue.remove(ticket)
            self._cond.notify_all()

    def release(self, need: int) -> None:
        with self._cond:
            self.reserved -= need
            self.running -= 1
            self._cond.notify_all()

    @contextmanager
    def reserve(self, tokens: int, cancelled: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Hold ``tokens`` (capped at the pool) while the block runs; yields False (holding nothing)
        when ``cancelled()`` became true while waiting."""
        need = self.need(tokens)
        ticket = self.enqueue()
        try:
            while not self.admit(ticket, need, self.poll_s):
                if cancelled():
                    self.leave(ticket)
                    yield False
                    return
        except BaseException:
            self.leave(ticket)
            raise
        try:
            yield True
        finally:
            self.release(need)
