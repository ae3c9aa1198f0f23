"""Request-body parsing every API adapter shares: JSON objects, strict pydantic models, their errors.

The adapters (api-openai, api-anthropic, api-ollama) parse bodies themselves, not through FastAPI, so
every caller mistake is a 4xx in the adapter's own error shape that names the offending field. What
that takes is the same for all of them and lives here; only the spelling differs:

* `RequestError` is the base of each adapter's own error (which adds the fields its shape carries).
  Its class attributes and class methods say how the adapter words and marks the two mistakes found
  here: a body that is not a JSON object, and (with `adapter_routes.read_json`) one over the limit.
* `parse_json_object` reads the body as a JSON object, raising the adapter's error class.
* `StrictBody` is the base of request models: strict types (a temperature sent as a string is an
  error, not silently coerced), unknown fields ignored (clients send many harmless extras).
* `validate` runs such a model; `invalid_field` turns pydantic's first error into
  `(where, "where: message")`, with the field path in dotted (`messages.0.content`) or bracketed
  (`messages[0].content`) spelling.

No FastAPI or Starlette here: adapters' parsers load without the web stack (their plugin entry points
and `ApiAdapter`s must stay light).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["RequestError", "StrictBody", "invalid_field", "parse_json_object", "validate"]

E = TypeVar("E", bound="RequestError")

# the parts of a pydantic error location that name a union branch or validator, not a field
_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


class RequestError(Exception):
    """A caller mistake: answered as `status` (4xx) in the adapter's error shape, never retried."""

    empty_body = "the request body is empty; send a JSON object"
    invalid_json = "the request body is not valid JSON: {}"

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @classmethod
    def not_json(cls: type[E], message: str) -> E:
        """The body is empty, not JSON, or not a JSON object (a 400)."""
        return cls(message)

    @classmethod
    def too_large(cls: type[E], message: str) -> E:
        """The body is over the host's size limit (a 413)."""
        return cls(message, status=413)


def parse_json_object(body: bytes, error: type[RequestError] = RequestError) -> dict[str, Any]:
    """The body as a JSON object; anything else raises `error.not_json(...)`."""
    if not body.strip():
        raise error.not_json(error.empty_body)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error.not_json(error.invalid_json.format(exc)) from None
    if not isinstance(data, dict):
        raise error.not_json(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


class StrictBody(BaseModel):
    """Base of request-body models: strict types, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)


def validate(model: type[BaseModel], data: Any, error: Callable[[ValidationError], Exception]) -> Any:
    """`model` validated strictly from `data`; a mistake raises `error(exc)` (the adapter's RequestError)."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise error(exc) from None


def _is_branch_tag(part: Any) -> bool:
    text = str(part)
    return text in _BRANCH_TAGS or "[" in text or "-" in text or text.startswith(("literal", "function"))


def invalid_field(exc: ValidationError, *, brackets: bool) -> tuple[str, str]:
    """`(where, message)` for pydantic's first error: `where` is the field path (union-branch tags
    dropped; list indices as `[0]` with `brackets`, else as `.0`), `message` is `"where: what"` (with
    `body` for a mistake in the body as a whole)."""
    errors = exc.errors(include_url=False)
    loc = errors[0]["loc"] if errors else ()
    what = errors[0]["msg"] if errors else "invalid value"
    where = ""
    for part in loc:
        if isinstance(part, int) and brackets:
            where += f"[{part}]"
        elif isinstance(part, int) or not _is_branch_tag(part):
            where += ("." if where else "") + str(part)
    return where, f"{where or 'body'}: {what}"
