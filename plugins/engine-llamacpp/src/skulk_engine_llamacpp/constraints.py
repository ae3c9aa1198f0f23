"""Constrained output: forced tool calls and JSON answers as grammars llama.cpp enforces.

Why grammars: a small model asked to call a tool or answer in JSON often answers in prose; llama.cpp
can mask every token that would break a grammar, so the answer is valid by construction.

* The request's response format reaches the engine inside ``tool_choice`` (the kernel's params have
  no field for it): ``CONSTRAINT_PREFIX + {"tool_choice": ..., "response_format": ...}``, written
  by ``skulk_api_control.requests_common.constrain`` (a test checks both spell the prefix alike).
* The server backend (xllamacpp, built with llguidance) takes Lark grammars: ``%json {schema}``
  embeds a JSON schema, so a forced call is the Hermes form the prompt asked for,
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, with the arguments following
  the tool's own schema.
* The in-process backend (llama-cpp-python) takes GBNF, from its own JSON-schema converter.
* JSON mode without a schema (``json_object``, Ollama's ``format: "json"``) is not "any object"
  but a bounded grammar of one (bounded_json.py), so a model that repeats itself still ends with
  JSON that parses.

Schemas are made *closed* (``additionalProperties: false`` where the schema does not say), and
compact (no free whitespace, which a small model can spend its whole
budget on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .bounded_json import gbnf_bounded_object, is_any_object, lark_bounded_object

CONSTRAINT_PREFIX = "skulk-constraint:"
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """What the request forces: a tool choice (``required`` or a tool's name) and/or a JSON format."""

    tool_choice: str | None = None
    response_format: dict[str, Any] | None = None

    @property
    def forces_call(self) -> bool:
        return self.response_format is None and self.tool_choice not in (None, "auto", "none")

    @property
    def forced_name(self) -> str | None:
        return self.tool_choice if self.forces_call and self.tool_choice != "required" else None


def parse_tool_choice(raw: str | None) -> Constraint:
    """The kernel's ``tool_choice`` string, with a carried response format unpacked."""
    if raw is None or not raw.startswith(CONSTRAINT_PREFIX):
        return Constraint(tool_choice=raw)
    doc = json.loads(raw[len(CONSTRAINT_PREFIX) :])
    return Constraint(tool_choice=doc.get("tool_choice"), response_format=doc.get("response_format"))


#: I-JSON's interoperable integer range (RFC 7493): the bound an unbounded integer gets, so a
#: small model cannot write digits until max_tokens cuts the JSON off
SAFE_INTEGER = 2**53 - 1
#: the finest step a number without ``multipleOf`` gets: at most 9 digits after the point. A bound
#: on its value does not end a number (``10.000...`` is at most 10 however many zeros follow), and
#: SmolLM2 asked for a score of at most 10 wrote zeros until max_tokens; llguidance turns a decimal
#: ``multipleOf`` into a bound on the fraction's digits
NUMBER_STEP = 1e-9


def closed(schema: Any) -> Any:
    """A copy where every object schema that does not say otherwise allows no extra keys, and every
    integer or number without bounds stays within the interoperable range (a number also within
    ``NUMBER_STEP``'s digits after the point): each answer the grammar allows is a finite one."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: closed(v) if k not in ("enum", "const", "required", "default", "examples") else v for k, v in schema.items()
    }
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if out.get("type") in ("integer", "number"):
        out.setdefault("minimum", -SAFE_INTEGER)
        out.setdefault("maximum", SAFE_INTEGER)
    if out.get("type") == "number":
        out.setdefault("multipleOf", NUMBER_STEP)
    return out


def format_schema(fmt: dict[str, Any]) -> dict[str, Any]:
    """The schema a response format asks for (``json_object``: any JSON object).

    Closed in strict mode and not: JSON Schema lets an object without ``additionalProperties``
    carry any extra keys, and a small model given that freedom invents keys until max_tokens cuts
    the JSON off. Without extra keys the answer still validates; a schema that wants them says
    so (``additionalProperties: true`` or a schema), and keeps them.
    """
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    return closed(dict(fmt.get("schema") or {}))


def call_schema(tools: list[dict[str, Any]], only: str | None = None) -> dict[str, Any]:
    """The JSON of one call of an offered tool (of ``only``, when named): name and arguments."""
    options = []
    for tool in tools:
        fn = tool.get("function", tool)
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": closed(params)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not options:
        raise ValueError(f"tool_choice names {only!r}, which is not among the offered tools")
    return options[0] if len(options) == 1 else {"anyOf": options}


def _compact(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": {**COMPACT, **schema.get("x-guidance", {})}}


def lark_json(schema: dict[str, Any]) -> str:
    """An llguidance grammar for a JSON answer following ``schema`` (any object: the bounded one)."""
    if is_any_object(schema):
        return lark_bounded_object()
    return "%llguidance {}\nstart: %json " + json.dumps(_compact(schema)) + "\n"


def lark_call(schema: dict[str, Any]) -> str:
    """An llguidance grammar for one Hermes-style tagged call (``schema`` from :func:`call_schema`)."""
    return (
        "%llguidance {}\n"
        f"start: {json.dumps(CALL_OPEN)} call {json.dumps(CALL_CLOSE)}\n"
        "call: %json " + json.dumps(_compact(schema)) + "\n"
    )


#: After a tool result a small model often re-opens ``<tool_response>`` (a stop marker: an empty
#: answer) or repeats the call it just made; this grammar makes the answer start with a letter or digit
#: (prose: not markup, JSON, a fence or a bracket). A call may still follow the prose
#: (the parser finds tags anywhere).
LARK_PROSE_START = "%llguidance {}\nstart: FIRST REST\nFIRST: /[A-Za-z0-9]/\nREST: /(.|\\n)*/\n"


def gbnf_json(schema: dict[str, Any]) -> str:
    """GBNF (llama-cpp-python's converter) for a JSON answer following ``schema`` (any object: the
    bounded grammar, which needs no converter)."""
    if is_any_object(schema):
        return gbnf_bounded_object()
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return str(json_schema_to_gbnf(json.dumps(schema)))


def gbnf_call(schema: dict[str, Any]) -> str:
    """GBNF for one Hermes-style tagged call: the converter's rules under a new root."""
    body = gbnf_json(schema)
    lines = body.splitlines()
    renamed = ["call-json ::=" + line[len("root ::=") :] if line.startswith("root ::=") else line for line in lines]
    open_lit = json.dumps(CALL_OPEN)
    close_lit = json.dumps(CALL_CLOSE)
    return f"root ::= {open_lit} call-json {close_lit}\n" + "\n".join(renamed) + "\n"
