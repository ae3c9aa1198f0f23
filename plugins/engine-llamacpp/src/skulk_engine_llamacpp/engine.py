"""The kernel-facing side: two Engines over the kernel-independent backends.

`llama_server` runs llama.cpp's native server inside the runner (several requests decode together
on parallel slots); `llama_cpp` runs llama-cpp-python in process, one request at a time. Both map
the kernel's TextGenerationParams onto the backend's chat() and its events onto kernel chunks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import time
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from skulk_kernel.api import (
    Chunk,
    EmbeddingChunk,
    EmbeddingParams,
    EngineProbe,
    ErrorChunk,
    GenerationStats,
    PrefillProgressChunk,
    PromptChunk,
    RerankParams,
    RunnerSpec,
    ScoreChunk,
    Sharding,
    TextGenerationParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)

from .accel import Compute, OffloadPlan, detect_build, gpu_free_bytes, layer_bytes, plan_offload
from .accel import backend_tags as accel_tags
from .admission import DEFAULT_MAX_TOKENS, TokenGate
from .completion import PromptEcho, ScoringProgress, complete
from .constraints import parse_tool_choice
from .events import BackendError, ContextLengthExceeded, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Working
from .plugin import LlamaCppConfig, llamacpp_config
from .prefill import STEP_MIN
from .vision import mmproj_path, with_images

log = logging.getLogger("skulk.engine.llamacpp")
MINILM_MAX_TOKENS = 256
QUEUE_KEEPALIVE_S = 5.0
DEFAULT_SLOTS = 16  # llama_server slots decoding together (the token gate keeps them in the KV pool)


@cache
def _version(dist: str, module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def probe_builds() -> dict[str, str]:
    builds = {}
    if v := _version("xllamacpp", "xllamacpp"):
        builds["llama_server"] = f"xllamacpp {v}{_build_label('xllamacpp', 'xllamacpp')}"
    if v := _version("llama-cpp-python", "llama_cpp"):
        builds["llama_cpp"] = f"llama-cpp-python {v}{_build_label('llama-cpp-python', 'llama_cpp')}"
    return builds


def _build_label(dist: str, module: str) -> str:
    build = detect_build(dist, module)
    return "" if build == "cpu" else f" ({build} build)"


def offload_plan(config: LlamaCppConfig, spec: RunnerSpec, vram_free: int | None) -> OffloadPlan:
    """The runner's n_gpu_layers: on a GPU tag all of the shard's layers, or those that fit ``vram_free``
    by the card's per-layer size; on a ``-cpu`` tag none (the planner admitted it against RAM)."""
    card = spec.card
    shard = spec.shard
    n_layers = shard.end_layer - shard.start_layer if shard.end_layer > shard.start_layer else card.n_layers
    if shard.backend.rpartition("-")[2] == "cpu":
        return OffloadPlan(0, n_layers + 1, f"placed on {shard.backend}")
    per_layer = layer_bytes(card, spec.context_limit or config.n_ctx, spec.kv_cache_type)
    return plan_offload(config.n_gpu_layers, n_layers, per_layer, vram_free)


def _report(plan: OffloadPlan, model_id: str) -> None:
    (log.info if plan.full or plan.layers == 0 else log.warning)("%s: %s", model_id, plan.summary())


def to_messages(params: TextGenerationParams) -> list[dict[str, Any]]:
    return [m.template_dict() for m in params.messages]


def to_tools(params: TextGenerationParams) -> list[dict[str, Any]] | None:
    if not params.tools or parse_tool_choice(params.tool_choice).tool_choice == "none":
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters or {"type": "object", "properties": {}},
            },
        }
        for t in params.tools
    ]


def to_sampling(params: TextGenerationParams) -> dict[str, Any]:
    s = params.sampling
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "seed": s.seed,
        "repeat_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_tokens": s.max_tokens,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos or None,  # the server backend's SAMPLING_KEYS pass it to llama.cpp
    }


def _logprobs(items: Any) -> tuple[TokenLogprob, ...]:
    if not items:
        return ()
    return tuple(
        TokenLogprob(
            token=lp.token,
            logprob=lp.logprob,
            bytes=tuple(lp.bytes or lp.token.encode()),
            top_logprobs=tuple(
                TopLogprob(token=t.token, logprob=t.logprob, bytes=tuple(t.bytes or t.token.encode())) for t in lp.top
            ),
        )
        for lp in items
    )


