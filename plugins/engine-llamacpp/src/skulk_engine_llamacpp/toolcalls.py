"""Tool calls out of generated text, for models/templates where the engine does not parse them.

Why this exists: SmolLM2's GGUF chat template has no tool support, so llama.cpp's server
silently drops ``tools`` and the model never sees them; llama-cpp-python's generic path does not
parse calls either. The backends then render tools into the prompt themselves (Hermes-style
``<tool_call>{json}</tool_call>``, see :mod:`.templates`) and run the raw text through
:class:`ToolCallStreamParser`.

Recognised forms:

* ``<tool_call>{"name": .., "arguments": {..}}</tool_call>`` anywhere (also a JSON list inside
  one tag, a missing closing tag at the end, ``"parameters"`` instead of ``"arguments"``,
  OpenAI-style ``{"function": {...}}`` and llama.cpp generic ``{"tool_call": {...}}``).
* Bare JSON (optionally in a Markdown fence) -- ONLY when it is the whole message and every
  call names a known tool. A JSON answer the user asked for stays prose.

Guarantees: prose stays prose (nothing is turned into a call unless it is tagged or is a
whole-message call to a known tool), and no control markup leaks into prose: tags are never
emitted, a hallucinated ``<tool_response>`` ends the visible text, stray ChatML markers are
removed, and text that might be the start of a tag is held back until it is decided.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from .events import ToolCallDelta

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
#: The model is inventing the tool's answer: nothing after this is shown.
STOP_MARKERS = ("<tool_response>", "</tool_response>")
#: ChatML/special markers that must never reach the user.
STRIP_MARKERS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>")
_ALL_MARKERS = (OPEN_TAG, CLOSE_TAG, *STOP_MARKERS, *STRIP_MARKERS)

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _strip_markers(text: str) -> str:
    for marker in (*STRIP_MARKERS, CLOSE_TAG):
        if marker in text:
            text = text.replace(marker, "")
    return text


def _normalize_args(raw: object) -> str | None:
    """Arguments as compact JSON object text, or None if they are not an object."""
    if raw is None:
        return "{}"
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    return json.dumps(raw, ensure_ascii=False, separators=(",", ":"))


def calls_from_json(value: object) -> list[ToolCallDelta] | None:
    """Interpret a decoded JSON value as one or more calls; None if it is not call-shaped."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls: list[ToolCallDelta] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        if isinstance(item.get("tool_calls"), list) and len(items) == 1:
            return calls_from_json(item["tool_calls"])
        if isinstance(item.get("tool_call"), dict):
            item = item["tool_call"]
        elif isinstance(item.get("function"), dict):
            item = item["function"]
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            return None
        args_key = next((k for k in ("arguments", "parameters", "args") if k in item), None)
        args = _normalize_args(item.get(args_key) if args_key else None)
        if args is None:
            return None
        calls.append(ToolCallDelta(id=new_call_id(), name=name.strip(), arguments_json=args))
    return calls


def _decode_first(text: str) -> tuple[object, str] | None:
    """Decode the first JSON value in text; return (value, rest) or None."""
    stripped = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except ValueError:
        return None
    return value, stripped[end:]


def _parse_bare(text: str, tool_names: frozenset[str] | None) -> list[ToolCallDelta] | None:
    """Whole-message bare JSON call(s), optionally fenced; None when it is not that."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body or body[0] not in "{[":
        return None
    decoded = _decode_first(body)
    if decoded is None or decoded[1].strip():
        return None
    calls = calls_from_json(decoded[0])
    if not calls:
        return None
    if tool_names is not None and any(c.name not in tool_names for c in calls):
        return None
    return calls


def _partial_marker_len(text: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of a marker."""
    best = 0
    for marker in _ALL_MARKERS:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


Item: TypeAlias = str | ToolCallDelta


