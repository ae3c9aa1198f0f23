"""Bad input stays bad input: bounded head and body, bounded JSON nesting, integers within 64 bits,
clients that stall time out.

Every refusal is a 4xx JSON body in the format of the API the path belongs to (errors.py), before
any route runs. The body is read here once (at most `max_body_bytes`) and handed on unchanged.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import MutableMapping
from typing import Any

from .auth import ApiControlConfig, ASGIApp, Receive, Scope_, Send
from .errors import api_error

# strings are skipped whole (brackets inside them do not count); only brackets are looked at. A string is
# one unrolled loop, not an alternation per character: 24x faster on a 4 MB body (a base64 image)
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_WITH_BODY = {"POST", "PUT", "PATCH", "DELETE"}
# an integer of 19 digits or more outside a string (a fraction or an exponent makes it a float)
_BIG_INTS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9]{19,}(?![0-9.eE])', re.DOTALL)
INT64 = 2**63 - 1


def oversized_integer(body: bytes) -> bytes | None:
    """The first integer in a JSON text beyond a signed 64-bit one, if any.

    Why: requests become commands whose wire form is msgpack, which cannot carry such an integer;
    a `seed` or `max_tokens` of 10**30 used to fail deep inside (a 500, or a command the master
    never confirmed: a 503). Refused here, for every route at once, as the caller's mistake.
    """
    for match in _BIG_INTS.finditer(body):
        token = match.group()
        if token[:1] != b'"' and abs(int(token)) > INT64:
            return token
    return None


def json_depth(body: bytes, limit: int) -> int:
    """The nesting depth of a JSON text, stopping as soon as it passes `limit`."""
    depth = deepest = 0
    for match in _TOKENS.finditer(body):
        c = match.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


class Hardening:
    def __init__(self, app: ASGIApp, config: ApiControlConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope_, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        cfg = self.config
        head = sum(len(k) + len(v) + 4 for k, v in scope.get("headers", []))
        if head > cfg.max_header_bytes:
            await api_error(
                path, 431, f"request headers are {head} bytes; the limit is {cfg.max_header_bytes}", "headers_too_large"
            )(scope, receive, send)
            return
        if scope.get("method") not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length", b"")
        if length.isdigit() and int(length) > cfg.max_body_bytes:
            await api_error(
                path,
                413,
                f"request body is {int(length)} bytes; the limit is {cfg.max_body_bytes}",
                "request_too_large",
            )(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                async with asyncio.timeout(cfg.client_timeout_s):  # not wait_for: 3.11's can drop a cancel
                    message = await receive()
            except TimeoutError:
                await api_error(
                    path, 408, f"the request body did not arrive within {cfg.client_timeout_s:g} s", "request_timeout"
                )(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cfg.max_body_bytes:
                await api_error(
                    path, 413, f"request body is over the limit of {cfg.max_body_bytes} bytes", "request_too_large"
                )(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body[:1] in (b"{", b"[") or body.lstrip()[:1] in (b"{", b"["):
            depth = json_depth(body, cfg.max_json_depth)
            if depth > cfg.max_json_depth:
                await api_error(
                    path, 400, f"the JSON body nests deeper than {cfg.max_json_depth} levels", "json_too_deep"
                )(scope, receive, send)
                return
            if (big := oversized_integer(body)) is not None:
                await api_error(
                    path,
                    400,
                    f"the JSON body has an integer beyond 64 bits ({big[:24].decode()}...); integers must be "
                    f"within -{INT64} and {INT64}",
                    "integer_too_large",
                )(scope, receive, send)
                return
        delivered = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, whenever it comes

        await self.app(scope, replay, send)
