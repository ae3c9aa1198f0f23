"""Kernel chunks -> OpenAI `text_completion` bodies and SSE events (`/v1/completions`).

Each choice is its own chunk stream (see `choices.py`); a body or stream event names its choice by
`index`. Logprobs are the legacy shape: parallel lists `tokens`, `token_logprobs`, `top_logprobs`
(a dict token -> logprob per position, the chosen token always among them, so a client can tell a
greedy token by comparing it with the dict's maximum, as lm-eval does) and `text_offset` (where each
token starts in the choice's text). With `echo` the prompt comes first, as its `PromptChunk`: the
first prompt token has no context, so its logprob and alternatives are null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from skulk_api_control.wire_common import GENERATION_FAILED, failed_chunk
from skulk_kernel.api import Chunk, ErrorChunk, PromptChunk, TokenChunk, TokenLogprob, Usage

from .chat import DONE, error_body, finish_reason

OBJECT = "text_completion"


@dataclass
class LogprobLists:
    """OpenAI's legacy logprobs for one choice, built token by token."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, lp: TokenLogprob, offset: int, first_of_prompt: bool = False) -> int:
        """Append one token; returns the offset after it."""
        self.tokens.append(lp.token)
        self.text_offset.append(offset)
        if first_of_prompt:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
        else:
            self.token_logprobs.append(lp.logprob)
            top: dict[str, float] = {}
            for t in lp.top_logprobs:
                top[t.token] = max(t.logprob, top.get(t.token, t.logprob))
            top[lp.token] = max(lp.logprob, top.get(lp.token, lp.logprob))
            self.top_logprobs.append(top)
        return offset + len(lp.token)

    def body(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


@dataclass
class Choice:
    """One choice's text, logprobs and end, from its chunks in order."""

    index: int
    want_logprobs: bool
    text: list[str] = field(default_factory=list)
    offset: int = 0
    logprobs: LogprobLists = field(default_factory=LogprobLists)
    tokens: int = 0
    finish_reason: str | None = None
    usage: Usage | None = None
    error: ErrorChunk | None = None
    prompt_ids: tuple[int, ...] = ()

    def add(self, chunk: Chunk) -> tuple[str, LogprobLists | None] | None:
        """Take one chunk; returns the text (and the logprobs) it adds, or None when it adds none."""
        added = LogprobLists() if self.want_logprobs else None
        if isinstance(chunk, ErrorChunk):
            self.error = chunk
            return None
        if isinstance(chunk, PromptChunk):
            self.prompt_ids = chunk.token_ids
            return self._text(chunk.text, chunk.logprobs, added, prompt=True)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.usage = chunk.usage
            if chunk.finish_reason == "error":
                self.error = failed_chunk(chunk)
        if isinstance(chunk, TokenChunk) and (chunk.text or chunk.logprobs) and not chunk.reasoning:
            self.tokens += 1
            return self._text(chunk.text, chunk.logprobs, added)
        return None

    def _text(
        self, text: str, lps: tuple[TokenLogprob, ...], added: LogprobLists | None, prompt: bool = False
    ) -> tuple[str, LogprobLists | None]:
        self.text.append(text)
        if added is not None:
            offset = self.offset
            for i, lp in enumerate(lps):
                added.add(lp, offset, first_of_prompt=prompt and i == 0)
                offset = self.logprobs.add(lp, offset, first_of_prompt=prompt and i == 0)
        self.offset += len(text)
        return text, added

    def body(self) -> dict[str, Any]:
        return {
            "text": "".join(self.text),
            "index": self.index,
            "logprobs": self.logprobs.body() if self.want_logprobs else None,
            "finish_reason": wire_finish(self.finish_reason),
        }


def wire_finish(reason: str | None) -> str:
    return finish_reason(reason, False)


def usage_body(choices: list[Choice], n: int) -> dict[str, int]:
    """Prompt tokens once per prompt (its first choice), completion tokens of every choice."""
    prompt = sum(c.usage.prompt_tokens for c in choices if c.usage is not None and c.index % n == 0)
    completion = sum(c.usage.completion_tokens if c.usage is not None else c.tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(
    choices: list[Choice], *, completion_id: str, created: int, model: str, fingerprint: str, n: int
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": OBJECT,
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [c.body() for c in choices],
        "usage": usage_body(choices, n),
    }


class CompletionStreamEncoder:
    """SSE events of a text completion: one per piece of text (per choice), a finish event per choice,
    then (with `stream_options.include_usage`) the usage event and `data: [DONE]`."""

    def __init__(self, *, completion_id: str, created: int, model: str, fingerprint: str) -> None:
        head = {"id": completion_id, "object": OBJECT, "created": created, "model": model}
        self._head = "data: " + json.dumps({**head, "system_fingerprint": fingerprint})[:-1] + ', "choices": '

    def event(self, index: int, text: str, logprobs: LogprobLists | None, finish: str | None = None) -> str:
        choice = {
            "text": text,
            "index": index,
            "logprobs": logprobs.body() if logprobs is not None else None,
            "finish_reason": finish,
        }
        return self._head + json.dumps([choice]) + "}\n\n"

    def usage(self, usage: dict[str, int]) -> str:
        return self._head + '[], "usage": ' + json.dumps(usage) + "}\n\n"

    @staticmethod
    def error(message: str, error_type: str = "server_error", code: str | None = None) -> str:
        return "data: " + json.dumps(error_body(message, error_type, code)) + "\n\n"

    @staticmethod
    def failed() -> str:
        return CompletionStreamEncoder.error(GENERATION_FAILED)

    done = DONE
