"""Errors answered before a route runs (auth, quota, hardening), in the format of the API the path
belongs to, so each SDK raises its own typed exception:

* OpenAI (``/v1/chat``, ``/v1/responses``, ``/v1/embeddings``, ``/v1/models``, ``/v1/audio``) and the
  control API: ``{"error": {"message", "type", "param", "code"}}``;
* Anthropic (``/v1/messages``): ``{"type": "error", "error": {"type", "message"}, "request_id"}``;
* Ollama (``/api/*``): ``{"error": "message"}``.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi.responses import JSONResponse

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
_OPENAI_TYPES = {401: "invalid_request_error", 403: "invalid_request_error", 429: "tokens"}


def api_of(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


def api_error(
    path: str, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    headers = {**({"x-should-retry": "false"} if status < 500 and status != 429 else {}), **(headers or {})}
    body: Any
    match api_of(path):
        case "anthropic":
            body = {
                "type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"), "message": message},
                "request_id": f"req_{secrets.token_hex(12)}",
            }
        case "ollama":
            body = {"error": message}
        case _:
            body = {
                "error": {
                    "message": message,
                    "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                    "param": None,
                    "code": code,
                }
            }
    return JSONResponse(body, status_code=status, headers=headers)
