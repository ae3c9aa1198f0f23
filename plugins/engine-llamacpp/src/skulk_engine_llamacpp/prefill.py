"""A long prompt evaluated in short steps the caller can stop between, and one tokenization per request.

Why steps: llama.cpp's server does not stop evaluating a prompt when its client goes away (measured
with this xllamacpp build: a 5,000-token prompt whose connection was shut down, closed, or cancelled
through ``DELETE /v1/stream`` 3 s in was evaluated to its end, 15-35 s on a loaded 2-core box; a
decoding stream does stop). An SDK that times out and retries thus leaves whole prompts evaluating
behind the requests that come after it: two 5,000-token prompts sent with a 5 s timeout and two
retries kept a short request from its first token for over 120 s. So a prompt longer than
``STEP_MIN`` tokens is sent first as growing prefixes of its token ids, each with ``n_predict: 0``
(llama.cpp evaluates it into the slot's cache and answers at once); the generating request then
finds all but its last step cached. Between steps the caller's cancel is checked, so an abandoned
prompt stops within one step, and other requests' tasks enter llama.cpp's loop between steps instead
of after the whole prompt. Each step is sized from the last one's measured speed to take about
``STEP_TARGET_S``: at least ``FIRST_STEP`` tokens where the engine is fast enough for that to take
at most twice the target (narrow steps prefill slower), else at least ``MIN_STEP``, so that on a
slow or loaded box too a cancel waits about a second, not a 128-token step (measured in CI beside
other model suites: 3 s a step, a short request 7 s late). The first step of a prompt is sized from
the last prompt's speed on the same server.

Why a memo: the runner counts a request's prompt to check the context and the token gate counts it
again to reserve it; both come from one rendering and one tokenization (``PromptMemo``), which the
stepped prefill then sends as ids.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

#: prompts up to this many tokens go in one request (a step would only add a round trip)
STEP_MIN = 256
#: the first step's size, before any speed was measured, and the smallest step: a micro-batch of
#: 128 tokens prefilled at 0.74x of 512 here, 256 at 0.93x (Qwen 0.5B, CPU), so steps stay this wide
#: wherever that takes at most twice ``STEP_TARGET_S`` (``MIN_STEP`` below it)
FIRST_STEP = 128
#: the smallest step where even ``FIRST_STEP`` tokens would take over twice ``STEP_TARGET_S``
MIN_STEP = 32
#: the largest step, however fast the engine (a GPU evaluates thousands of tokens a second)
STEP_MAX = 4096
#: the wall time each step aims at: the bound on how long an abandoned prompt keeps evaluating
STEP_TARGET_S = 0.75
#: tokens left for the generating request itself (it always evaluates at least its last step)
TAIL = 16


class StepServer(Protocol):
    """What a stepped prefill needs from the server backend."""

    #: the last stepped prompt's speed on this server (tokens/s): the next prompt's first step is
    #: sized from it, so a loaded box starts narrow; None until one was measured
    prefill_tps: float | None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


def prefill_steps(
    server: StepServer,
    ids: Sequence[int],
    *,
    grid: int = 1,
    target_s: float = STEP_TARGET_S,
    first_step: int = FIRST_STEP,
) -> Iterator[int]:
    """Evaluate ``ids`` (all but the last ``TAIL``) into llama.cpp's cache in timed steps, yielding the
    tokens cached after each step; the caller checks its cancel between them and stops iterating
    to abandon the prompt (nothing more is sent). Yields nothing for a prompt that fits one step.

    Every step ends on a multiple of ``grid`` (the server's micro-batch), so the prompt is cut into
    the same micro-batches as when it is sent whole: the cache holds the same bits either way (what a
    resume or a speculative check relies on, see server_backend._params).
    """
    if len(ids) <= STEP_MIN:
        return
    grid = max(1, grid)
    end = len(ids) - TAIL
    done = 0
    speed = server.prefill_tps  # the last prompt's, on this server: the box's pace now
    step = _step(speed * target_s, grid) if speed else max(grid, first_step - first_step % grid)
    while end - done > step:
        upto = done + step
        started = time.monotonic()
        got = server._post("/completion", {"prompt": list(ids[:upto]), "n_predict": 0, "cache_prompt": True})
        took = max(time.monotonic() - started, 1e-3)
        evaluated = int((got.get("timings") or {}).get("prompt_n") or step)
        done = upto
        speed = max(evaluated, 1) / took
        server.prefill_tps = speed
        step = _step(speed * target_s, grid)
        yield done


def _step(wanted: float, grid: int) -> int:
    """A step of about ``wanted`` tokens: wide where that costs little time, narrow where it would not."""
    floor = FIRST_STEP if wanted * 2 >= FIRST_STEP else MIN_STEP
    size = int(min(STEP_MAX, max(floor, wanted)))
    return max(grid, size - size % grid)


def exact_steps(server: StepServer, ids: Sequence[int], head: int, step: int) -> Iterator[int]:
    """Cache a resume's prompt as the interrupted run evaluated it: ``ids[:head]`` (the original prompt)
    in one request, then the streamed ids in batches of at most ``step`` tokens, which round exactly as
    the one-at-a-time decoding that produced them (server_backend._params); the generating request
    then evaluates only the last id. Yields the tokens cached after each request."""
    upto = 0
    if head > 0:
        upto = head
        server._post("/completion", {"prompt": list(ids[:upto]), "n_predict": 0, "cache_prompt": True})
        yield upto
    while len(ids) - upto > 1:
        upto = min(upto + step, len(ids) - 1)
        server._post("/completion", {"prompt": list(ids[:upto]), "n_predict": 0, "cache_prompt": True})
        yield upto


class PromptMemo:
    """The token ids of the last few rendered prompts, by their messages and tools (thread-safe).

    ``ids(key_parts, compute)`` computes once per distinct prompt; a request counted by the runner and
    then by the gate (and stepped through prefill) renders and tokenizes once.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.computed = 0  # renders + tokenizations actually made (tests count them)

    def ids(self, key_parts: Any, compute: Callable[[], list[int]]) -> list[int]:
        key = json.dumps(key_parts, sort_keys=True, default=str)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        got = compute()
        with self._lock:
            self.computed += 1
            self._items[key] = got
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return got
