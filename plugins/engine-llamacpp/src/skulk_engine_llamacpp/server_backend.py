"""The ``llama_server`` backend: llama.cpp's native C++ server, in-process via ``xllamacpp``.

Why this shape: the native server gives continuous batching over parallel slots with a unified
KV cache and a RAM prompt cache, and costs ~0.05 ms per streamed token, far less than any Python
loop around llama.cpp. ``xllamacpp.Server(params)`` loads the model and starts the HTTP server on
its own threads inside this process; we bind it to 127.0.0.1 on an ephemeral port (port 0, so
no race picking a free port) and talk to it with a small synchronous httpx client that turns
OpenAI SSE chunks into :mod:`.events`.

Cancel: the caller's ``cancel()`` is checked after every streamed chunk, and also every 20 ms by
one watcher thread (:mod:`.abortable`) that shuts the socket down -- so a request still queued
for a slot or evaluating its prompt (llama.cpp sends no headers until the first token) is
abandoned at once too. The server sees the dropped connection and releases the slot (the tests
measure it).

Tools: if the GGUF's template knows tools we pass them through and llama.cpp's own parser
returns structured ``tool_calls`` ("native"). If it does not (SmolLM2), we start the server with
:func:`.templates.chatml_tools_template` and, for requests with tools, render the prompt with
``/apply-template`` and generate with ``/v1/completions``, parsing calls ourselves with
:mod:`.toolcalls` ("prompt" mode). Prompt mode avoids llama.cpp's strict parser, which fails a
request mid-stream with HTTP 500 "does not match the expected ... format" when a small model
writes malformed or truncated tool markup.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from .abortable import AbortableStream, CancelWatcher
from .constraints import LARK_PROSE_START, Constraint, call_schema, format_schema, lark_call, lark_json
from .events import (
    BackendError,
    CancelCheck,
    ContextLengthExceeded,
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Working,
)
from .prefill import PromptMemo, exact_steps, prefill_steps
from .reasoning import OPEN as THINK_OPEN
from .reasoning import ThinkSplitter
from .templates import (
    chatml_tools_template,
    default_system_prompt,
    is_chatml,
    read_gguf_chat_template,
    read_gguf_metadata,
    template_supports_tools,
)
from .toolcalls import STOP_MARKERS, ToolCallStreamParser, new_call_id

ToolMode = Literal["auto", "native", "prompt"]
#: How the turn after a tool result is generated (``answer`` unless the request forces a call):
#: ``answer`` renders the conversation (calls and results included) without the tool catalog and
#: makes the reply start as prose; ``free`` leaves it to the model and its template.
AfterToolResult = Literal["answer", "free"]

#: Sampling keys passed through to llama.cpp (OpenAI names plus llama.cpp extras).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_tokens",
    "stop",
    "ignore_eos",  # llama.cpp's: generate to max_tokens (benchmarks; the slot tests' hogs)
)

log = logging.getLogger("skulk.engine.llamacpp")


def _logprobs_from(choice: dict[str, Any], keep_top: bool) -> tuple[TokenLogprob, ...] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    out = []
    for entry in content:
        top = (
            tuple(
                TopLogprob(
                    t.get("token", ""), float(t["logprob"]), tuple(t["bytes"]) if t.get("bytes") is not None else None
                )
                for t in entry.get("top_logprobs") or ()
            )
            if keep_top
            else ()
        )
        out.append(
            TokenLogprob(
                entry.get("token", ""),
                float(entry["logprob"]),
                tuple(entry["bytes"]) if entry.get("bytes") is not None else None,
                top,
                entry.get("id") if isinstance(entry.get("id"), int) else None,
            )
        )
    return tuple(out)


def _usable_cores() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _normalize(vec: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(v * v for v in vec))
    return [v / norm for v in vec] if norm > 0 else vec


#: the largest micro-batch measured to evaluate exactly as single tokens do (see ``_params``)
EXACT_UBATCH = 32


class LlamaServer:
    """One GGUF model served by llama.cpp's native server inside this process.

    Use as a context manager or call :meth:`start` / :meth:`close`. Thread-safe: several
    threads may stream at once (that is what the parallel slots are for).
    """

    #: streams token ids and continues from them (``chat(token_ids=, continue_ids=)``)
    exact_resume = True
    #: takes ``ignore_eos`` (SAMPLING_KEYS): the session honours the request field (EosControl)
    ignores_eos = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        embedding: bool = False,
        reranking: bool = False,
        n_parallel: int = 4,
        n_threads: int = 1,
        n_threads_batch: int | None = None,
        n_ctx: int | None = None,
        cache_type: str = "f16",
        chat_template: str | None = None,
        draft_model_path: str | Path | None = None,
        draft_max: int = 8,
        tool_mode: ToolMode = "auto",
        after_tool_result: AfterToolResult = "answer",
        cache_ram_mib: int = 256,
        request_timeout_s: float = 600.0,
        verbosity: int = 0,
        n_ubatch: int | None = None,
        n_batch: int | None = None,
        n_gpu_layers: int | None = None,
        mmproj_path: str | Path | None = None,
    ) -> None:
        """
        n_ctx: for chat, the unified KV size shared by all slots (each request may use all of
        it; together they may not). Default: the model's training context. For embeddings it
        is per slot (default: the model's context, 512 for MiniLM).
        cache_ram_mib: llama.cpp's RAM prompt cache (its default, 8 GiB, is too much for a
        small shared node).
        n_threads / n_threads_batch: llama.cpp computes a batch of one token (one stream decoding)
        with ``n_threads`` and anything larger (prompts, several streams decoding together) with
        ``n_threads_batch``, so threads follow the load: one stream keeps to one core on a busy
        box (two threads can collapse there), queued streams use every core. Default batch
        threads: the cores this process may use.
        draft_model_path: a small GGUF with the same vocabulary drafting ``draft_max`` tokens per
        step (speculative decoding; acceptance in the timings; greedy output is plain decoding's
        with batch-exact weights, ``models.BATCH_EXACT_TYPES``, else it may part at a near-tie).
        n_ubatch: the micro-batch llama.cpp evaluates at once. Default: llama.cpp's own (512); a resume
        stays exact by feeding its streamed ids in batches of ``EXACT_UBATCH`` (see ``_params``).
        n_batch: the tokens one llama_decode call takes (chat only; default llama.cpp's 2048).
        n_gpu_layers: layers a GPU build puts on the GPU (block count + 1 = all, the output layer
        too); None leaves llama.cpp's default untouched (a CPU build: nothing to offload).
        after_tool_result: ``answer`` (default) because small models shown the tool catalog again
        after a result repeat the call they just made: Qwen2.5-Coder-0.5B did so on 4 of 4
        round trips with its own template (and, held to prose, wrote about the call instead),
        while the same conversation without the catalog was answered from the result 4 of 4
        times. A client that wants another call after a result forces it (``tool_choice``).
        """
        self.model_path = Path(model_path)
        # a reranker (a cross-encoder) is served in embedding mode with rank pooling: /rerank
        self.reranking = reranking
        self.embedding = embedding or reranking
        self.n_parallel = n_parallel
        self.n_threads = n_threads
        self.n_threads_batch = n_threads_batch or _usable_cores()
        self.draft_model_path = Path(draft_model_path) if draft_model_path else None
        self.draft_max = draft_max
        self._n_ctx_req = n_ctx
        self.cache_type = cache_type  # the KV cache's element type: f16, q8_0, q4_0
        self._chat_template_override = chat_template
        self._tool_mode_req: ToolMode = tool_mode
        self.after_tool_result: AfterToolResult = after_tool_result
        self.tool_mode: Literal["native", "prompt"] = "native"
        self.cache_ram_mib = cache_ram_mib
        self.request_timeout_s = request_timeout_s
        self.verbosity = verbosity
        self.n_ubatch = n_ubatch
        self.prefill_tps: float | None = None  # the last stepped prompt's speed: prefill.py sizes steps by it
        self.n_batch = n_batch
        self.n_gpu_layers = n_gpu_layers
        #: a vision model's projector GGUF (vision.py): the server then takes image_url parts
        self.mmproj_path = Path(mmproj_path) if mmproj_path else None
        self._server: Any = None
        self._http: Any = None
        self._watcher = CancelWatcher()
        #: tests inject ``httpcore.MockBackend`` here; None = real sockets
        self.network_backend_factory: Callable[[], Any] | None = None
        self._lock = threading.Lock()
        self.base_url = ""
        self.context_length = 0
        self.props: dict[str, Any] = {}
        self._drafted = 0
        self._accepted = 0
        #: one rendering + tokenization per prompt, shared by the runner's count, the gate and prefill
        self.memo = PromptMemo()
        #: the template's own tokens for a conversation's shape (prompt_bound), by that shape
        self.shapes = PromptMemo()

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _params(self) -> Any:
        import xllamacpp as xlc  # heavy: loads the llama.cpp shared object

        p = xlc.CommonParams()
        p.model.path = str(self.model_path)
        if self.mmproj_path is not None:
            p.mmproj.path = str(self.mmproj_path)
        p.hostnames = ["127.0.0.1"]
        p.port = 0  # ephemeral, chosen by the server itself
        p.n_parallel = self.n_parallel
        p.cpuparams.n_threads = self.n_threads
        p.cpuparams_batch.n_threads = self.n_threads_batch
        if self.n_gpu_layers is not None:
            p.n_gpu_layers = self.n_gpu_layers
        if self.draft_model_path is not None and not self.embedding:
            draft = p.speculative.draft
            draft.mparams.path = str(self.draft_model_path)
            draft.n_max = self.draft_max
            draft.n_min = 0
            draft.cpuparams.n_threads = self.n_threads
            draft.cpuparams_batch.n_threads = self.n_threads_batch
            p.speculative.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        p.verbosity = self.verbosity
        # cpp-httplib serves one connection per thread; enough threads that queued streams are
        # read (and their disconnects noticed) instead of waiting unaccepted in the backlog
        p.n_threads_http = max(16, 4 * self.n_parallel)
        p.endpoint_props = True
        p.endpoint_slots = True
        p.endpoint_metrics = True
        p.ui = False
        p.cache_ram_mib = self.cache_ram_mib
        p.use_jinja = True
        if self.embedding:
            per_slot = self._n_ctx_req or self._model_context() or 512
            p.embedding = True
            if self.reranking:
                p.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
            p.kv_unified = False
            p.n_ctx = per_slot * self.n_parallel
            # non-causal models need a whole sequence in one micro-batch
            p.n_batch = per_slot
            p.n_ubatch = per_slot
            p.cache_prompt = False
        else:
            p.kv_unified = True
            # Batch-exact evaluation: speculative verification and a resume's prefill are batches
            # standing in for single decoding steps, and a greedy run keeps its text only if they
            # round exactly as those steps did. Measured on this CPU build (SmolLM2 and Qwen2.5 at
            # Q4_1): with flash attention, batches of up to 63 tokens give logits bit-identical to one
            # token at a time however the sequence is split; from 64 tokens on, or without flash
            # attention (35 of 42 rows differ), they do not. Hence flash attention always. The
            # micro-batch stays llama.cpp's own (512: prompts at full speed): a speculative check is a
            # batch of draft_max + 1 tokens anyway, and a resume feeds its streamed ids in batches of
            # EXACT_UBATCH (prefill.exact_steps) instead of narrowing every prompt's micro-batch to 32
            # (0.64x prefill). K-quant weights stay inexact in any batch: see models.BATCH_EXACT_TYPES.
            p.flash_attn_type = xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.n_ubatch:
                p.n_ubatch = self.n_ubatch
            if self.n_batch:
                p.n_batch = self.n_batch
            if self._n_ctx_req:
                p.n_ctx = self._n_ctx_req
            if self.cache_type != "f16":  # quantized K and V (V needs flash attention, on above)
                p.cache_type_k = p.cache_type_v = getattr(xlc.ggml_type, f"GGML_TYPE_{self.cache_type.upper()}")
            template = self._chat_template()
            if template is not None:
                p.chat_template = template
        return p

    def _chat_template(self) -> str | None:
        """The template the server must be given instead of the GGUF's own (None: keep the GGUF's), and
        `tool_mode` set from it."""
        gguf_template = read_gguf_chat_template(self.model_path)
        template = self._chat_template_override or gguf_template
        mode = self._tool_mode_req
        if mode == "auto":
            mode = "native" if template_supports_tools(template) else "prompt"
        if not template_supports_tools(template) and is_chatml(template):
            # without it llama.cpp drops `tools` silently and breaks on tool-call history
            template = chatml_tools_template(default_system_prompt(template))
        self.tool_mode = mode
        return template if template and template != gguf_template else None

    def _model_context(self) -> int | None:
        meta = read_gguf_metadata(self.model_path, ("general.architecture",))
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            return None
        ctx = read_gguf_metadata(self.model_path, (f"{arch}.context_length",)).get(f"{arch}.context_length")
        return int(ctx) if isinstance(ctx, int) else None

    def start(self) -> LlamaServer:
        import httpx
        import xllamacpp as xlc

        with self._lock:
            if self._server is not None:
                return self
            if self.draft_model_path is not None and not self.embedding:
                _warn_if_inexact(self.model_path)
            try:
                self._server = xlc.Server(self._params())
            except Exception as exc:  # xllamacpp raises RuntimeError on load failure
                raise BackendError(f"llama.cpp server failed to start: {exc}") from exc
            self.base_url = self._server.listening_address
            self._http = httpx.Client(
                base_url=self.base_url,
                timeout=httpx.Timeout(self.request_timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
        self.props = self._get("/props")
        settings = self.props.get("default_generation_settings") or {}
        self.context_length = int(settings.get("n_ctx") or self.props.get("n_ctx") or 0)
        return self

    def close(self) -> None:
        """Stop the server (joins its threads) and free the model."""
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None
            server, self._server = self._server, None
        self._watcher.stop()
        self._watcher = CancelWatcher()
        del server  # xllamacpp stops its loop in the destructor

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- small helpers ---------------------------------------------------------------------

    def _client(self) -> Any:
        if self._http is None:
            raise BackendError("llama.cpp server is not running")
        return self._http

    def _get(self, path: str) -> dict[str, Any]:
        r = self._client().get(path)
        if r.status_code != 200:
            raise BackendError(f"GET {path}: {r.status_code} {r.text[:300]}", r.status_code)
        return r.json()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._client().post(path, json=body)
        if r.status_code != 200:
            raise _error_from(r.status_code, r.text)
        return r.json()

    def speculative_stats(self) -> dict[str, int]:
        """Tokens the draft model proposed and the model kept, summed over every finished request."""
        with self._lock:
            return {"drafted": self._drafted, "accepted": self._accepted}

    def slots(self) -> list[dict[str, Any]]:
        """llama.cpp's slot table (is_processing, n_ctx, ...) -- for tests and telemetry."""
        data = self._client().get("/slots").json()
        return data if isinstance(data, list) else []

    # -- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return [
            t if isinstance(t, int) else t["id"]
            for t in self._post("/tokenize", {"content": text, "add_special": add_special})["tokens"]
        ]

    def apply_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> str:
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        return self._post("/apply-template", body)["prompt"]

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The token ids of this conversation's prompt as the chat endpoint renders it (memoized)."""
        return self.memo.ids(
            [messages, tools], lambda: self.tokenize(self.apply_template(messages, tools), add_special=True)
        )

    def prompt_bound(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """At least as many tokens as this conversation's prompt, found without rendering or tokenizing it.

        The template's own tokens depend on the conversation's shape (roles, tool calls, tools), not
        on what the messages say: the shape is rendered and tokenized once with every text content
        one byte long (so no ``if content`` branch is skipped) and memoized. A content's tokens are
        at most its bytes (a token is never shorter than a byte); two more a message cover a
        content's edges merging with the template's text differently. None for non-text content.
        """
        contents = [m.get("content") for m in messages]
        if any(c is not None and not isinstance(c, str) for c in contents):
            return None
        shape = [{**m, "content": "x"} if isinstance(m.get("content"), str) else m for m in messages]
        head = len(self.shapes.ids([shape, tools], lambda: self.tokenize(self.apply_template(shape, tools), True)))
        return head + sum(len(c.encode()) for c in contents if c) + 2 * len(messages)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Prompt tokens this conversation would take (for context-limit checks)."""
        return len(self.prompt_ids(messages, tools))

    def prefill(self, ids: Sequence[int]) -> Iterator[int]:
        """Cache a long prompt's ids in timed steps (see :mod:`.prefill`); yields tokens cached so far."""
        # steps end where time says (a cancel waits at most about one step); with n_ubatch set they end
        # on its grid, so a long prompt is cut into the same micro-batches stepped or whole
        return prefill_steps(self, ids, grid=self.n_ubatch or 1)

    # -- embeddings ------------------------------------------------------------------------

    def embed(self, texts: list[str], truncate: bool = True, max_tokens: int | None = None) -> list[list[float]]:
        """L2-normalised embeddings, in input order.

        llama.cpp refuses an input longer than the per-slot context (512 for MiniLM) instead of
        truncating it, so with ``truncate`` we cut such inputs to ``max_tokens`` (default: the
        context) keeping the final [SEP], and send token ids. sentence-transformers itself cuts
        all-MiniLM-L6-v2 at 256 tokens: pass max_tokens=256 for identical long-text vectors.
        """
        if not self.embedding:
            raise BackendError("this server was not started in embedding mode")
        if not texts:
            return []
        limit = min(max_tokens or self.context_length, self.context_length)
        inputs: list[str | list[int]] = list(texts)
        if truncate:
            for i, text in enumerate(texts):
                if len(text) + 2 <= limit:
                    continue  # every token covers at least one character
                ids = self.tokenize(text, add_special=True)
                if len(ids) > limit:
                    inputs[i] = ids[: limit - 1] + ids[-1:]
        data = self._post("/v1/embeddings", {"input": inputs})["data"]
        data.sort(key=lambda d: d["index"])
        return [_normalize([float(v) for v in d["embedding"]]) for d in data]

    def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """A relevance score per document, in the given order, and the tokens read (query + document pairs).

        llama.cpp answers sorted by score; the caller (the API) sorts and cuts (`top_n`) itself.
        """
        if not self.reranking:
            raise BackendError("this server was not started for reranking")
        got = self._post("/v1/rerank", {"query": query, "documents": documents, "top_n": len(documents)})
        scores = [0.0] * len(documents)
        for item in got["results"]:
            scores[int(item["index"])] = float(item["relevance_score"])
        usage = got.get("usage") or {}
        return scores, int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)

    # -- generation ------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        sampling: dict[str, Any] | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        cancel: CancelCheck | None = None,
        constraint: Constraint | None = None,
        enable_thinking: bool | None = None,
        token_ids: bool = False,
        continue_ids: Sequence[int] = (),
    ) -> Iterator[Event]:
        """Stream one chat completion as TextDelta / ReasoningDelta / ToolCallDelta events and a Finish.

        ``constraint`` forces a call of an offered tool or a JSON answer (a grammar, see
        :mod:`.constraints`; a JSON format drops the tools); ``enable_thinking`` reaches the chat
        template. Raises ContextLengthExceeded / BackendError (before or during the stream). When
        ``cancel()`` returns True the stream is closed and the iterator ends without a Finish.

        ``token_ids`` puts each text delta's token ids on it (plain answers; a tool or reasoning
        stream has none), read from llama.cpp's logprobs: about 3% of decode speed, so only asked
        for when a resume may need them. ``continue_ids`` (a resume) are the ids of the output
        already streamed, which the trailing assistant message spells as text: the answer goes on
        from the prompt's tokens plus those ids, exactly the state the interrupted run had, instead
        of from a re-tokenized prefill (see :meth:`_continuation_prompt`).
        """
        if self.embedding:
            raise BackendError("this server is in embedding mode")
        constraint = constraint or Constraint()
        if constraint.response_format is not None:
            tools = None
        body: dict[str, Any] = {k: v for k, v in (sampling or {}).items() if k in SAMPLING_KEYS and v is not None}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        want_ids = token_ids and not tools
        if logprobs or want_ids:
            body["logprobs"] = True
            body["top_logprobs"] = max(1, top_logprobs)  # llama.cpp needs >= 1 to send any
        continued = None
        if continue_ids and not tools and constraint.response_format is None:
            continued = self._continuation_prompt(messages, continue_ids, enable_thinking)
        if continued is not None:
            head = len(continued) - len(continue_ids)
            for _ in exact_steps(self, continued, head, EXACT_UBATCH):
                if cancel is not None and cancel():
                    return iter(())
            body["prompt"] = continued
            _as_completion_logprobs(body)
            return self._stream("/v1/completions", body, None, logprobs, top_logprobs > 0, cancel, None, want_ids)
        tool_names = [t.get("function", t).get("name") for t in tools] if tools else None
        forced = constraint.forced_name
        started_inside = False
        answer_turn = (
            self.after_tool_result == "answer"
            and not constraint.forces_call
            and bool(messages)
            and messages[-1].get("role") == "tool"
        )
        try:
            # Our own prompt + grammar whenever llama.cpp's tool handling cannot do what is asked: a
            # template without tools, a forced call (llama.cpp's `tool_choice: required` does not
            # constrain every template), or the answer after a tool result (see after_tool_result).
            if tools and (self.tool_mode == "prompt" or constraint.forces_call or answer_turn):
                body["prompt"] = self.apply_template(messages, None if answer_turn else tools, enable_thinking)
                started_inside = body["prompt"].rstrip().endswith(THINK_OPEN)
                _as_completion_logprobs(body)
                body["stop"] = [*list(body.get("stop") or []), STOP_MARKERS[0]]
                if constraint.forces_call:
                    body["grammar"] = lark_call(call_schema(tools, forced))
                elif answer_turn:
                    body["grammar"] = LARK_PROSE_START
                path = "/v1/completions"
            else:
                body["messages"] = messages
                if tools:
                    body["tools"] = tools
                if constraint.response_format is not None:
                    body["grammar"] = lark_json(format_schema(constraint.response_format))
                if enable_thinking is not None:
                    body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
                path = "/v1/chat/completions"
        except ValueError as exc:
            raise BackendError(str(exc), 400) from exc
        parser = ToolCallStreamParser(tool_names) if tools else None
        thinker = ThinkSplitter(started_inside)
        return self._stream(path, body, parser, logprobs, top_logprobs > 0, cancel, thinker, want_ids)

    def _continuation_prompt(
        self, messages: list[dict[str, Any]], ids: Sequence[int], enable_thinking: bool | None
    ) -> list[int] | None:
        """The prompt, as token ids, that continues a resumed answer exactly; None: use the text.

        The conversation is rendered as llama.cpp renders a trailing assistant message (the answer
        so far, not closed); that text minus the streamed text is the original prompt, whose
        tokens plus the streamed ids are the interrupted run's own sequence. With flash attention
        the server's batched evaluation of them rounds exactly as one token at a time did (see
        ``_params``), so a greedy answer goes on as if never cut. Re-tokenizing the text instead
        can split it differently (a model does not always emit the canonical split) and then drift.
        Falls back (None) whenever the ids do not spell the message's end, e.g. after reasoning.
        """
        if not messages or messages[-1].get("role") != "assistant":
            return None
        streamed = self._post("/detokenize", {"tokens": list(ids)}).get("content")
        rendered = self.apply_template(messages, None, enable_thinking)
        if not isinstance(streamed, str) or not streamed or not rendered.endswith(streamed):
            log.warning("continuing from text: the %d streamed ids do not spell the message's end", len(ids))
            return None
        head = rendered[: len(rendered) - len(streamed)]
        return self.tokenize(head, add_special=True) + list(ids)

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        parser: ToolCallStreamParser | None,
        want_logprobs: bool,
        keep_top: bool,
        cancel: CancelCheck | None,
        thinker: ThinkSplitter | None = None,
        want_ids: bool = False,
    ) -> Iterator[Event]:
        self._client()  # raises if the server is not running
        finish_reason: str | None = None
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        native_calls: dict[int, dict[str, str]] = {}
        pending_lp: list[TokenLogprob] = []
        calls_seen = 0

        def emit(items: list[Any]) -> Iterator[Event]:
            nonlocal calls_seen, pending_lp
            for item in items:
                if isinstance(item, str):
                    lp = tuple(pending_lp) if want_logprobs else None
                    pending_lp = []
                    yield TextDelta(item, lp)
                else:
                    calls_seen += 1
                    pending_lp = []  # those tokens were the call's, not prose
                    yield item

        stream = AbortableStream(
            self.base_url,
            path,
            json.dumps(body).encode(),
            self.request_timeout_s,
            self.network_backend_factory() if self.network_backend_factory else None,
        )
        key = self._watcher.add(cancel, stream) if cancel is not None else None
        try:
            try:
                status = stream.open()
                if status != 200:
                    raise _error_from(status, stream.read_all())
                lines = stream.lines()
            except BackendError:
                raise
            except Exception as exc:
                if stream.aborted:
                    return  # cancelled while queued / evaluating the prompt
                raise BackendError(f"llama.cpp server stream failed: {exc!r}") from exc
            while True:
                if cancel is not None and cancel():
                    return  # the finally-block closes the connection -> slot released
                try:
                    line = next(lines)
                except StopIteration:
                    break
                except Exception as exc:
                    if stream.aborted:
                        return
                    raise BackendError(f"llama.cpp server stream broke: {exc!r}") from exc
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    err = chunk["error"]
                    raise _error_from(int(err.get("code") or 500), json.dumps(err))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("timings"):
                    timings = chunk["timings"]
                quiet = False  # this line's tokens showed nothing (a tool call, held-back text)
                for choice in chunk.get("choices") or ():
                    text = choice.get("text")
                    delta = choice.get("delta") or {}
                    if text is None:
                        text = delta.get("content")
                    lps = _logprobs_from(choice, keep_top) if want_logprobs or want_ids else None
                    ids = tuple(lp.id for lp in lps or () if lp.id is not None) if want_ids else ()
                    if not want_logprobs:
                        lps = None
                    if delta.get("reasoning_content"):
                        ids = ()  # reasoning took tokens the text does not spell: no exact resume
                        yield ReasoningDelta(delta["reasoning_content"])
                    if text and thinker is not None:
                        pieces = thinker.feed(text)
                        text = "".join(t for r, t in pieces if not r)
                        for r, t in pieces:
                            if r:
                                ids = ()
                                yield ReasoningDelta(t)
                    for tc in delta.get("tool_calls") or ():
                        slot = native_calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                        fn = tc.get("function") or {}
                        slot["id"] = tc.get("id") or slot["id"]
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                        quiet = True
                    if parser is None:
                        if text or ids:  # a token whose UTF-8 is not complete yet: ids, no text
                            yield TextDelta(text or "", lps, ids)
                    elif text:
                        if lps:
                            pending_lp.extend(lps)
                        items = parser.feed(text)
                        quiet = quiet or not items
                        yield from emit(items)
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
                if quiet:
                    yield Working()
        finally:
            if key is not None:
                self._watcher.remove(key)
            stream.close()
        if thinker is not None:
            for r, t in thinker.finish():
                if r:
                    yield ReasoningDelta(t)
                elif parser is None:
                    yield TextDelta(t, None)
                else:
                    yield from emit(parser.feed(t))
        if parser is not None:
            yield from emit(parser.finish())
        for _, call in sorted(native_calls.items()):
            calls_seen += 1
            yield ToolCallDelta(call["id"] or new_call_id(), call["name"], call["arguments"] or "{}")
        if timings.get("draft_n"):
            with self._lock:
                self._drafted += int(timings["draft_n"])
                self._accepted += int(timings.get("draft_n_accepted") or 0)
        reason: FinishReason
        if calls_seen:
            reason = "tool_calls"
        elif finish_reason == "length":
            reason = "length"
        else:
            reason = "stop"
        yield Finish(
            reason,
            int(usage.get("prompt_tokens") or timings.get("prompt_n") or 0),
            int(usage.get("completion_tokens") or timings.get("predicted_n") or 0),
            timings,
        )


