"""The loaded shard inside a runner: generate(), count_tokens(), close().

Every rank of an instance runs `generate` with the same params and yields the same chunks (the
runner forwards rank 0's). They stay in step because every decision is either agreed through
the per-step collective (the token, cancellation: see `stepper`) or computed identically from
agreed tokens (EOS, max_tokens, stop strings, tool calls). One request at a time: the per-step
protocol is per sequence, so `dispatch_width` is 1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import (
    Chunk,
    ErrorChunk,
    GenerationStats,
    TextGenerationParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)

from .compute import ComputeThread
from .options import MlxConfig
from .prompt import encode_prompt, render_prompt
from .stepper import Request, Stepper, StepResult
from .textparse import Text, TextRouter

log = logging.getLogger("skulk.engine_mlx")


@dataclass
class Loaded:
    """What load() hands the session: the model part, tokenizer and the rank's place."""

    model: Any  # mlx.nn.Module (an mlx-lm Model, possibly split or sharded)
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    group: Any  # mlx.core.distributed.Group | None
    rank: int
    world_size: int
    context_length: int
    backend: str


class MlxSession:
    def __init__(self, loaded: Loaded, config: MlxConfig, compute: ComputeThread, timeout_s: float | None) -> None:
        self.loaded = loaded
        self.config = config
        self.compute = compute
        self.tokenizer = loaded.tokenizer
        self.broken: str | None = None
        self.stepper = Stepper(
            loaded.model,
            loaded.group,
            samples=loaded.rank == loaded.world_size - 1,
            compute=compute,
            timeout_s=timeout_s,
            prefill_step=config.prefill_step,
            make_cache=self._make_cache,
            quantize_cache=self._quantize_cache,
        )
        #: Token ids of the last generation (tests compare ranks and placements by them).
        self.last_tokens: list[int] = []
        self._eos = set(int(t) for t in (loaded.tokenizer.eos_token_ids or ()))

    # -- cache ---------------------------------------------------------------------------------

    def _make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return list(make_prompt_cache(self.loaded.model, max_kv_size=self.config.max_kv_size))

    def _quantize_cache(self, cache: list[Any]) -> None:
        bits = self.config.kv_bits
        if bits is None:
            return
        for i, entry in enumerate(cache):
            if hasattr(entry, "to_quantized") and entry.offset > 0:
                cache[i] = entry.to_quantized(group_size=self.config.kv_group_size, bits=bits)

    # -- requests ------------------------------------------------------------------------------

    def _prompt_ids(self, params: TextGenerationParams) -> tuple[str, list[int]]:
        prompt = render_prompt(self.tokenizer, params)
        return prompt, encode_prompt(self.tokenizer, prompt)

    def count_tokens(self, params: TextGenerationParams) -> int:
        return len(self._prompt_ids(params)[1])

    def _request(self, params: TextGenerationParams) -> Request:
        def build() -> Request:
            import mlx.core as mx
            from mlx_lm.sample_utils import make_logits_processors, make_sampler

            s = params.sampling
            if s.seed is not None:
                mx.random.seed(s.seed)
            sampler = make_sampler(
                temp=s.temperature or 0.0, top_p=s.top_p or 0.0, min_p=s.min_p or 0.0, top_k=s.top_k or 0
            )
            processors = make_logits_processors(
                repetition_penalty=s.repetition_penalty,
                presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty,
            )
            return Request(
                sampler=sampler,
                processors=list(processors),
                top_logprobs=max(params.top_logprobs, 1) if params.logprobs else 0,
                history=None,
            )

        return self.compute.call(build, None, "building the sampler")

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        if self.broken is not None:
            yield ErrorChunk(command_id=command_id, seq=0, message=self.broken, code="rank_failed")
            return
        try:
            yield from self._generate(command_id, params, cancelled)
        except Exception as exc:  # a dead or hung peer, or an MLX failure: the rank is unusable
            self.broken = f"mlx rank {self.loaded.rank} of {self.loaded.world_size} failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.broken)
            yield ErrorChunk(command_id=command_id, seq=0, message=self.broken, code="rank_failed")

    def _generate(
        self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]
    ) -> Iterator[Chunk]:
        started = time.perf_counter()
        prompt, ids = self._prompt_ids(params)
        limit = params.sampling.max_tokens or max(1, self.loaded.context_length - len(ids))
        tools = [t.name for t in params.tools] if params.tools and params.tool_choice != "none" else None
        thinking = prompt.rstrip().endswith("<think>")
        router = TextRouter(params.sampling.stop, tools, thinking=thinking)
        detok = self.tokenizer.detokenizer
        detok.reset()
        request = self._request(params)
        seq = 0
        calls: list[ToolCall] = []
        pending: list[TokenLogprob] = []
        n_out = 0
        first_at: float | None = None
        reason = "length"
        self.last_tokens = generated = []
        result = self.stepper.start(ids, request, cancelled)
        prefill_s = time.perf_counter() - started
        while True:
            if result.cancelled:
                reason = "cancelled"
                break
            if result.token in self._eos:
                reason = "stop"
                break
            n_out += 1
            generated.append(result.token)
            first_at = first_at or time.perf_counter()
            if params.logprobs:
                pending.append(self._logprob(result, params.top_logprobs))
            detok.add_token(result.token)
            items = router.feed(detok.last_segment)
            for item in items:
                if isinstance(item, ToolCall):
                    calls.append(item)
                elif item.text:
                    yield self._text(command_id, seq, item, pending)
                    pending = []
                    seq += 1
            if router.stopped:
                reason = "stop"
                break
            if n_out >= limit:
                reason = "length"
                break
            result = self.stepper.step([result.token], request, cancelled)
        if reason != "cancelled":
            detok.finalize()
            tail = router.feed(detok.last_segment) if not router.stopped else []
            for item in tail + router.finish():
                if isinstance(item, ToolCall):
                    calls.append(item)
                elif item.text:
                    yield self._text(command_id, seq, item, pending)
                    pending = []
                    seq += 1
        now = time.perf_counter()
        decode_s = max(now - (first_at or now), 1e-9)
        stats = GenerationStats(
            prompt_tokens=len(ids),
            generation_tokens=n_out,
            prompt_tps=round(len(ids) / max(prefill_s, 1e-9), 2),
            generation_tps=round(max(n_out - 1, 0) / decode_s, 2),
            ttft_ms=round(((first_at or now) - started) * 1000, 2),
            backend=self.loaded.backend,
        )
        usage = Usage(prompt_tokens=len(ids), completion_tokens=n_out)
        if calls and reason != "cancelled":
            yield ToolCallChunk(
                command_id=command_id, seq=seq, calls=tuple(calls), finish_reason="tool_calls", usage=usage, stats=stats
            )
            return
        final = "cancelled" if reason == "cancelled" else ("stop" if reason == "stop" else "length")
        yield TokenChunk(
            command_id=command_id,
            seq=seq,
            text="",
            finish_reason=final,
            usage=usage,
            stats=stats,
            logprobs=tuple(pending),
        )

    def _text(self, command_id: str, seq: int, item: Text, pending: list[TokenLogprob]) -> TokenChunk:
        return TokenChunk(
            command_id=command_id, seq=seq, text=item.text, reasoning=item.reasoning, logprobs=tuple(pending)
        )

    def _piece(self, token: int) -> tuple[str, tuple[int, ...]]:
        text = str(self.tokenizer.decode([token]))
        return text, tuple(text.encode("utf-8"))

    def _logprob(self, result: StepResult, top_n: int) -> TokenLogprob:
        text, raw = self._piece(result.token)
        top: list[TopLogprob] = []
        for token, logprob in result.top[:top_n]:
            piece, piece_bytes = self._piece(token)
            top.append(TopLogprob(token=piece, logprob=logprob, bytes=piece_bytes))
        return TokenLogprob(token=text, logprob=result.logprob, bytes=raw, top_logprobs=tuple(top))

    def param_bytes(self) -> int:
        """Bytes of model weights this rank holds (its share of the whole model)."""

        def count() -> int:
            from mlx.utils import tree_flatten

            flat: Any = tree_flatten(self.loaded.model.parameters())
            return sum(int(leaf.nbytes) for _, leaf in flat)

        return self.compute.call(count, 30.0, "counting parameters")

    def close(self, barrier_s: float = 5.0) -> None:
        """A last barrier when every rank closes together (ring teardown otherwise spams errors)."""
        group = self.loaded.group
        if group is not None and self.broken is None and self.compute.lost is None:

            def barrier() -> None:
                import mlx.core as mx

                mx.eval(mx.distributed.all_sum(mx.ones(1), group=group))

            try:
                self.compute.call(barrier, barrier_s, "the closing barrier")
            except Exception as exc:
                log.info("closing barrier skipped: %s", exc)
        self.compute.close()
