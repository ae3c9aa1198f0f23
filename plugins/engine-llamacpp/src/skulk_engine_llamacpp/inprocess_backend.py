"""The ``llama_cpp`` backend: llama-cpp-python's ``Llama`` in this process, one request at a time.

Why keep it next to the server backend: it needs no HTTP hop and no extra threads, loads in
~0.2 s, and is the reference the server's output is compared with. Its limits shape the code:

* ``Llama`` is not thread-safe, so a lock serialises requests (the runner admits one at a time).
* Logprobs need ``logits_all=True``, which allocates ``n_ctx * n_vocab * 4`` bytes of scores
  (8192 x 49152 -> 1.6 GB for SmolLM2) and computes logits for every prompt token; it is
  therefore an init option (``logprobs_capable``), not a per-request switch.
* Tools: llama-cpp-python only parses calls for a few hard-coded chat formats, so for requests
  with tools we render the prompt ourselves (the GGUF template if it knows tools, otherwise
  :func:`.templates.chatml_tools_template`), call ``create_completion`` and parse the text with
  :mod:`.toolcalls` -- the same contract as the server backend's "prompt" mode.
* Cancel: we stop pulling from llama-cpp-python's generator and close it; decoding stops there.

The package has no wheels on PyPI; it builds from source (see the plugin README/report).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .constraints import Constraint, call_schema, format_schema, gbnf_call, gbnf_json
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
    TopLogprob,
)
from .reasoning import OPEN as THINK_OPEN
from .reasoning import ThinkSplitter
from .templates import (
    chatml_tools_template,
    default_system_prompt,
    is_chatml,
    render,
    template_supports_tools,
)
from .toolcalls import STOP_MARKERS, ToolCallStreamParser

_SAMPLING_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_tokens": "max_tokens",
    "stop": "stop",
}


def _chat_logprobs(choice: dict[str, Any], keep_top: bool) -> tuple[TokenLogprob, ...] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    return tuple(
        TokenLogprob(
            e["token"],
            float(e["logprob"]),
            None,
            tuple(TopLogprob(t["token"], float(t["logprob"])) for t in e.get("top_logprobs") or ()) if keep_top else (),
        )
        for e in content
    )


def _completion_logprobs(choice: dict[str, Any], keep_top: bool) -> tuple[TokenLogprob, ...] | None:
    lp = choice.get("logprobs")
    if not lp or not lp.get("tokens"):
        return None
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return tuple(
        TokenLogprob(
            tok, float(val), None, tuple(TopLogprob(k, float(v)) for k, v in (top or {}).items()) if keep_top else ()
        )
        for tok, val, top in zip(lp["tokens"], lp["token_logprobs"], tops, strict=False)
    )


class LlamaInProcess:
    """One GGUF chat model in llama-cpp-python. Same event contract as ``LlamaServer.chat``."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_threads: int = 1,
        n_ctx: int | None = None,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        logprobs_capable: bool = False,
        chat_template: str | None = None,
        n_gpu_layers: int = 0,
    ) -> None:
        self.model_path = Path(model_path)
        self.n_threads = n_threads
        self._n_ctx_req = n_ctx
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.logprobs_capable = logprobs_capable
        self.n_gpu_layers = n_gpu_layers  # layers on the GPU of a GPU build (0: all on the CPU)
        self._template_override = chat_template
        self._llm: Any = None
        self._lock = threading.Lock()
        self.context_length = 0
        self.chat_template: str | None = None
        self.tools_template: str | None = None

    def __enter__(self) -> LlamaInProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> LlamaInProcess:
        from llama_cpp import Llama  # heavy import (loads libllama)

        with self._lock:
            if self._llm is not None:
                return self
            try:
                llm = Llama(
                    str(self.model_path),
                    n_ctx=self._n_ctx_req or 0,
                    n_batch=self.n_batch,
                    n_ubatch=self.n_ubatch or min(self.n_batch, 512),
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    logits_all=self.logprobs_capable,
                    n_gpu_layers=self.n_gpu_layers,
                    verbose=False,
                )
            except Exception as exc:
                raise BackendError(f"llama-cpp-python failed to load the model: {exc}") from exc
            self._llm = llm
            self.context_length = llm.n_ctx()
            template = self._template_override or llm.metadata.get("tokenizer.chat_template")
            self.chat_template = template
            if template_supports_tools(template):
                self.tools_template = template
            elif is_chatml(template) or template is None:
                self.tools_template = chatml_tools_template(default_system_prompt(template))
        return self

    def close(self) -> None:
        with self._lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()

    def _model(self) -> Any:
        if self._llm is None:
            raise BackendError("model is not loaded")
        return self._llm

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self._model().tokenize(text.encode("utf-8"), add_bos=add_special, special=True))

    def render_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> str:
        llm = self._model()
        template = self.tools_template if tools else (self.chat_template or self.tools_template)
        if template is None:
            raise BackendError("model has no chat template and no tool template")
        eos = llm._model.token_get_text(llm.token_eos()) if llm.token_eos() >= 0 else ""
        bos = llm._model.token_get_text(llm.token_bos()) if llm.token_bos() >= 0 else ""
        extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        return render(template, messages, tools, add_generation_prompt=True, bos_token=bos, eos_token=eos, **extra)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return len(self.tokenize(self.render_prompt(messages, tools), add_special=True))

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
    ) -> Iterator[Event]:
        """Stream one completion. Holds the model lock for the whole stream: consume or close it.

        ``constraint`` / ``enable_thinking``: as in ``LlamaServer.chat`` (GBNF grammars here)."""
        if logprobs and not self.logprobs_capable:
            raise BackendError("logprobs need the model loaded with logprobs_capable=True")
        kwargs = {_SAMPLING_MAP[k]: v for k, v in (sampling or {}).items() if k in _SAMPLING_MAP and v is not None}
        kwargs.setdefault("max_tokens", None)  # llama-cpp-python's default is 16 (!)
        constraint = constraint or Constraint()
        grammar = None
        try:
            if constraint.response_format is not None:
                tools = None
                grammar = gbnf_json(format_schema(constraint.response_format))
            elif tools and constraint.forces_call:
                grammar = gbnf_call(call_schema(tools, constraint.forced_name))
        except ValueError as exc:
            raise BackendError(str(exc), 400) from exc
        if grammar is not None:
            from llama_cpp import LlamaGrammar

            kwargs["grammar"] = LlamaGrammar.from_string(grammar, verbose=False)
        return self._run(messages, tools, kwargs, logprobs, top_logprobs, cancel, enable_thinking)

    def _run(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        logprobs: bool,
        top_logprobs: int,
        cancel: CancelCheck | None,
        enable_thinking: bool | None = None,
    ) -> Iterator[Event]:
        with self._lock:
            llm = self._model()
            prompt = self.render_prompt(messages, tools, enable_thinking)
            thinker = ThinkSplitter(prompt.rstrip().endswith(THINK_OPEN))
            n_prompt = len(self.tokenize(prompt, add_special=True))
            if n_prompt >= self.context_length:
                raise ContextLengthExceeded(f"prompt has {n_prompt} tokens, context is {self.context_length}")
            parser = None
            if tools:
                names = [t.get("function", t).get("name") for t in tools]
                parser = ToolCallStreamParser(names)
                kwargs["stop"] = [*list(kwargs.get("stop") or []), STOP_MARKERS[0]]
                if logprobs:
                    kwargs["logprobs"] = max(1, top_logprobs)
                stream = llm.create_completion(prompt, stream=True, **kwargs)
                get_lp = _completion_logprobs
            elif enable_thinking is not None:
                # the prompt rendered here: llama-cpp-python's chat handler passes no template kwargs
                if logprobs:
                    kwargs["logprobs"] = max(1, top_logprobs)
                stream = llm.create_completion(prompt, stream=True, **kwargs)
                get_lp = _completion_logprobs
            else:
                if logprobs:
                    kwargs["logprobs"] = True
                    kwargs["top_logprobs"] = max(1, top_logprobs)
                stream = llm.create_chat_completion(messages, stream=True, **kwargs)
                get_lp = _chat_logprobs
            finish_reason = "stop"
            n_out = 0
            pending: list[TokenLogprob] = []
            calls = 0
            try:
                for chunk in stream:
                    if cancel is not None and cancel():
                        return
                    choice = chunk["choices"][0]
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content")
                    lps = get_lp(choice, top_logprobs > 0) if logprobs else None
                    if text or lps:
                        n_out += len(lps) if lps else 1
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
                    if text:
                        pieces = thinker.feed(text)
                        text = "".join(t for r, t in pieces if not r)
                        for r, t in pieces:
                            if r:
                                yield ReasoningDelta(t)
                    if not text:
                        continue
                    if parser is None:
                        yield TextDelta(text, lps)
                        continue
                    pending.extend(lps or ())
                    for item in parser.feed(text):
                        if isinstance(item, str):
                            yield TextDelta(item, tuple(pending) if logprobs else None)
                            pending = []
                        else:
                            calls += 1
                            pending = []  # those tokens were the call's, not prose
                            yield item
                tail = ""
                for r, t in thinker.finish():
                    if r:
                        yield ReasoningDelta(t)
                    else:
                        tail += t
                if tail and parser is None:
                    yield TextDelta(tail, None)
                if parser is not None:
                    for item in parser.feed(tail) + parser.finish():
                        if isinstance(item, str):
                            yield TextDelta(item, tuple(pending) if logprobs else None)
                            pending = []
                        else:
                            calls += 1
                            pending = []  # those tokens were the call's, not prose
                            yield item
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            # Chunks undercount when llama-cpp-python merges tokens of one UTF-8 character;
            # n_tokens (prompt + output, minus the last sampled token, never evaluated) doesn't.
            n_completion = n_out
            if n_out and not logprobs:
                n_completion = max(n_out, llm.n_tokens - n_prompt + 1)
            reason: FinishReason = "tool_calls" if calls else ("length" if finish_reason == "length" else "stop")
            yield Finish(reason, n_prompt, n_completion)
