"""The small, kernel-independent event vocabulary both llama.cpp backends stream.

These are deliberately plain frozen dataclasses (no pydantic): they are created once per token
on the hot path, and the plugin wiring maps them onto the kernel's own chunk types. Keeping
them here means the backends can be tested with real models without importing the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "tool_calls"]

#: Called between tokens; returning True stops the generation (the HTTP stream is closed, or
#: the in-process generator is abandoned, so the engine stops decoding for this request).
CancelCheck = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token. ``bytes`` is exact; ``token`` may be lossy for partial UTF-8."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None
    top: tuple[TopLogprob, ...] = ()
    id: int | None = None  # the token id, where the backend reports it


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Visible assistant text. ``logprobs`` covers the tokens that produced this text, when
    asked for (it may be empty when a delta was released from a tool-call hold-back buffer)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: the ids of the tokens that produced this text, when asked for (``token_ids``)
    ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (a ``<think>`` block, or the server's ``reasoning_content``), never the answer."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One complete tool call (never a fragment): ``arguments_json`` is a JSON object text."""

    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Working:
    """Tokens came that show nothing yet: a tool call's arguments, text a tool-call parser holds
    back. The engine turns a run of these into a keep-alive now and then, so a long tool call is not
    taken for a dead runner by the API node's idle timeout."""


Event = TextDelta | ReasoningDelta | ToolCallDelta | Working | Finish


class BackendError(RuntimeError):
    """The engine failed a request (bad request, engine-side parse error, crash)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ContextLengthExceeded(BackendError):
    """The prompt (plus requested completion) does not fit the context window."""
