"""One batch line through the node's own API, and the output or error line it becomes.

Why through the API app (in process, over ASGI) and not a private path to the engines: a line
is an ordinary request of its url, so it gets that route's validation (a bad body is that
route's 4xx, in the error file), its model resolution, routing across the ready replicas,
resume on another replica when one dies, tracing and the request log -- nothing is duplicated,
and a later change to a route is a change to batches too. The call comes from 127.0.0.1 inside
the process, so it passes the auth gate as a local caller.

A 429 or 5xx is retried with backoff (a replica lost mid-line, no instance for a moment): a
batch has hours, and a line recorded as failed is lost to the user.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from .jsonl import InputLine, LineError

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
LINE_TIMEOUT_S = 900.0


def request_id() -> str:
    return f"batch_req_{secrets.token_hex(16)}"


def error_line(line: LineError) -> dict[str, Any]:
    return {
        "id": request_id(),
        "custom_id": line.custom_id,
        "response": None,
        "error": {"code": line.code, "message": f"line {line.index + 1}: {line.message}"},
    }


def answer_line(line: InputLine, status: int, body: Any) -> dict[str, Any]:
    """OpenAI's output line; a non-2xx answer carries its error too (it goes to the error file)."""
    req = body.get("id") if isinstance(body, dict) and isinstance(body.get("id"), str) else request_id()
    error = None
    if status >= 400:
        detail = body.get("error") if isinstance(body, dict) else None
        message = detail.get("message") if isinstance(detail, dict) else str(body)[:500]
        code = detail.get("code") if isinstance(detail, dict) else None
        error = {"code": code or f"http_{status}", "message": message}
    return {
        "id": request_id(),
        "custom_id": line.custom_id,
        "response": {"status_code": status, "request_id": req, "body": body},
        "error": error,
    }


async def run_line(client: Any, line: InputLine, attempts: int) -> dict[str, Any]:
    """The line's output line (never raises but for cancellation)."""
    import httpx

    body = dict(line.body)
    if body.get("stream"):
        body["stream"] = False  # a batch stores answers: it never streams
    status, answer = 0, None
    for attempt in range(attempts):
        try:
            got = await client.post(line.url, json=body, timeout=LINE_TIMEOUT_S)
            status = got.status_code
            try:
                answer = got.json()
            except ValueError:
                answer = {"error": {"message": got.text[:500], "code": None}}
        except httpx.HTTPError as exc:
            status, answer = 599, {"error": {"message": f"the request failed: {exc!r}", "code": "request_failed"}}
        if status not in RETRY_STATUSES and status != 599:
            break
        if attempt < attempts - 1:
            await asyncio.sleep(min(10.0, 0.5 * 2**attempt))
    return answer_line(line, status, answer)


def is_ok(out: dict[str, Any]) -> bool:
    return out.get("error") is None and bool(out.get("response"))


def segment_bytes(results: list[tuple[int, dict[str, Any]]]) -> bytes:
    """A segment file: one JSON object per line, `{"i": line index, "out": output line}`."""
    return "".join(json.dumps({"i": i, "out": out}, separators=(",", ":")) + "\n" for i, out in results).encode()


def read_segment(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    found = []
    for raw in data.decode().splitlines():
        if raw.strip():
            item = json.loads(raw)
            found.append((int(item["i"]), item["out"]))
    return found