class ToolCallStreamParser:
    """Incremental splitter of generated text into prose and whole tool calls.

    ``feed(text)`` returns the items that are safe to show now; ``finish()`` flushes. Prose is
    delayed only while it could still be markup: a partial tag at the end of the buffer, the
    inside of an open ``<tool_call>``, or (when bare JSON is allowed) a message that so far
    starts with ``{``, ``[`` or a code fence.
    """

    def __init__(self, tool_names: Iterable[str] | None = None, allow_bare_json: bool = True):
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.allow_bare_json = allow_bare_json
        self._buf = ""
        self._mode = "start"  # start | text | tag | bare | stopped
        self._calls = 0

    @property
    def saw_calls(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> list[Item]:
        if self._mode == "stopped" or not text:
            return []
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Item]:
        out = self._drain(final=True)
        self._mode = "stopped"
        self._buf = ""
        return out

    # -- internals -----------------------------------------------------------------------

    def _emit_calls(self, calls: list[ToolCallDelta], out: list[Item]) -> None:
        self._calls += len(calls)
        out.extend(calls)

    def _drain(self, final: bool) -> list[Item]:
        out: list[Item] = []
        while True:
            if self._mode == "stopped":
                return out
            if self._mode == "start":
                head = self._buf.lstrip()
                if not head:
                    if final:
                        self._buf = ""
                    return out
                if self.allow_bare_json and (head[0] in "{[" or "```".startswith(head[:3])):
                    self._mode = "bare"
                else:
                    self._mode = "text"
                continue
            if self._mode == "bare":
                if not final:
                    head = self._buf.lstrip()
                    if head[0] in "{[" or head.startswith("```") or "```".startswith(head):
                        return out  # undecidable until the message ends
                    self._mode = "text"
                    continue
                calls = _parse_bare(self._buf, self.tool_names)
                if calls:
                    self._emit_calls(calls, out)
                    self._buf = ""
                    return out
                self._mode = "text"  # not a call: show it as prose (markup rules still apply)
                continue
            if self._mode == "text":
                if not self._step_text(out, final):
                    return out
                continue
            if self._mode == "tag":
                if not self._step_tag(out, final):
                    return out
                continue

    def _step_text(self, out: list[Item], final: bool) -> bool:
        """Consume prose up to the next marker. True if the mode changed (loop again)."""
        buf = self._buf
        open_at = buf.find(OPEN_TAG)
        stop_at = min((i for i in (buf.find(m) for m in STOP_MARKERS) if i >= 0), default=-1)
        if stop_at >= 0 and (open_at < 0 or stop_at < open_at):
            self._prose(buf[:stop_at], out)
            self._buf = ""
            self._mode = "stopped"
            return True
        if open_at >= 0:
            self._prose(buf[:open_at], out)
            self._buf = buf[open_at + len(OPEN_TAG) :]
            self._mode = "tag"
            return True
        hold = _partial_marker_len(buf)
        if final:
            # A dangling "<to..." at the very end is truncated markup, not prose.
            tail = buf[len(buf) - hold :] if hold else ""
            self._prose(buf if (hold < 3 or not tail.startswith("<")) else buf[:-hold], out)
            self._buf = ""
            return False
        self._prose(buf[: len(buf) - hold], out)
        self._buf = buf[len(buf) - hold :]
        return False

    def _step_tag(self, out: list[Item], final: bool) -> bool:
        buf = self._buf
        close_at = buf.find(CLOSE_TAG)
        reopen_at = buf.find(OPEN_TAG)
        if close_at >= 0 and (reopen_at < 0 or close_at < reopen_at):
            inner, rest = buf[:close_at], buf[close_at + len(CLOSE_TAG) :]
        elif reopen_at >= 0:  # model forgot the closing tag before the next call
            inner, rest = buf[:reopen_at], buf[reopen_at:]
        elif final:
            inner, rest = buf, ""
        else:
            # Without a closing tag yet, a complete JSON value followed by more text also ends
            # the call (models often skip "</tool_call>"); otherwise keep waiting.
            decoded = _decode_first(buf)
            if decoded is None or not decoded[1].strip() or CLOSE_TAG.startswith(decoded[1].strip()):
                return False  # JSON incomplete, or the closing tag may still be arriving
            inner, rest = buf[: len(buf) - len(decoded[1])], decoded[1]
        self._buf = rest
        self._mode = "text"
        self._tag_body(inner, out, truncated=final and close_at < 0 and reopen_at < 0)
        return True

    def _tag_body(self, inner: str, out: list[Item], truncated: bool) -> None:
        decoded = _decode_first(inner)
        calls = calls_from_json(decoded[0]) if decoded is not None else None
        if calls and decoded is not None:
            self._emit_calls(calls, out)
            if decoded[1].strip():
                self._prose(decoded[1], out)  # trailing words inside the tag (rare) stay prose
            return
        if truncated:
            return  # an unfinished call cut by max_tokens: drop it rather than leak half-JSON
        self._prose(inner, out)  # malformed call: keep the words, never the tags

    def _prose(self, text: str, out: list[Item]) -> None:
        text = _strip_markers(text)
        if not text:
            return
        last = out[-1] if out else None
        if isinstance(last, str):
            out[-1] = last + text
        else:
            out.append(text)


@dataclass(frozen=True)
class ParsedMessage:
    content: str
    tool_calls: tuple[ToolCallDelta, ...]


def parse_tool_calls(text: str, tool_names: Iterable[str] | None = None, allow_bare_json: bool = True) -> ParsedMessage:
    """Whole-text convenience wrapper around :class:`ToolCallStreamParser`."""
    parser = ToolCallStreamParser(tool_names, allow_bare_json)
    items = parser.feed(text) + parser.finish()
    content = "".join(i for i in items if isinstance(i, str))
    calls = tuple(i for i in items if isinstance(i, ToolCallDelta))
    return ParsedMessage(content=content.strip() if calls else content, tool_calls=calls)
