"""Reasoning out of generated text: ``<think> ... </think>`` blocks become reasoning, the rest the answer.

Why here and not in llama.cpp: the prompt-mode path (``/v1/completions``) and llama-cpp-python get no
reasoning parsing from the engine, and a template may open the block itself (the generation prompt
ends in ``<think>\\n``), so the model's text starts *inside* it. One small streaming splitter serves
both backends; text that could be the start of a marker is held back until it is decided, so no
marker ever reaches the answer.
"""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ThinkSplitter:
    """``feed(text)`` -> ``[(is_reasoning, text), ...]`` safe to emit now; ``finish()`` flushes.

    ``started_inside``: the prompt already opened the block (the template wrote ``<think>``).
    Only a block at the start of the answer (after whitespace) is reasoning; a ``<think>`` later in
    an answer is text, as the chat templates that emit the markers intend.
    """

    def __init__(self, started_inside: bool = False) -> None:
        self._inside = started_inside
        self._at_start = not started_inside
        self._done = False  # the one reasoning block is over: everything else is answer text
        self._buf = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[tuple[bool, str]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        while self._buf:
            if self._done:
                out.append((False, self._buf))
                self._buf = ""
            elif self._at_start:
                head = self._buf.lstrip()
                if not head:
                    if final:
                        out.append((False, self._buf))
                        self._buf = ""
                    break
                if head.startswith(OPEN):
                    self._buf = head[len(OPEN) :].lstrip("\n")
                    self._inside, self._at_start = True, False
                elif OPEN.startswith(head) and not final:
                    break  # may still become "<think>"
                else:
                    self._at_start, self._done = False, True
            elif self._inside:
                at = self._buf.find(CLOSE)
                if at >= 0:
                    if at:
                        out.append((True, self._buf[:at]))
                    self._buf = self._buf[at + len(CLOSE) :].lstrip("\n")
                    self._inside, self._done = False, True
                    continue
                hold = 0 if final else _partial(self._buf, CLOSE)
                if len(self._buf) > hold:
                    out.append((True, self._buf[: len(self._buf) - hold]))
                self._buf = self._buf[len(self._buf) - hold :] if hold else ""
                break
        return [(r, t) for r, t in out if t]


def split_reasoning(text: str, started_inside: bool = False) -> tuple[str, str]:
    """Whole-text convenience: ``(reasoning, answer)``."""
    s = ThinkSplitter(started_inside)
    parts = s.feed(text) + s.finish()
    return "".join(t for r, t in parts if r), "".join(t for r, t in parts if not r)