class LlamaSession:
    """One loaded GGUF inside a runner, behind either backend."""

    def __init__(self, backend: Any, spec: RunnerSpec, tag: str, gate: TokenGate | None = None) -> None:
        self.backend = backend
        self.spec = spec
        self.tag = tag
        #: parallel slots share one KV pool: requests reserve prompt + output there (see admission.py)
        self.gate = gate
        #: the layers on the GPU and why (None: a CPU build)
        self.offload: OffloadPlan | None = None

    @property
    def ignores_eos(self) -> bool:
        """llama.cpp's server takes `ignore_eos`; llama-cpp-python's API has no such option (refused)."""
        return bool(getattr(self.backend, "ignores_eos", False))

    @property
    def takes_images(self) -> bool:
        """VisionInput: the server was started with the card's projector (vision.py)."""
        return getattr(self.backend, "mmproj_path", None) is not None

    def _messages(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Any:
        """The chat messages, with the request's images (received on the data plane) as image_url parts."""
        messages = to_messages(params)
        if not any(m.images for m in params.messages):
            return messages
        from skulk_api_control.vision_wire import ImageUploadError

        try:
            return with_images(messages, params, self.spec.instance_id, command_id, cancelled)
        except ImageUploadError as exc:  # never answered from the text alone
            raise BackendError(f"images: {exc}") from exc

    @property
    def serves_completions(self) -> bool:
        """Text completions need the native server's endpoints (see completion.py)."""
        from .server_backend import LlamaServer

        return isinstance(self.backend, LlamaServer)

    def count_tokens(self, params: TextGenerationParams) -> int:
        if (c := params.completion) is not None:
            n = len(c.prompt_ids) or len(self.backend.tokenize(params.raw_prompt or "", add_special=True))
            return n + (len(self.backend.tokenize(c.suffix)) + 3 if c.suffix is not None else 0)  # + FIM tokens
        if params.raw_prompt is not None:
            return len(self.backend.tokenize(params.raw_prompt, add_special=True))
        messages, tools = to_messages(params), to_tools(params)
        bound = self._bound(params, messages, tools)
        return bound if bound is not None else int(self.backend.count_tokens(messages, tools))

    def _bound(self, params: TextGenerationParams, messages: list[dict[str, Any]], tools: Any) -> int | None:
        """A short chat prompt's token bound, when it settles everything the count is for, else None.

        The count serves the context check (prompt + max_tokens within the limit), the gate's
        reservation and the choice to step the prefill: a bound of at most STEP_MIN tokens (so no
        stepping) that passes the check answers all three, and saves the template and tokenizer
        round trips to the server before the first token (llama.cpp renders and tokenizes the
        prompt again when it generates). A longer or non-text prompt, or one near the limit, is
        counted exactly (the refusal then names its exact count).
        """
        bounder = getattr(self.backend, "prompt_bound", None)
        limit = getattr(self.spec, "context_limit", None) or getattr(self.backend, "context_length", 0)
        if bounder is None or not limit or params.continue_from or any(m.images for m in params.messages):
            return None
        bound = bounder(messages, tools)
        if bound is None or bound > STEP_MIN or bound + (params.sampling.max_tokens or 0) > limit:
            return None
        return int(bound)

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        if self.gate is None:
            yield from self._generate(command_id, params, cancelled)
            return
        try:
            prompt = self.count_tokens(params)
        except BackendError:
            prompt = self.gate.pool  # cannot count: reserve the whole pool and run alone
        budget = params.sampling.max_tokens or min(DEFAULT_MAX_TOKENS, max(1, self.gate.pool - prompt))
        if params.sampling.max_tokens is None:  # the engine must not write past the reservation
            params = params.model_copy(update={"sampling": params.sampling.model_copy(update={"max_tokens": budget})})
        gate = self.gate
        need = gate.need(prompt + budget)
        ticket = gate.enqueue()
        seq = 0
        try:
            # while queued, a progress chunk now and then keeps the API's idle timeout away
            while not gate.admit(ticket, need, QUEUE_KEEPALIVE_S):
                if cancelled():
                    gate.leave(ticket)
                    yield TokenChunk(command_id=command_id, seq=seq, text="", finish_reason="cancelled")
                    return
                yield PrefillProgressChunk(command_id=command_id, seq=seq, processed=0, total=prompt)
                seq += 1
        except BaseException:
            gate.leave(ticket)
            raise
        try:
            steps = self._prefill(params) if prompt > STEP_MIN else iter(())  # a short one is never stepped
            while True:
                if cancelled():  # abandoned mid-prompt: llama.cpp stops only between steps (prefill.py)
                    yield TokenChunk(command_id=command_id, seq=seq, text="", finish_reason="cancelled")
                    return
                try:
                    done = next(steps)
                except (StopIteration, BackendError):  # a step's error comes again from the request itself
                    break
                yield PrefillProgressChunk(command_id=command_id, seq=seq, processed=done, total=prompt)
                seq += 1
            yield from self._generate(command_id, params, cancelled, seq)
        finally:
            gate.release(need)

    def _prefill(self, params: TextGenerationParams) -> Iterator[int]:
        """A long chat prompt evaluated in steps before it is generated from (the server backend only)."""
        prefill = getattr(self.backend, "prefill", None)
        if prefill is None or params.completion is not None or params.raw_prompt is not None:
            return iter(())
        if params.continue_from:  # a resume renders its own prompt (exact continuation)
            return iter(())
        try:
            ids = self.backend.prompt_ids(to_messages(params), to_tools(params))
        except BackendError:
            return iter(())
        return iter(prefill(ids))

    def _generate(
        self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool], seq: int = 0
    ) -> Iterator[Chunk]:
        started = time.perf_counter()
        first_at: float | None = None
        kept_alive = started
        try:
            events = (
                self._completion(params, cancelled)
                if params.completion is not None
                else self.backend.chat(
                    self._messages(command_id, params, cancelled),
                    tools=to_tools(params),
                    sampling=to_sampling(params),
                    logprobs=params.logprobs,
                    top_logprobs=params.top_logprobs,
                    cancel=cancelled,
                    constraint=parse_tool_choice(params.tool_choice),
                    enable_thinking=params.enable_thinking,
                    **self._resume_args(params),
                )
            )
            calls: list[ToolCall] = []
            for event in events:
                if isinstance(event, ScoringProgress):
                    yield PrefillProgressChunk(command_id=command_id, seq=seq, processed=event.done, total=event.total)
                    seq += 1
                    continue
                if isinstance(event, PromptEcho):
                    first_at = first_at or time.perf_counter()
                    yield PromptChunk(
                        command_id=command_id,
                        seq=seq,
                        text=event.text,
                        token_ids=event.ids,
                        logprobs=_logprobs(event.logprobs),
                    )
                    seq += 1
                    continue
                if isinstance(event, ReasoningDelta):
                    first_at = first_at or time.perf_counter()
                    yield TokenChunk(command_id=command_id, seq=seq, text=event.text, reasoning=True)
                    seq += 1
                    continue
                if isinstance(event, TextDelta):
                    if not event.text and not event.logprobs and not event.ids:
                        continue
                    first_at = first_at or time.perf_counter()
                    yield TokenChunk(
                        command_id=command_id,
                        seq=seq,
                        text=event.text,
                        logprobs=_logprobs(event.logprobs) if params.logprobs else (),
                        token_ids=event.ids,
                    )
                    seq += 1
                elif isinstance(event, Working):  # a long tool call: an empty chunk keeps the stream alive
                    if (now := time.perf_counter()) - kept_alive >= QUEUE_KEEPALIVE_S:
                        kept_alive = now
                        yield TokenChunk(command_id=command_id, seq=seq, text="")
                        seq += 1
                elif isinstance(event, ToolCallDelta):
                    first_at = first_at or time.perf_counter()
                    calls.append(ToolCall(id=event.id, name=event.name, arguments=event.arguments_json))
                elif isinstance(event, Finish):
                    yield self._final(command_id, seq, event, calls, started, first_at)
                    return
        except ContextLengthExceeded as exc:
            yield ErrorChunk(
                command_id=command_id,
                seq=seq,
                message=f"context_length_exceeded: {exc}",
                error_type="invalid_request_error",
                code="context_length_exceeded",
            )
            return
        except BackendError as exc:
            if exc.status == 400 and seq == 0:  # the request asked for something impossible: a 400
                yield ErrorChunk(
                    command_id=command_id,
                    seq=seq,
                    message=f"invalid request: {exc}",
                    error_type="invalid_request_error",
                    code="invalid_request",
                )
                return
            yield ErrorChunk(command_id=command_id, seq=seq, message=f"llama.cpp: {exc}", code="engine_error")
            return
        # The backend ends without a Finish only when cancelled.
        yield TokenChunk(command_id=command_id, seq=seq, text="", finish_reason="cancelled")

    def _completion(self, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Any]:
        """A text completion's events (completion.py): the echoed prompt, then text deltas and a Finish."""
        assert params.completion is not None
        return complete(
            self.backend,
            params.completion,
            params.raw_prompt,
            to_sampling(params),
            logprobs=params.top_logprobs if params.logprobs else None,
            token_ids=params.token_ids,
            cancel=cancelled,
            model_id=self.spec.card.model_id,
        )

    def _resume_args(self, params: TextGenerationParams) -> dict[str, Any]:
        """Token-id streaming and exact continuation, for the backend that has them (the server)."""
        if not (params.token_ids or params.continue_from) or not getattr(self.backend, "exact_resume", False):
            return {}
        return {"token_ids": params.token_ids, "continue_ids": params.continue_from}

    def _final(
        self, command_id: str, seq: int, fin: Finish, calls: list[ToolCall], started: float, first_at: float | None
    ) -> Chunk:
        now = time.perf_counter()
        ttft = ((first_at or now) - started) * 1000
        decode_s = max(now - (first_at or now), 1e-9)
        timings = fin.timings or {}
        stats = GenerationStats(
            prompt_tokens=fin.prompt_tokens,
            generation_tokens=fin.completion_tokens,
            prompt_tps=float(timings.get("prompt_per_second") or 0.0),
            generation_tps=float(timings.get("predicted_per_second") or max(fin.completion_tokens - 1, 0) / decode_s),
            ttft_ms=round(ttft, 2),
            backend=self.tag,
            draft_tokens=int(timings.get("draft_n") or 0),  # llama.cpp reports these only with a draft model
            draft_accepted=int(timings.get("draft_n_accepted") or 0),
        )
        usage = Usage(prompt_tokens=fin.prompt_tokens, completion_tokens=fin.completion_tokens)
        if calls:
            return ToolCallChunk(
                command_id=command_id, seq=seq, calls=tuple(calls), finish_reason="tool_calls", usage=usage, stats=stats
            )
        return TokenChunk(command_id=command_id, seq=seq, text="", finish_reason=fin.reason, usage=usage, stats=stats)

    def embed(self, command_id: str, params: EmbeddingParams) -> Chunk:
        vectors = self.backend.embed(list(params.inputs), max_tokens=MINILM_MAX_TOKENS)
        tokens = sum(len(self.backend.tokenize(t, add_special=True)) for t in params.inputs)
        return EmbeddingChunk(
            command_id=command_id,
            seq=0,
            embeddings=tuple(tuple(v) for v in vectors),
            finish_reason="stop",
            usage=Usage(prompt_tokens=tokens),
        )

    def rerank(self, command_id: str, params: RerankParams) -> Chunk:
        """A score per document; a pair longer than the context is a 400 naming the document, not a 500."""
        limit = self.backend.context_length
        query: int | None = None
        for i, doc in enumerate(params.documents):
            if len(params.query) + len(doc) + 4 <= limit:
                continue  # every token covers at least one character: it fits
            if query is None:
                query = len(self.backend.tokenize(params.query, add_special=False))
            n = query + len(self.backend.tokenize(doc, add_special=False)) + 4  # the pair's special tokens
            if n > limit:
                return ErrorChunk(
                    command_id=command_id,
                    seq=0,
                    error_type="invalid_request_error",
                    code="context_length_exceeded",
                    message=f"documents[{i}]: the query and this document take {n} tokens, over the "
                    f"{limit} {self.spec.card.model_id} reads at once; shorten or split it",
                )
        scores, tokens = self.backend.rerank(params.query, list(params.documents))
        return ScoreChunk(
            command_id=command_id, seq=0, scores=tuple(scores), finish_reason="stop", usage=Usage(prompt_tokens=tokens)
        )

    def close(self) -> None:
        self.backend.close()


