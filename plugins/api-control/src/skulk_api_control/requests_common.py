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

* `constrain` puts a response format (JSON mode, a JSON schema) on the kernel params, after
  `check_schema` has refused what no engine here can enforce (a 400 naming the keyword, never a
  silent ignore). The kernel's params have no field for it, so it travels inside `tool_choice` as
  `CONSTRAINT_PREFIX + JSON` (`{"tool_choice": <the original>, "response_format": {...}}`): engines
  that know the prefix (engine-llamacpp, engine-echo) decode under a grammar; any other engine sees
  a `tool_choice` that is not `"none"`, which is what it would have seen anyway when tools are there.

No FastAPI or Starlette here: adapters' parsers load without the web stack (their plugin entry points
and `ApiAdapter`s must stay light).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from skulk_kernel.api import TextGenerationParams

__all__ = [
    "CONSTRAINT_PREFIX",
    "ConstraintError",
    "RequestError",
    "StrictBody",
    "check_schema",
    "constrain",
    "invalid_field",
    "parse_json_object",
    "validate",
]

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


# --- constrained output ---------------------------------------------------------------------------

CONSTRAINT_PREFIX = "skulk-constraint:"

#: JSON Schema keywords the engines' grammar compilers enforce (or that only annotate).
SCHEMA_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength",
        "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern", "format",
        "minProperties", "maxProperties",
        # annotations: no effect on what may be generated
        "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
        "readOnly", "writeOnly", "strict",
    }
)  # fmt: skip
SCHEMA_FORMATS = frozenset({"date", "time", "date-time", "email", "uuid"})
SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


class ConstraintError(ValueError):
    """A response format or schema the engines cannot enforce; the message says what to change."""


def check_schema(schema: Any, where: str = "schema") -> None:
    """Refuse (ConstraintError) a schema that uses a feature a grammar here would silently drop."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ConstraintError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}")
    for key, value in schema.items():
        at = f"{where}.{key}"
        if key.startswith("x-"):
            continue
        if key not in SCHEMA_KEYWORDS:
            raise ConstraintError(
                f"{at}: the JSON schema keyword {key!r} is not supported for constrained output "
                f"(supported: {', '.join(sorted(k for k in SCHEMA_KEYWORDS if not k.startswith('$')))})"
            )
        if key == "type":
            types = value if isinstance(value, list) else [value]
            bad = [t for t in types if t not in SCHEMA_TYPES]
            if bad:
                raise ConstraintError(f"{at}: unknown type {bad[0]!r}")
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise ConstraintError(f"{at}: must be an object of schemas")
            for name, sub in value.items():
                check_schema(sub, f"{at}.{name}")
        elif key in ("items", "additionalProperties"):
            check_schema(value, at)
        elif key in ("anyOf", "oneOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise ConstraintError(f"{at}: must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                check_schema(sub, f"{at}[{i}]")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            raise ConstraintError(f'{at}: only local references ("#/$defs/...") are supported, not {value!r}')
        elif key == "format" and value not in SCHEMA_FORMATS:
            raise ConstraintError(
                f"{at}: format {value!r} is not supported (supported: {', '.join(sorted(SCHEMA_FORMATS))})"
            )
        elif key == "pattern" and (not isinstance(value, str) or "(?" in value):
            raise ConstraintError(f"{at}: lookaround and other (?...) groups are not supported in patterns")


def response_format_of(value: Any, where: str = "response_format") -> dict[str, Any] | None:
    """An OpenAI-style response_format (`text` / `json_object` / `json_schema`) as the engines' form:
    None for free text, else `{"type": "json_object"}` or `{"type": "json_schema", "schema", "strict"}`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConstraintError(f"{where}: must be an object with a `type`")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ConstraintError(f"{where}.type: must be 'text', 'json_object' or 'json_schema', not {kind!r}")
    spec = value.get("json_schema", value)  # Chat nests it; Responses' text.format does not
    if not isinstance(spec, dict):
        raise ConstraintError(f"{where}.json_schema: must be an object with a `schema`")
    schema = spec.get("schema")
    if schema is None:
        raise ConstraintError(f"{where}.json_schema.schema: required (the JSON schema the answer must follow)")
    check_schema(schema, f"{where}.json_schema.schema")
    return {"type": "json_schema", "schema": schema, "strict": bool(spec.get("strict"))}


def constrain(
    params: TextGenerationParams, response_format: Any, where: str = "response_format"
) -> TextGenerationParams:
    """`params` with the response format carried to the engine (unchanged for free text)."""
    fmt = response_format_of(response_format, where)
    if fmt is None:
        return params
    if params.tools and params.tool_choice not in (None, "none", "auto"):
        raise ConstraintError(f"{where}: cannot be combined with a required or named tool_choice")
    tools = () if params.tool_choice == "none" else params.tools
    carried = json.dumps({"tool_choice": params.tool_choice, "response_format": fmt}, separators=(",", ":"))
    return params.model_copy(update={"tools": tools, "tool_choice": CONSTRAINT_PREFIX + carried})
