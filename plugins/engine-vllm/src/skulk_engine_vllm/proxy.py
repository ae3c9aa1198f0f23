"""An EngineSession that proxies an OpenAI-compatible server: kernel params in, kernel chunks out.

Why raw ``http.client`` for streams: a server may send no response headers until the first token
exists (llama.cpp does, while a prompt is evaluated), and closing an httpx client from another
thread does not wake a ``recv`` blocked on Linux. ``socket.shutdown`` does. So each stream is one
``http.client`` connection whose socket the :class:`CancelWatcher` shuts down the moment the
caller's ``cancelled()`` turns true: the server sees the closed request and stops decoding it.
Everything that is not a stream (tokenize, embeddings) goes through one pooled httpx client.

Tool calls arrive as OpenAI ``delta.tool_calls`` fragments (the server's own tool parser did the
parsing); they are joined per index and sent whole in the terminal :class:`ToolCallChunk`, as the
wire checklist asks. While a call is being written nothing reaches the client, so the session sends
an empty chunk every ``KEEPALIVE_S``: a call written for two minutes would otherwise read as a dead
runner to the API node's idle timeout (120 s).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import httpx
from skulk_kernel.api import (
    Chunk,
    EmbeddingChunk,
    EmbeddingParams,
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

CONTEXT_WORDS = ("maximum context length", "context length", "too long", "exceed")
KEEPALIVE_S = 5.0


class ServerGone(RuntimeError):
    """The managed server is not running (the message says why)."""


def to_messages(params: TextGenerationParams) -> list[dict[str, Any]]:
    return [m.template_dict() for m in params.messages]


def to_tools(params: TextGenerationParams) -> list[dict[str, Any]] | None:
    if not params.tools or params.tool_choice == "none":
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
    body = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "seed": s.seed,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_tokens": s.max_tokens,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos or None,  # vLLM's sampling extension
    }
    return {k: v for k, v in body.items() if v is not None}


class PromptCounter(Protocol):
    """How a given server counts a conversation's prompt tokens (servers differ here)."""

    def count(self, http: httpx.Client, model: str, params: TextGenerationParams) -> int: ...


class VllmCounter:
    """vLLM's ``POST /tokenize`` renders the chat template itself and answers ``count``."""

    def count(self, http: httpx.Client, model: str, params: TextGenerationParams) -> int:
        if params.completion is not None and params.completion.prompt_ids:
            return len(params.completion.prompt_ids)
        body: dict[str, Any] = {"model": model}
        if params.raw_prompt is not None:
            body["prompt"] = params.raw_prompt
        else:
            body["messages"] = to_messages(params)
            body["add_generation_prompt"] = True
            if tools := to_tools(params):
                body["tools"] = tools
        r = http.post("/tokenize", json=body)
        r.raise_for_status()
        return int(r.json()["count"])


class LlamaServerCounter:
    """llama.cpp's server: ``/apply-template`` renders, ``/tokenize`` counts."""

    def count(self, http: httpx.Client, model: str, params: TextGenerationParams) -> int:
        if params.completion is not None and params.completion.prompt_ids:
            return len(params.completion.prompt_ids)
        prompt = params.raw_prompt
        if prompt is None:
            r = http.post("/apply-template", json={"messages": to_messages(params)})
            r.raise_for_status()
            prompt = str(r.json()["prompt"])
        r = http.post("/tokenize", json={"content": prompt, "add_special": True})
        r.raise_for_status()
        return len(r.json()["tokens"])


