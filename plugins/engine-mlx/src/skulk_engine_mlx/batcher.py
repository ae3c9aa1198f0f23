"""Continuous batching for a single-rank instance: several sequences per forward step.

Why mlx-lm's ``BatchGenerator``: it already keeps one KV cache per sequence, pads and masks the
prompts it prefills together, and steps every generating sequence in one forward pass, with a
sampler and logits processors per sequence. What this module adds is the traffic around it:

* one driver thread runs the loop while any request is active; each tick, on the compute thread,
  inserts the requests that arrived, removes the ones that left (finished, stopped by the session
  or cancelled), and runs one ``next()``: a decode step for every generating sequence plus one
  prefill chunk for those still reading their prompt;
* each request reads its tokens from its own queue (:class:`Lane`) as :class:`StepResult` values,
  the same the multi-rank :class:`~.stepper.Stepper` gives, so the session's text handling (EOS,
  stop strings, tool calls, logprobs) is the same code for both;
* a cancelled request leaves the batch before the next tick and gets a cancelled result at once.

The per-rank protocol of a split instance (``stepper``) stays one sequence per step: its
collective carries one token, so a split instance keeps ``dispatch_width`` 1.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .compute import ComputeThread
from .stepper import Request, StepResult

#: how many requests one single-rank runner admits at once (the runner's dispatch width)
BATCH_WIDTH = 8


@dataclass
class Lane:
    """One request in the batch: what it asked for, and the queue its tokens arrive on."""

    prompt: list[int]
    request: Request
    max_tokens: int
    cancelled: Callable[[], bool]
    results: queue.SimpleQueue[StepResult | BaseException] = field(default_factory=queue.SimpleQueue)
    uid: int | None = None
    left: bool = False

    def next(self) -> StepResult:
        """The next token (blocks until the driver has stepped), or the driver's failure raised."""
        item = self.results.get()
        if isinstance(item, BaseException):
            raise item
        return item


class Batcher:
    """The driver of one ``BatchGenerator`` shared by every request of the session."""

    def __init__(self, model: Any, compute: ComputeThread, prefill_step: int, max_kv_size: int | None) -> None:
        self.model = model
        self.compute = compute
        self.prefill_step = prefill_step
        self.max_kv_size = max_kv_size
        self._generator: Any = None
        self._lock = threading.Lock()
        self._joining: list[Lane] = []
        self._active: dict[int, Lane] = {}
        self._leaving: list[Lane] = []
        self._driver: threading.Thread | None = None
        #: the most sequences one tick has stepped together (tests and the bench read it)
        self.widest = 0

    def join(self, prompt: list[int], request: Request, max_tokens: int, cancelled: Callable[[], bool]) -> Lane:
        lane = Lane(prompt=list(prompt), request=request, max_tokens=max(1, max_tokens), cancelled=cancelled)
        with self._lock:
            self._joining.append(lane)
            if self._driver is None or not self._driver.is_alive():
                self._driver = threading.Thread(target=self._drive, name="mlx-batch", daemon=True)
                self._driver.start()
        return lane

    def leave(self, lane: Lane) -> None:
        """The session is done with this lane (EOS, a stop string, max_tokens, an error)."""
        with self._lock:
            if not lane.left:
                lane.left = True
                self._leaving.append(lane)

    # -- the driver thread ---------------------------------------------------------------------

    def _drive(self) -> None:
        while True:
            with self._lock:
                for lane in self._joining + list(self._active.values()):
                    if not lane.left and lane.cancelled():
                        lane.left = True
                        self._leaving.append(lane)
                        lane.results.put(StepResult(token=-1, logprob=0.0, top=(), cancelled=True))
                joining = [lane for lane in self._joining if not lane.left]
                leaving, self._joining, self._leaving = self._leaving, [], []
                if not joining and not self._active and not leaving:
                    self._driver = None
                    return
            try:
                results = self.compute.call(partial(self._tick, joining, leaving), None, "a batch step")
            except BaseException as exc:  # the whole batch fails together: every lane hears why
                with self._lock:
                    lanes = list(self._active.values()) + joining + self._joining
                    self._active.clear()
                    self._joining = []
                    self._driver = None
                for lane in lanes:
                    lane.results.put(exc)
                return
            for lane, result, _ in results:
                if not lane.left:
                    lane.results.put(result)

    def _tick(self, joining: list[Lane], leaving: list[Lane]) -> list[tuple[Lane, StepResult, bool]]:
        """On the compute thread: admit, drop, step once; each generated token with its lane."""
        import mlx.core as mx

        generator = self._generator_now()
        gone = [lane.uid for lane in leaving if lane.uid is not None and lane.uid in self._active]
        if gone:
            generator.remove(gone)
            for uid in gone:
                self._active.pop(uid, None)
        for lane in joining:
            uid = generator.insert(
                [lane.prompt],
                max_tokens=[lane.max_tokens],
                samplers=[lane.request.sampler],
                logits_processors=[lane.request.processors],
            )[0]
            lane.uid = uid
            self._active[uid] = lane
        if not self._active:
            return []
        _, responses = generator.next()
        self.widest = max(self.widest, len(responses))
        out: list[tuple[Lane, StepResult, bool]] = []
        for response in responses:
            found = self._active.get(response.uid)
            if found is None:
                continue
            lane = found
            row = response.logprobs
            k = lane.request.top_logprobs
            top: tuple[tuple[int, float], ...] = ()
            logprob = 0.0
            if k:
                logprob = float(row[response.token].item())
                ids = mx.argpartition(-row, k - 1)[:k]
                values = mx.take(row, ids)
                lists: Any = (ids.tolist(), values.tolist())
                pairs = zip(*lists, strict=True)
                top = tuple(sorted(((int(i), float(v)) for i, v in pairs), key=lambda t: -t[1]))
            result = StepResult(token=int(response.token), logprob=logprob, top=top, cancelled=False)
            out.append((lane, result, response.finish_reason is not None))
        for lane, _, finished in out:
            if finished and lane.uid is not None:
                self._active.pop(lane.uid, None)
        return out

    def _generator_now(self) -> Any:
        if self._generator is None:
            from mlx_lm.generate import BatchGenerator

            self._generator = BatchGenerator(
                self.model,
                max_tokens=1,
                completion_batch_size=BATCH_WIDTH,
                prefill_batch_size=BATCH_WIDTH,
                prefill_step_size=self.prefill_step,
                max_kv_size=self.max_kv_size,
            )
        return self._generator

    def close(self) -> None:
        """Release the generator (on the compute thread, which owns every MLX object)."""
        generator, self._generator = self._generator, None
        if generator is not None and self.compute.lost is None:
            self.compute.call(generator.close, 30.0, "closing the batch generator")
