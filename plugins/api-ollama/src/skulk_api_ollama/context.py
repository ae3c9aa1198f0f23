"""Ollama's `/api/generate` `context`: the conversation so far, handed back by the client to continue it.

Ollama returns the prompt's and answer's token ids. The kernel hands no token ids to the API, so the
context here is the conversation itself, as the UTF-8 bytes of a small JSON document (a list of
`[role, text]` pairs; role `raw` for an untemplated prompt), one int per byte. A client treats it as
opaque ints, exactly as with Ollama: sending it back with the next `/api/generate` continues the
conversation (the earlier turns come before the new prompt). Anything that does not decode is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from skulk_kernel.api import ChatMessage

ROLES = frozenset({"system", "user", "assistant", "raw"})
_NOT_OURS = "context: not a context this server returned (send back the `context` ints as they came)"


def encode(turns: Iterable[tuple[str, str]]) -> list[int]:
    return list(json.dumps([[r, t] for r, t in turns], ensure_ascii=False, separators=(",", ":")).encode())


def decode(value: object) -> list[tuple[str, str]]:
    """The turns of a context the client sent back; ValueError (with the reason) when it is not one."""
    if not isinstance(value, list) or not all(isinstance(v, int) and 0 <= v < 256 for v in value):
        raise ValueError("context: must be the list of ints a previous /api/generate answer returned")
    if not value:
        return []
    try:
        doc = json.loads(bytes(value).decode())
    except (UnicodeDecodeError, ValueError):
        raise ValueError(_NOT_OURS) from None
    if not isinstance(doc, list) or not all(
        isinstance(p, list) and len(p) == 2 and p[0] in ROLES and isinstance(p[1], str) for p in doc
    ):
        raise ValueError(_NOT_OURS)
    return [(p[0], p[1]) for p in doc]


def turns_of(messages: Iterable[ChatMessage], raw_prompt: str | None) -> list[tuple[str, str]]:
    """The request's side of the conversation, as context turns."""
    if raw_prompt is not None:
        return [("raw", raw_prompt)]
    return [(m.role, m.content or "") for m in messages if m.role in ROLES]
