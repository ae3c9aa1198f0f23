"""One forward step on every rank, ending with the next token agreed by all of them.

The protocol (the same on every rank, so every collective is matched):

1. every rank runs its part of the forward pass (pipeline: hidden states travel rank to rank
   inside the model, see `split`; tensor: mlx-lm's sharded layers all-reduce inside);
2. the sampling rank (the last one, which holds the logits) samples the token and writes
   ``[token, logprob, top ids..., top logprobs..., cancel]`` into a float32 vector; the other
   ranks write zeros there, and every rank adds its own "cancelled" flag in the last slot;
3. one ``all_sum`` of that vector gives every rank the same token, the same logprobs (rank 0
   streams them) and whether any rank was cancelled, so all ranks stop at the same step.

Token ids travel as float32, exact below 2**24 (every vocabulary in use is far smaller).
Every evaluation goes through the compute thread with the collective timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from .compute import ComputeThread

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

Sampler = Callable[["mx.array"], "mx.array"]
LogitsProcessor = Callable[["mx.array", "mx.array"], "mx.array"]


@dataclass(frozen=True, slots=True)
class StepResult:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    cancelled: bool


@dataclass
class Request:
    """Per-request sampling state, built on the compute thread."""

    sampler: Sampler
    processors: list[LogitsProcessor]
    top_logprobs: int
    history: Any  # mx.array of every token so far (prompt and generated), for the processors


class Stepper:
    def __init__(
        self,
        model: nn.Module,
        group: mx.distributed.Group | None,
        samples: bool,
        compute: ComputeThread,
        timeout_s: float | None,
        prefill_step: int,
        make_cache: Callable[[], list[Any]],
        quantize_cache: Callable[[list[Any]], None],
    ) -> None:
        self.model = model
        self.group = group
        self.samples = samples  # this rank holds the logits and samples
        self.compute = compute
        self.timeout_s = timeout_s
        self.prefill_step = prefill_step
        self.make_cache = make_cache
        self.quantize_cache = quantize_cache
        self.cache: list[Any] = []

    def _call(self, fn: Callable[[], Any], what: str, scale: int = 1) -> Any:
        """Run on the compute thread; a step over many prompt tokens gets proportionally longer.

        The collective timeout bounds one decode step; a prefill chunk of n tokens may
        legitimately take about n/32 times as long on a slow CPU, so its bound scales with it.
        """
        timeout = None if self.timeout_s is None else self.timeout_s * max(1.0, scale / 32)
        return self.compute.call(fn, timeout, what)

    def start(
        self,
        prompt: list[int],
        request: Request,
        cancelled: Callable[[], bool],
        progress: Callable[[int, int], None] | None = None,
    ) -> StepResult:
        """Prefill the prompt (fresh cache) and agree on the first token."""
        self.cache = self._call(self.make_cache, "making the KV cache")
        done = 0
        while len(prompt) - done > self.prefill_step:
            chunk = prompt[done : done + self.prefill_step]
            self._call(partial(self._prefill, chunk), "a prefill step", scale=len(chunk))
            done += len(chunk)
            if progress is not None:
                progress(done, len(prompt))
        return self.step(prompt[done:], request, cancelled)

    def step(self, tokens: list[int], request: Request, cancelled: Callable[[], bool]) -> StepResult:
        flag = bool(cancelled())
        what = "a decode step" if len(tokens) == 1 else "the last prefill step"
        return self._call(lambda: self._step(tokens, request, flag), what, scale=len(tokens))  # type: ignore[no-any-return]

    # -- on the compute thread ----------------------------------------------------------------

    def _prefill(self, tokens: list[int]) -> None:
        import mlx.core as mx

        out = self.model(mx.array(tokens)[None], cache=self.cache)
        self.quantize_cache(self.cache)
        targets = [c.state for c in self.cache]
        if not self.samples:
            targets.append(out)  # keeps this rank's send in the graph
        mx.eval(targets)
        mx.clear_cache()

    def _step(self, tokens: list[int], request: Request, cancelled: bool) -> StepResult:
        import mlx.core as mx

        inputs = mx.array(tokens)
        out = self.model(inputs[None], cache=self.cache)
        self.quantize_cache(self.cache)
        k = request.top_logprobs
        width = 2 + 2 * k + 1
        if self.samples:
            logits = out[:, -1, :]
            if request.processors:
                history = inputs if request.history is None else mx.concatenate([request.history, inputs])
                request.history = history
                for processor in request.processors:
                    logits = processor(history, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            token = request.sampler(logprobs)
            parts = [token.astype(mx.float32).reshape(1), mx.take(logprobs[0], token.reshape(1)).astype(mx.float32)]
            if k:
                top_ids = mx.argpartition(-logprobs[0], k - 1)[:k]
                parts += [top_ids.astype(mx.float32), mx.take(logprobs[0], top_ids).astype(mx.float32)]
            parts.append(mx.array([1.0 if cancelled else 0.0]))
            vector = mx.concatenate(parts)
        else:
            vector = mx.depends(mx.zeros((width,), dtype=mx.float32), out)
            if cancelled:
                vector = vector + mx.array([0.0] * (width - 1) + [1.0])
        if self.group is not None and self.group.size() > 1:
            vector = mx.distributed.all_sum(vector, group=self.group)
        mx.eval(vector)  # eval releases the GIL (tolist() alone would not), so timeouts can fire
        values = [float(v) for v in vector.tolist()]  # type: ignore[union-attr,arg-type]
        top = sorted(((int(values[2 + i]), values[2 + k + i]) for i in range(k)), key=lambda t: -t[1])
        return StepResult(token=int(values[0]), logprob=values[1], top=tuple(top), cancelled=values[-1] > 0.5)