class CancelWatcher:
    """One thread for all streams of a session: polls each `cancelled()` and shuts its socket down."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._watched: dict[int, tuple[Callable[[], bool], socket.socket]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0

    def add(self, cancelled: Callable[[], bool], sock: socket.socket) -> int:
        with self._lock:
            self._next += 1
            self._watched[self._next] = (cancelled, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="cancel-watcher")
                self._thread.start()
            return self._next

    def remove(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self._lock:
                items = list(self._watched.items())
            for key, (cancelled, sock) in items:
                try:
                    hit = cancelled()
                except Exception:
                    hit = True
                if hit:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    self.remove(key)


def _logprobs(choice: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    found = choice.get("logprobs") or {}
    if "tokens" in found:  # /v1/completions' legacy shape: parallel lists, top alternatives as {token: logprob}
        tops = found.get("top_logprobs") or []
        return tuple(
            TokenLogprob(
                token=token,
                logprob=float(lp if lp is not None else 0.0),
                bytes=tuple(token.encode()),
                top_logprobs=tuple(
                    TopLogprob(token=t, logprob=float(v), bytes=tuple(t.encode()))
                    for t, v in ((tops[i] if i < len(tops) else None) or {}).items()
                ),
            )
            for i, (token, lp) in enumerate(zip(found["tokens"], found.get("token_logprobs") or [], strict=False))
        )
    content = found.get("content") or ()
    return tuple(
        TokenLogprob(
            token=e.get("token", ""),
            logprob=float(e.get("logprob", 0.0)),
            bytes=tuple(e.get("bytes") or e.get("token", "").encode()),
            top_logprobs=tuple(
                TopLogprob(
                    token=t.get("token", ""),
                    logprob=float(t.get("logprob", 0.0)),
                    bytes=tuple(t.get("bytes") or t.get("token", "").encode()),
                )
                for t in e.get("top_logprobs") or ()
            ),
        )
        for e in content
    )


def error_message(status: int, text: str) -> tuple[str, bool]:
    """(message, is_context_overflow) from an OpenAI-style or vLLM-style error body."""
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
    err = data.get("error", data) if isinstance(data, dict) else {}
    message = str((err.get("message") if isinstance(err, dict) else None) or text[:500] or f"HTTP {status}")
    low = message.lower()
    overflow = status == 400 and "context" in low and any(w in low for w in CONTEXT_WORDS)
    return message, overflow


class OpenAIServerSession:
    """One loaded model behind a managed OpenAI-compatible server, as a kernel EngineSession.

    `alive()` returns None while the server runs, else why it is gone: a stream that breaks then
    ends with that reason, and new requests are refused with it at once.
    """

    ignores_eos = True  # vLLM's OpenAI server takes `ignore_eos` (to_sampling passes it)
    # text completions: the prompt (text or token ids) through the server's `/v1/completions`; what
    # only llama.cpp's native endpoints give (fill-in-the-middle, the echoed prompt) is refused: see
    # `unserved_completion`
    serves_completions = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tag: str,
        engine_label: str,
        counter: PromptCounter,
        alive: Callable[[], str | None] = lambda: None,
        close: Callable[[], None] = lambda: None,
        extra_body: dict[str, Any] | None = None,
        request_timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.tag = tag
        self.engine_label = engine_label
        self.counter = counter
        self.alive = alive
        self._close = close
        self.extra_body = extra_body or {}
        self.request_timeout_s = request_timeout_s
        # the servers' uvicorn closes an idle connection after 5 s: the pool lets its own go first, so
        # a request seldom takes one the server is closing (a CI run's 500 "Server disconnected")
        limits = httpx.Limits(keepalive_expiry=2.0)
        self.http = httpx.Client(
            base_url=base_url, timeout=httpx.Timeout(request_timeout_s, connect=10.0), limits=limits
        )
        self.watcher = CancelWatcher()
        split = httpx.URL(base_url)
        self._host, self._port = split.host, int(split.port or 80)

    # ------------------------------------------------------------------ contract

    def count_tokens(self, params: TextGenerationParams) -> int:
        if (gone := self.alive()) is not None:
            raise ServerGone(gone)
        try:
            return self.counter.count(self.http, self.model, params)
        except httpx.RemoteProtocolError:  # a pooled connection closed as it was taken; counting is idempotent
            return self.counter.count(self.http, self.model, params)

    def embed(self, command_id: str, params: EmbeddingParams) -> Chunk:
        if (gone := self.alive()) is not None:
            return ErrorChunk(command_id=command_id, seq=0, message=gone, code="engine_died")
        r = self.http.post("/v1/embeddings", json={"model": self.model, "input": list(params.inputs)})
        if r.status_code != 200:
            message, overflow = error_message(r.status_code, r.text)
            return self._error(command_id, 0, message, overflow)
        body = r.json()
        data = sorted(body["data"], key=lambda d: d["index"])
        return EmbeddingChunk(
            command_id=command_id,
            seq=0,
            embeddings=tuple(tuple(float(v) for v in d["embedding"]) for d in data),
            finish_reason="stop",
            usage=Usage(prompt_tokens=int((body.get("usage") or {}).get("prompt_tokens") or 0)),
        )

    def close(self) -> None:
        self.http.close()
        self._close()

    # ------------------------------------------------------------------ generation

    def _body(self, params: TextGenerationParams) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            **to_sampling(params),
            **self.extra_body,
        }
        if params.completion is not None and params.completion.prompt_ids:
            body["prompt"] = list(params.completion.prompt_ids)
        elif params.raw_prompt is not None:
            body["prompt"] = params.raw_prompt
        if "prompt" in body:
            if params.logprobs:
                body["logprobs"] = max(1, params.top_logprobs)
            return "/v1/completions", body
        body["messages"] = to_messages(params)
        if tools := to_tools(params):
            body["tools"] = tools
            if params.tool_choice in ("auto", "required"):
                body["tool_choice"] = params.tool_choice
        if params.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = params.top_logprobs
        return "/v1/chat/completions", body

    def unserved_completion(self, params: TextGenerationParams) -> str | None:
        """Why this text completion cannot be served here (a 400 that says where it can), or None.

        The OpenAI-style server streams only generated text: no FIM template of ours, no prompt
        token ids to echo (a resume or `echo` needs them), so these go to llama.cpp's engine.
        """
        c = params.completion
        if c is None:
            return None
        asked = [
            name
            for name, on in (("suffix", c.suffix is not None), ("echo", c.echo), ("max_tokens 0", not c.generate))
            if on
        ]
        if not asked:
            return None
        return (
            f"{' and '.join(asked)}: text completions on engine {self.engine_label} serve the prompt and its "
            "continuation only; place the model on engine llamacpp for fill-in-the-middle and echo"
        )

    def _error(self, command_id: str, seq: int, message: str, overflow: bool = False) -> ErrorChunk:
        if overflow:
            return ErrorChunk(
                command_id=command_id,
                seq=seq,
                message=f"context_length_exceeded: {message}",
                error_type="invalid_request_error",
                code="context_length_exceeded",
            )
        return ErrorChunk(
            command_id=command_id, seq=seq, message=f"{self.engine_label}: {message}", code="engine_error"
        )

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        if (gone := self.alive()) is not None:
            yield ErrorChunk(command_id=command_id, seq=0, message=gone, code="engine_died")
            return
        if (refused := self.unserved_completion(params)) is not None:
            yield ErrorChunk(
                command_id=command_id,
                seq=0,
                message=refused,
                error_type="invalid_request_error",
                code="invalid_request",
            )
            return
        path, body = self._body(params)
        started = time.perf_counter()
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.request_timeout_s)
        key: int | None = None
        try:
            try:
                conn.connect()
                assert conn.sock is not None
                key = self.watcher.add(cancelled, conn.sock)
                payload = json.dumps(body).encode()
                conn.request("POST", path, payload, {"Content-Type": "application/json", "Accept": "text/event-stream"})
                resp = conn.getresponse()
            except OSError as exc:
                if cancelled():
                    yield TokenChunk(command_id=command_id, seq=0, text="", finish_reason="cancelled")
                    return
                yield self._broken(command_id, 0, exc)
                return
            if resp.status != 200:
                message, overflow = error_message(resp.status, resp.read().decode(errors="replace"))
                yield self._error(command_id, 0, message, overflow)
                return
            yield from self._relay(command_id, resp, cancelled, started)
        finally:
            if key is not None:
                self.watcher.remove(key)
            conn.close()

    def _broken(self, command_id: str, seq: int, exc: BaseException) -> ErrorChunk:
        gone = self.alive()
        if gone is not None:
            return ErrorChunk(command_id=command_id, seq=seq, message=gone, code="engine_died")
        return ErrorChunk(
            command_id=command_id,
            seq=seq,
            message=f"{self.engine_label}: the stream broke: {type(exc).__name__}: {exc}",
            code="engine_error",
        )

    def _relay(
        self, command_id: str, resp: http.client.HTTPResponse, cancelled: Callable[[], bool], started: float
    ) -> Iterator[Chunk]:
        seq = 0
        first_at: float | None = None
        finish: str | None = None
        usage: dict[str, Any] = {}
        calls: dict[int, dict[str, str]] = {}
        done = False
        said = time.perf_counter()  # when the client last got a chunk
        while True:
            try:
                raw = resp.readline()
            except (OSError, http.client.HTTPException) as exc:
                if cancelled():
                    break
                yield self._broken(command_id, seq, exc)
                return
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                err = event["error"]
                message = str(err.get("message") if isinstance(err, dict) else err)
                yield self._error(command_id, seq, message)
                return
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                text = choice.get("text") if "text" in choice else delta.get("content")
                for tc in delta.get("tool_calls") or ():
                    slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    slot["id"] = tc.get("id") or slot["id"]
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    first_at = first_at or time.perf_counter()
                    yield TokenChunk(command_id=command_id, seq=seq, text=reasoning, reasoning=True)
                    seq += 1
                if text:
                    first_at = first_at or time.perf_counter()
                    yield TokenChunk(command_id=command_id, seq=seq, text=text, logprobs=_logprobs(choice))
                    seq += 1
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
                if reasoning or text:
                    said = time.perf_counter()
                elif delta.get("tool_calls") and (now := time.perf_counter()) - said >= KEEPALIVE_S:
                    said = now  # a call being written: an empty chunk keeps the stream alive
                    yield TokenChunk(command_id=command_id, seq=seq, text="")
                    seq += 1
            if cancelled():
                break
        if not done and cancelled():
            yield TokenChunk(command_id=command_id, seq=seq, text="", finish_reason="cancelled")
            return
        if not done and finish is None:
            yield self._broken(command_id, seq, EOFError("the server closed the stream before [DONE]"))
            return
        yield self._final(command_id, seq, finish, usage, calls, started, first_at)

    def _final(
        self,
        command_id: str,
        seq: int,
        finish: str | None,
        usage: dict[str, Any],
        calls: dict[int, dict[str, str]],
        started: float,
        first_at: float | None,
    ) -> Chunk:
        now = time.perf_counter()
        prompt_n = int(usage.get("prompt_tokens") or 0)
        gen_n = int(usage.get("completion_tokens") or 0)
        decode_s = max(now - (first_at or now), 1e-9)
        stats = GenerationStats(
            prompt_tokens=prompt_n,
            generation_tokens=gen_n,
            generation_tps=max(gen_n - 1, 0) / decode_s,
            ttft_ms=round(((first_at or now) - started) * 1000, 2),
            backend=self.tag,
        )
        used = Usage(prompt_tokens=prompt_n, completion_tokens=gen_n)
        if calls:
            tool_calls = tuple(
                ToolCall(id=c["id"] or f"call_{command_id[:8]}_{i}", name=c["name"], arguments=c["arguments"] or "{}")
                for i, c in sorted(calls.items())
            )
            return ToolCallChunk(
                command_id=command_id, seq=seq, calls=tool_calls, finish_reason="tool_calls", usage=used, stats=stats
            )
        reason = "length" if finish == "length" else "stop"
        return TokenChunk(command_id=command_id, seq=seq, text="", finish_reason=reason, usage=used, stats=stats)