class _LlamaEngine:
    name = ""
    module = ""
    dist = ""
    tasks = frozenset({"TextGeneration", "TextEmbedding"})

    def probe(self) -> EngineProbe:
        version = _version(self.dist, self.module)
        if version is None:
            return EngineProbe(available=False, reason=f"{self.dist} is not installed")
        return EngineProbe(available=True, version=version)

    def build(self) -> Compute:
        """What the installed package was built for (cpu, cuda, rocm, vulkan, metal)."""
        return detect_build(self.dist, self.module)

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        if not self.probe().available:
            return []
        return accel_tags(self.name, self.build(), facts)

    def _tag(self, plan: OffloadPlan | None) -> str:
        """The backend in each response's stats: the build's GPU tag when layers run there."""
        return f"{self.name}-{self.build()}" if plan is not None and plan.layers > 0 else f"{self.name}-cpu"


class LlamaServerEngine(_LlamaEngine):
    name = "llama_server"
    module = "xllamacpp"
    dist = "xllamacpp"
    tasks = frozenset({"TextGeneration", "TextEmbedding", "TextRerank"})  # reranking: llama.cpp's server only
    #: the runner admits this many at once; the session's token gate and llama.cpp's slots order them
    dispatch_width = 64
    splits: frozenset[Sharding] = frozenset()  # whole models only (no llama.cpp RPC pooling)

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> LlamaSession:
        from .server_backend import LlamaServer

        if spec.model_path is None:
            raise BackendError(f"{spec.card.model_id} has no model file on this node")
        reranking = "TextRerank" in spec.card.tasks
        embedding = reranking or "TextEmbedding" in spec.card.tasks
        config = llamacpp_config(spec.options)
        plan = None
        if self.build() != "cpu":  # a CPU build starts exactly as before
            import xllamacpp as xlc

            kinds = xlc.ggml_backend_dev_type
            free = gpu_free_bytes(
                xlc.get_device_info(), (kinds.GGML_BACKEND_DEVICE_TYPE_GPU, kinds.GGML_BACKEND_DEVICE_TYPE_IGPU)
            )
            plan = offload_plan(config, spec, free)
            _report(plan, spec.card.model_id)
        server = LlamaServer(
            spec.model_path,
            embedding=embedding,
            reranking=reranking,
            n_parallel=config.n_parallel,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads_batch,
            # the placement's context (its KV was admitted for it); embeddings size their slots themselves
            n_ctx=config.n_ctx if embedding else (spec.context_limit or config.n_ctx),
            cache_type=spec.kv_cache_type,
            cache_ram_mib=config.cache_ram_mib,
            draft_model_path=config.draft_models.get(spec.card.model_id) or config.draft_model_path,
            draft_max=config.draft_max,
            after_tool_result=config.after_tool_result,
            n_ubatch=config.n_ubatch,
            n_batch=config.n_batch,
            verbosity=config.verbosity,
            n_gpu_layers=plan.layers if plan is not None else None,
            mmproj_path=mmproj_path(spec.card, spec.model_path),
        )
        progress(0, spec.card.n_layers)
        server.start()
        progress(spec.card.n_layers, spec.card.n_layers)
        gate = None if embedding else TokenGate(server.context_length, max_running=server.n_parallel)
        session = LlamaSession(server, spec, self._tag(plan), gate)
        session.offload = plan
        return session


