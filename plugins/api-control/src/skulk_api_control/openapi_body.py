"""Request bodies in the OpenAPI document for routes that read their JSON by hand.

Why by hand: each API answers a bad body in its own error shape (OpenAI `{"error": {...}}`, Anthropic
`{"type": "error", ...}`, Ollama `{"error": "..."}`), and most accept more than one form (a string or
a list, an alias, a legacy field); a FastAPI body parameter would validate first and answer FastAPI's
422 instead. So a route keeps parsing `await request.json()` itself and declares its body here, with
`openapi_extra=body_schema(Model)`: client generators and fuzzers (schemathesis) see the fields, and
nothing about the route's behaviour changes.

Nested models are inlined (pydantic's `#/$defs/...` references mean nothing inside an OpenAPI
operation); a model that contains itself is cut at the second visit to an open schema (`{}`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_REF = "#/$defs/"


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with every `$defs` reference inlined."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(part: Any, seen: frozenset[str]) -> Any:
        if isinstance(part, dict):
            ref = part.get("$ref")
            if isinstance(ref, str) and ref.startswith(_REF):
                name = ref.removeprefix(_REF)
                return {} if name in seen else inline(defs[name], seen | {name})
            return {k: inline(v, seen) for k, v in part.items()}
        if isinstance(part, list):
            return [inline(v, seen) for v in part]
        return part

    out: dict[str, Any] = inline(schema, frozenset())
    return out


def body_schema(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body `model` describes (the route still reads it itself)."""
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": model_schema(model)}}}}
