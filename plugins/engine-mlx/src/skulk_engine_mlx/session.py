"""The loaded shard inside a runner: generate(), count_tokens(), close().

Every rank of an instance runs `generate` with the same params and yields the same chunks (the
runner forwards rank 0's). They stay in step because every decision is either agreed through
the per-step collective (the token, cancellation: see `stepper`) or computed identically from
agreed tokens (EOS, max_tokens, stop strings, tool calls). A split instance serves one request
at a time: the per-step protocol is per sequence, so its `dispatch_width` is 1. A single-rank
instance batches continuously (`batcher`): several requests step together, each reading its own
tokens, and its `dispatch_width` says how many the runner may send at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import (
    Chunk,
    ErrorChunk,
    GenerationStats,
    PromptChunk,
    TextGenerationParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)

from .batcher import BATCH_WIDTH, Batcher
from .completion import CompletionPrompt, CompletionRefused, Scored, completion_prompt, score_prompt, to_logprobs
from .compute import ComputeThread
from .options import MlxConfig
from .prompt import encode_prompt, render_prompt
from .stepper import Request, Stepper, StepResult
from .textparse import Text, TextRouter

log = logging.getLogger("skulk.engine_mlx")
#: a tool call's tokens show nothing until the call is whole: an empty chunk this often keeps the
#: stream from reading as a dead runner (the API node's idle timeout is 120 s)
KEEPALIVE_S = 5.0


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
        #: one BatchGenerator for every request of a single-rank instance (mlx-lm's batching has no
        #: quantized KV cache: kv_bits keeps the one-sequence path)
        self.batcher = (
            Batcher(loaded.model, compute, config.prefill_step, config.max_kv_size)
            if loaded.world_size == 1 and config.kv_bits is None
            else None
        )
        #: how many requests the runner sends at once (the runner reads it before the engine's)
        self.dispatch_width = BATCH_WIDTH if self.batcher is not None else 1
        self._serial = threading.Lock()  # the one-sequence path: one request at a time
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

    #: text completions (`params.completion`): the prompt as is, FIM, echo (see completion.py)
    serves_completions = True

    def _prompt_ids(self, params: TextGenerationParams) -> tuple[str, list[int]]:
        if params.completion is not None:
            return "", completion_prompt(self.tokenizer, params, params.model_id).ids
        prompt = render_prompt(self.tokenizer, params)
        return prompt, encode_prompt(self.tokenizer, prompt)

    def count_tokens(self, params: TextGenerationParams) -> int:
        try:
            return len(self._prompt_ids(params)[1])
        except CompletionRefused:  # generate() answers it with the 400
            return len(self.tokenizer.encode(params.raw_prompt or ""))

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
        completion: CompletionPrompt | None = None
        if params.completion is not None:
            try:
                completion = completion_prompt(self.tokenizer, params, params.model_id)
                if not completion.ids:  # nothing to read (a batch would fail every request in it)
                    raise CompletionRefused("prompt: the prompt is empty (no tokens); send some text or token ids")
                if params.completion.prompt_logprobs is not None and self.loaded.world_size > 1:
                    raise CompletionRefused(
                        f"prompt logprobs (echo with logprobs) are not served by a {self.loaded.world_size}-rank "
                        "MLX instance; place the model on one node, or use llama.cpp"
                    )
            except CompletionRefused as exc:
                yield ErrorChunk(
                    command_id=command_id,
                    seq=0,
                    message=str(exc),
                    error_type="invalid_request_error",
                    code="invalid_request",
                )
                return
        try:
            if self.batcher is not None:
                yield from self._generate(command_id, params, cancelled, completion)
            else:
                with self._serial:
                    yield from self._generate(command_id, params, cancelled, completion)
        except Exception as exc:  # a dead or hung peer, or an MLX failure: the rank is unusable
            self.broken = f"mlx rank {self.loaded.rank} of {self.loaded.world_size} failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.broken)
            yield ErrorChunk(command_id=command_id, seq=0, message=self.broken, code="rank_failed")

    def _echo(self, command_id: str, params: TextGenerationParams, completion: CompletionPrompt) -> PromptChunk:
        """The prompt as read, with each position's logprob when asked (one pass over the prompt)."""
        ids = completion.ids
        top = params.completion.prompt_logprobs if params.completion is not None else None
        logprobs: tuple[TokenLogprob, ...] = ()
        if top is not None:

            def score() -> Scored:
                return score_prompt(self.loaded.model, self._make_cache(), ids, top, self.config.prefill_step)

            scored = self.compute.call(score, None, "scoring the prompt")
            logprobs = to_logprobs(self.tokenizer, ids, scored)[completion.lead :]
        return PromptChunk(
            command_id=command_id,
            seq=0,
            text=completion.text,
            token_ids=tuple(ids[completion.lead :]),
            logprobs=logprobs,
        )

    def _results(
        self, ids: list[int], request: Request, limit: int, cancelled: Callable[[], bool]
    ) -> Generator[StepResult, None, None]:
        """The request's tokens, one StepResult each: from the batch, or stepped alone (a split instance)."""
        if self.batcher is not None:
            lane = self.batcher.join(ids, request, limit, cancelled)
            try:
                while True:
                    yield lane.next()
            finally:
                self.batcher.leave(lane)
        result = self.stepper.start(ids, request, cancelled)
        while True:
            yield result
            result = self.stepper.step([result.token], request, cancelled)

    def _generate(
        self,
        command_id: str,
        params: TextGenerationParams,
        cancelled: Callable[[], bool],
        completion: CompletionPrompt | None = None,
    ) -> Iterator[Chunk]:
        started = time.perf_counter()
        seq = 0
        if completion is not None:
            prompt, ids = "", completion.ids
            if params.completion is not None and params.completion.echo:
                yield self._echo(command_id, params, completion)
                seq += 1
            if params.completion is not None and not params.completion.generate:
                usage = Usage(prompt_tokens=len(ids), completion_tokens=0)
                yield TokenChunk(command_id=command_id, seq=seq, text="", finish_reason="length", usage=usage)
                return
        else:
            prompt, ids = self._prompt_ids(params)
            if not ids:  # a raw prompt of nothing: nothing to read (a batch would fail every request in it)
                message = "prompt: the prompt is empty (no tokens); send some text"
                yield ErrorChunk(command_id=command_id, seq=0, message=message, error_type="invalid_request_error")
                return
        limit = params.sampling.max_tokens or max(1, self.loaded.context_length - len(ids))
        tools = [t.name for t in params.tools] if params.tools and params.tool_choice != "none" else None
        thinking = prompt.rstrip().endswith("<think>")
        router = TextRouter(params.sampling.stop, tools, thinking=thinking)
        detok = self.tokenizer.detokenizer
        detok.reset()
        request = self._request(params)
        calls: list[ToolCall] = []
        pending: list[TokenLogprob] = []
        n_out = 0
        first_at: float | None = None
        reason = "length"
        self.last_tokens = generated = []
        results = self._results(ids, request, limit, cancelled)
        try:
            result = next(results)
            said = time.perf_counter()  # when the client last got a chunk
            prefill_s = said - started
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
                        said = time.perf_counter()
                if (now := time.perf_counter()) - said >= KEEPALIVE_S:  # tokens that show nothing yet
                    said = now
                    yield TokenChunk(command_id=command_id, seq=seq, text="")
                    seq += 1
                if router.stopped:
                    reason = "stop"
                    break
                if n_out >= limit:
                    reason = "length"
                    break
                result = next(results)
        finally:
            results.close()
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
        if self.batcher is not None:
            try:
                self.batcher.close()
            except Exception as exc:
                log.info("batch generator not closed: %s", exc)
        self.compute.close()
