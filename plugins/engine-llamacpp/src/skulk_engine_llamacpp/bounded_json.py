"""JSON mode that ends: "any JSON object" as a grammar whose every sentence is short and parses.

Why: a grammar of *any* JSON object cannot stop a small model that repeats itself. Asked for JSON
with ``response_format: {"type": "json_object"}`` (the Vercel AI SDK's ``generateObject`` without
a schema, Ollama's ``format: "json"``), SmolLM2 wrote ``{"name":",","name":",",...`` until
max_tokens cut the object off: finish_reason ``length`` and a body no parser reads.

What is bounded (``JsonBounds``; docs/api.md lists the numbers):

* keys per object and items per array, so a loop over pairs or items must close its container;
* characters per string and per key, and digits per number, so a loop inside a scalar ends;
* nesting depth: below the deepest level only scalars are allowed, so the grammar is finite and
  every open container can always be closed;
* no whitespace between tokens (the model cannot spend its budget on indentation).

Every sentence of the grammar is therefore a complete JSON object of bounded size, and every
prefix of one can be closed: a model that loops is made to close what it opened after at most
``max_keys`` pairs, ``max_items`` items or ``max_string`` characters, and ``json.loads`` reads the
result. (The bound on the whole is the product of the per-level ones, far above any max_tokens: a
model that fills every level to its bound still meets max_tokens first. The bounds stop loops, the
common failure, not long answers.)

What is not enforced: that keys in one object differ. A grammar cannot remember which keys it has
seen (distinct keys of unbounded text are not a context-free language; over bounded keys the rules
would be exponential), so a repeating model now writes at most ``max_keys`` copies and closes the
object; JSON parsers keep the last value of a repeated key (RFC 8259 leaves that to them).

Two spellings of the same grammar: Lark for llguidance (the server backend, xllamacpp) and GBNF for
llama-cpp-python (the in-process backend). Both support bounded repetition (``x{0,n}``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JsonBounds:
    max_depth: int = 4  # containers nested in each other, the top object included
    max_keys: int = 24  # pairs in one object
    max_items: int = 24  # values in one array
    max_string: int = 128  # characters in a string value
    max_key: int = 40  # characters in a key (at least 1: an empty key invites a loop of `"":`)
    max_digits: int = 15  # digits of an integer part and of a fraction (plus up to 3 exponent digits)


DEFAULT_BOUNDS = JsonBounds()

# one JSON string character: anything printable but a quote or a backslash, or an escape (not `\/`:
# a `/` would end Lark's /regex/ and llama.cpp then drops the grammar without a word; `/` is
# written plainly instead)
_CHAR_RE = r'(?:[^"\\\x00-\x1f\x7f]|\\["\\bfnrt]|\\u[0-9a-fA-F]{4})'


def _number_re(b: JsonBounds) -> str:
    return rf"-?(?:0|[1-9][0-9]{{0,{b.max_digits - 1}}})(?:\.[0-9]{{1,{b.max_digits}}})?(?:[eE][+-]?[0-9]{{1,3}})?"


def _levels(b: JsonBounds, obj: str, arr: str, val: str) -> list[tuple[str, str, str, str]]:
    """(object rule, array rule, value rule inside it, the inner value's containers) per level."""
    out = []
    for depth in range(b.max_depth):
        inner = depth + 1
        nested = f"{obj}{inner} | {arr}{inner} | " if inner < b.max_depth else ""
        out.append((f"{obj}{depth}", f"{arr}{depth}", f"{val}{inner}", nested))
    return out


def lark_bounded_object(b: JsonBounds = DEFAULT_BOUNDS) -> str:
    """An llguidance (Lark) grammar: one JSON object within the bounds, no whitespace."""
    lines = ["%llguidance {}", "start: obj0"]
    for obj, arr, val, nested in _levels(b, "obj", "arr", "val"):
        lines.append(f'{obj}: "{{" ({obj}_pair ("," {obj}_pair){{0,{b.max_keys - 1}}})? "}}"')
        lines.append(f'{obj}_pair: KEY ":" {val}')
        if arr != "arr0":  # the top is an object: no array at depth 0
            lines.append(f'{arr}: "[" ({val} ("," {val}){{0,{b.max_items - 1}}})? "]"')
        lines.append(f"{val}: {nested}scalar")
    lines += [
        'scalar: STRING | NUMBER | "true" | "false" | "null"',
        f'KEY: /"{_CHAR_RE}{{1,{b.max_key}}}"/',
        f'STRING: /"{_CHAR_RE}{{0,{b.max_string}}}"/',
        f"NUMBER: /{_number_re(b)}/",
    ]
    return "\n".join(lines) + "\n"


def gbnf_bounded_object(b: JsonBounds = DEFAULT_BOUNDS) -> str:
    """The same grammar in GBNF (llama.cpp's own format, which llama-cpp-python takes)."""
    lines = ["root ::= obj0"]
    for obj, arr, val, nested in _levels(b, "obj", "arr", "val"):
        lines.append(f'{obj} ::= "{{" ({obj}-pair ("," {obj}-pair){{0,{b.max_keys - 1}}})? "}}"')
        lines.append(f'{obj}-pair ::= key ":" {val}')
        if arr != "arr0":
            lines.append(f'{arr} ::= "[" ({val} ("," {val}){{0,{b.max_items - 1}}})? "]"')
        lines.append(f"{val} ::= {nested}scalar")
    lines += [
        'scalar ::= string | number | "true" | "false" | "null"',
        r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})',
        f'key ::= "\\"" char{{1,{b.max_key}}} "\\""',
        f'string ::= "\\"" char{{0,{b.max_string}}} "\\""',
        f'number ::= "-"? ("0" | [1-9] [0-9]{{0,{b.max_digits - 1}}}) ("." [0-9]{{1,{b.max_digits}}})? '
        "([eE] [-+]? [0-9]{1,3})?",
    ]
    return "\n".join(lines) + "\n"


def is_any_object(schema: object) -> bool:
    """Whether a schema asks for any JSON object and nothing more (``json_object``, or a
    ``json_schema`` of ``{"type": "object"}``): the case the bounded grammar replaces."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    rest = {k: v for k, v in schema.items() if k not in ("type", "x-guidance", "title", "description")}
    return rest in ({}, {"additionalProperties": True})