class LlamaCppEngine(_LlamaEngine):
    name = "llama_cpp"
    module = "llama_cpp"
    dist = "llama-cpp-python"
    tasks = frozenset({"TextGeneration"})
    dispatch_width = 1
    splits: frozenset[Sharding] = frozenset()  # whole models only (no llama.cpp RPC pooling)

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> LlamaSession:
        from .inprocess_backend import LlamaInProcess

        if spec.model_path is None:
            raise BackendError(f"{spec.card.model_id} has no model file on this node")
        config = llamacpp_config(spec.options)
        plan = None
        if self.build() != "cpu":
            import llama_cpp

            # llama-cpp-python lists no free device memory: auto offloads everything it can
            gpu = bool(llama_cpp.llama_supports_gpu_offload())
            plan = offload_plan(config, spec, 1 << 62 if gpu else None)
            _report(plan, spec.card.model_id)
        backend = LlamaInProcess(
            spec.model_path,
            n_threads=config.n_threads,
            n_ctx=spec.context_limit or config.n_ctx,
            n_batch=config.n_batch or 512,
            n_ubatch=config.n_ubatch,
            logprobs_capable=config.logprobs_inprocess,
            n_gpu_layers=plan.layers if plan is not None else 0,
        )
        progress(0, spec.card.n_layers)
        backend.start()
        progress(spec.card.n_layers, spec.card.n_layers)
        session = LlamaSession(backend, spec, self._tag(plan))
        session.offload = plan
        return session