def _as_completion_logprobs(body: dict[str, Any]) -> None:
    """/v1/completions takes logprobs as a candidate count, not chat's flag plus top_logprobs."""
    if body.get("logprobs"):
        body["logprobs"] = max(1, int(body.pop("top_logprobs", 1)))


def _warn_if_inexact(model_path: Path) -> None:
    """Speculative greedy text equals plain decoding only with batch-exact weights: say so once."""
    from .models import BATCH_EXACT_TYPES, weight_types

    try:
        inexact = weight_types(model_path) - BATCH_EXACT_TYPES
    except Exception:  # an unreadable header fails the load itself, with a better message
        return
    if inexact:
        log.warning(
            "%s has %s weights, whose batched CPU kernels round differently from single tokens: "
            "speculative greedy text may part from plain decoding at near-ties (a Q4_1 or Q8_0 file keeps it exact)",
            model_path.name,
            "/".join(sorted(inexact)),
        )


def _error_from(status: int, text: str) -> BackendError:
    try:
        err = json.loads(text)
        err = err.get("error", err) if isinstance(err, dict) else {}
    except ValueError:
        err = {}
    message = str(err.get("message") or text[:500])
    low = message.lower()
    if (
        err.get("type") == "exceed_context_size_error"
        or "too large to process" in low
        or ("context" in low and ("exceed" in low or "too long" in low))
    ):
        return ContextLengthExceeded(message, status)
    return BackendError(message, status)
