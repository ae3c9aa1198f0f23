"""Streaming clients for the four wire formats, timing every token as it arrives.

One request = one fresh prompt (llama.cpp's server keeps a prompt cache), greedy (temperature 0).
A *token* is one content event of the stream (the node sends one event per engine token); the
usage block's completion-token count is recorded beside it. TTFT is measured from just before
the request is written to the arrival of the first non-empty content event; the decode rate is
``(tokens - 1) / (t_last - t_first)``, i.e. from token timestamps after the first token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

FORMATS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "ollama": "/api/chat",
}

TOPICS = (
    "a lighthouse keeper",
    "a river delta",
    "a clockmaker",
    "a mountain village",
    "an old library",
    "a desert caravan",
    "a city garden",
    "a night train",
    "a glass blower",
    "a fishing harbour",
    "a snowy observatory",
    "a street market",
    "a beekeeper",
    "a paper mill",
    "a jazz club",
    "a lost satellite",
    "a tea plantation",
    "a canal boat",
    "a volcano island",
    "a bakery at dawn",
)


def fresh_prompt(i: int, topic_index: int | None = None) -> str:
    """A unique prompt (the nonce comes first, so no two prompts share more than the template prefix)."""
    topic = TOPICS[(i if topic_index is None else topic_index) % len(TOPICS)]
    return (
        f"[{uuid.uuid4().hex[:12]}] Write a long, detailed story about {topic}. Describe the place, the "
        f"people and what happens over one whole day, in at least three paragraphs."
    )


def short_prompt(i: int) -> str:
    """A unique prompt of a dozen tokens (for TTFT probes: little prompt evaluation)."""
    return f"[{uuid.uuid4().hex[:12]}] Name a colour ({i})."


@dataclass
class StreamResult:
    ok: bool = False
    started_at: float = 0.0  # the clock's value when the request was sent
    status: int = 0
    error: str | None = None
    ttft_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # seconds since the request was sent
    end_s: float | None = None
    text: str = ""
    usage_tokens: int | None = None
    backend: str | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_times)

    @property
    def decode_span_s(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return self.token_times[-1] - self.token_times[0]

    @property
    def decode_tok_s(self) -> float | None:
        span = self.decode_span_s
        return (len(self.token_times) - 1) / span if span else None

    def brief(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 2),
            "tokens": self.n_tokens,
            "usage_tokens": self.usage_tokens,
            "decode_tok_s": None if self.decode_tok_s is None else round(self.decode_tok_s, 2),
            "end_s": None if self.end_s is None else round(self.end_s, 4),
            "backend": self.backend,
        }


def request_body(fmt: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    if fmt == "chat":
        return {
            "model": model,
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": messages,
            "stream_options": {"include_usage": True},
        }
    if fmt == "messages":
        return {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0, "messages": messages}
    if fmt == "responses":
        return {"model": model, "stream": True, "max_output_tokens": max_tokens, "temperature": 0, "input": prompt}
    if fmt == "ollama":
        return {
            "model": model,
            "stream": True,
            "messages": messages,
            "options": {"num_predict": max_tokens, "temperature": 0},
        }
    raise ValueError(f"unknown format {fmt!r}")


def _events(fmt: str, lines: Iterator[str], result: StreamResult) -> Iterator[str]:
    """Yield the text of each content event; fill usage/backend/error on the result."""
    if fmt == "ollama":  # NDJSON
        for line in lines:
            if not line:
                continue
            obj = json.loads(line)
            if "error" in obj:
                result.error = str(obj["error"])[:500]
                return
            text = (obj.get("message") or {}).get("content") or ""
            if text:
                yield text
            if obj.get("done"):
                result.usage_tokens = obj.get("eval_count")
        return
    for line in lines:
        if not line.startswith("data: "):
            if line.startswith(": generation_stats "):
                try:
                    result.backend = json.loads(line[len(": generation_stats ") :]).get("backend")
                except ValueError:
                    pass
            continue
        payload = line[6:]
        if payload == "[DONE]":
            return
        obj = json.loads(payload)
        if "error" in obj and fmt != "responses":
            result.error = json.dumps(obj["error"])[:500]
            return
        if fmt == "chat":
            for choice in obj.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text:
                    yield text
            if obj.get("usage"):
                result.usage_tokens = obj["usage"].get("completion_tokens")
        elif fmt == "messages":
            kind = obj.get("type")
            if kind == "content_block_delta":
                text = (obj.get("delta") or {}).get("text")
                if text:
                    yield text
            elif kind == "message_delta":
                result.usage_tokens = (obj.get("usage") or {}).get("output_tokens")
            elif kind == "error":
                result.error = json.dumps(obj.get("error"))[:500]
                return
        else:  # responses
            kind = obj.get("type")
            if kind == "response.output_text.delta":
                text = obj.get("delta")
                if text:
                    yield text
            elif kind in ("response.completed", "response.incomplete"):
                result.usage_tokens = ((obj.get("response") or {}).get("usage") or {}).get("output_tokens")
            elif kind in ("error", "response.failed"):
                result.error = json.dumps(obj)[:500]
                return


def stream_once(
    client: httpx.Client,
    base_url: str,
    fmt: str,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float = 300.0,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamResult:
    """One streamed request through the node's API; never raises for HTTP or stream errors."""
    result = StreamResult()
    body = json.dumps(request_body(fmt, model, prompt, max_tokens)).encode()
    headers = {"content-type": "application/json"}
    if fmt == "messages":
        headers["anthropic-version"] = "2023-06-01"
    t0 = result.started_at = clock()
    try:
        with client.stream("POST", base_url + FORMATS[fmt], content=body, headers=headers, timeout=timeout) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = response.read().decode("utf-8", "replace")[:500]
                result.end_s = clock() - t0
                return result
            texts = []
            for text in _events(fmt, response.iter_lines(), result):
                now = clock() - t0
                if result.ttft_s is None:
                    result.ttft_s = now
                result.token_times.append(now)
                texts.append(text)
            result.text = "".join(texts)
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:500]
    result.end_s = clock() - t0
    result.ok = result.error is None and result.n_tokens > 0
    return result


def new_client(max_connections: int = 64) -> httpx.Client:
    return httpx.Client(
        timeout=httpx.Timeout(300.0, connect=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


def decode_rate(results: list[StreamResult]) -> float | None:
    """Aggregate decode tokens/s over requests: sum(tokens after the first) / sum(decode spans)."""
    tokens = sum(r.n_tokens - 1 for r in results if r.decode_span_s)
    span = sum(r.decode_span_s or 0.0 for r in results if r.decode_span_s)
    return tokens / span if span else None
