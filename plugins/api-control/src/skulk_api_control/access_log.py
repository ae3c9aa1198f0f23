"""One INFO line per inference request: route, model, tokens, time, outcome.

Why: at INFO a node's log should read like an access log a person can follow, one line per
request, instead of the HTTP calls a runner makes to its engine. The line is written when the
response's last byte is sent (a stream's end, not its headers), or when the client goes away.
An ASGI middleware opens a record per inference request (the scopes `auth.route_scope` calls
"inference", POST only: model lists are not requests); the dispatch path fills in the model and,
from the terminal chunk, the tokens and an error code.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import ErrorChunk

from .auth import route_scope

log = logging.getLogger("skulk.request")


@dataclass
class AccessRecord:
    method: str
    path: str
    started: float
    model: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str = ""
    written: bool = False

    def line(self, status: int | str) -> str:
        tokens = "-" if self.prompt_tokens is None else f"{self.prompt_tokens}+{self.completion_tokens or 0}"
        outcome = f"{status} {self.error}".strip()
        took = time.monotonic() - self.started
        return f"{self.method} {self.path} model={self.model or '-'} tokens={tokens} {took:.2f}s {outcome}"


CURRENT: ContextVar[AccessRecord | None] = ContextVar("skulk_access_record", default=None)


def note_model(model: str) -> None:
    """The model a request asked for (the id it resolves to replaces it when dispatch knows it)."""
    if (record := CURRENT.get()) is not None:
        record.model = model


def note_chunk(chunk: Any) -> None:
    """Tokens from a chunk's usage (the terminal one carries it), or its error code."""
    record = CURRENT.get()
    if record is None:
        return
    if getattr(chunk, "usage", None) is not None:
        record.prompt_tokens, record.completion_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    if isinstance(chunk, ErrorChunk):
        record.error = chunk.code or "error"


class AccessLog:
    """ASGI middleware: a record per inference request, one line when its response is done."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or route_scope("POST", path) != "inference":
            await self.app(scope, receive, send)
            return
        record = AccessRecord(method="POST", path=path, started=time.monotonic())
        token = CURRENT.set(record)
        status = 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and not record.written:
                record.written = True
                log.info("%s", record.line(status))

        try:
            await self.app(scope, receive, sending)
        finally:
            if not record.written:
                record.written = True
                log.info("%s", record.line(f"{status or 500} client gone" if status else 500))
            CURRENT.reset(token)
