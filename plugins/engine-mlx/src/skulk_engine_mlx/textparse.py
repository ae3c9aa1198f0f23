"""Turning generated text into what a client may see: stop strings, reasoning, tool calls.

Why one small state machine instead of the llama.cpp plugin's parser: importing
``skulk_engine_llamacpp`` would make this engine depend on xllamacpp and friends (a Mac running
only MLX has no use for them), and MLX needs less: Hermes-style ``<tool_call>{json}</tool_call>``
(what mlx-lm's chat templates and our ChatML fallback render), ``<think>...</think>`` reasoning,
and stop strings. Guarantees: a stop string is never emitted, not even in part (text that could
be the start of one is held back until decided); tags never leak into prose.

Every rank runs the same parser on the same tokens, so all ranks agree on when a stop string
ended the generation without an extra collective.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from skulk_kernel.api import ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
#: Special markers a model may print as text; never shown.
STRIP = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>")


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    reasoning: bool = False


Item = Text | ToolCall


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_call_from_json(body: str, known: frozenset[str] | None) -> ToolCall | None:
    """One ``{"name": .., "arguments": {..}}`` object as a ToolCall, or None if it is not one."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    name = value["name"].strip()
    if not name or (known is not None and name not in known):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=new_call_id(), name=name, arguments=json.dumps(args, ensure_ascii=False, separators=(",", ":")))


class TextRouter:
    """Incremental: ``feed(text)`` returns the items safe to show now; ``finish()`` flushes.

    ``stopped`` turns true when a stop string appeared (the caller ends with "stop").
    """

    def __init__(self, stops: Iterable[str] = (), tools: Iterable[str] | None = None, thinking: bool = False):
        self.stops = tuple(s for s in stops if s)
        self.tools = frozenset(tools) if tools is not None else None
        self.reasoning = thinking
        self.in_tool = False
        self.stopped = False
        self._buf = ""
        self._tool_buf = ""
        markers = [*self.stops, THINK_OPEN, THINK_CLOSE, *STRIP]
        if self.tools is not None:
            markers += [TOOL_OPEN, TOOL_CLOSE]
        self._markers = tuple(markers)

    def feed(self, text: str) -> list[Item]:
        if self.stopped or not text:
            return []
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Item]:
        out = [] if self.stopped else self._drain(final=True)
        if self.in_tool and self._tool_buf.strip():
            call = tool_call_from_json(self._tool_buf.strip(), self.tools)
            if call is not None:  # a call whose closing tag was never generated
                out.append(call)
        self._tool_buf = ""
        self.in_tool = False
        return out

    def _hold(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a marker."""
        best = 0
        for marker in self._markers:
            for n in range(min(len(marker) - 1, len(buf)), best, -1):
                if buf.endswith(marker[:n]):
                    best = n
                    break
        return best

    def _emit(self, text: str, out: list[Item]) -> None:
        if not text:
            return
        if self.in_tool:
            self._tool_buf += text
            return
        if out and isinstance(out[-1], Text) and out[-1].reasoning == self.reasoning:
            out[-1] = Text(out[-1].text + text, self.reasoning)
        else:
            out.append(Text(text, self.reasoning))

    def _drain(self, final: bool) -> list[Item]:
        out: list[Item] = []
        while self._buf:
            found = [(i, m) for m in self._markers if (i := self._buf.find(m)) >= 0]
            if not found:
                hold = 0 if final else self._hold(self._buf)
                self._emit(self._buf[: len(self._buf) - hold], out)
                self._buf = self._buf[len(self._buf) - hold :]
                break
            at, marker = min(found, key=lambda f: (f[0], -len(f[1])))
            self._emit(self._buf[:at], out)
            self._buf = self._buf[at + len(marker) :]
            if marker in self.stops:
                self.stopped = True
                self._buf = ""
                break
            self._switch(marker, out)
        return out

    def _switch(self, marker: str, out: list[Item]) -> None:
        if marker == THINK_OPEN and not self.in_tool:
            self.reasoning = True
        elif marker == THINK_CLOSE and not self.in_tool:
            self.reasoning = False
        elif marker == TOOL_OPEN and not self.in_tool:
            self.in_tool, self._tool_buf = True, ""
        elif marker == TOOL_CLOSE and self.in_tool:
            body, self.in_tool, self._tool_buf = self._tool_buf.strip(), False, ""
            call = tool_call_from_json(body, self.tools)
            if call is not None:
                out.append(call)
            elif body:
                self._emit(body, out)  # malformed call: keep the words, never the tags
