"""The frames of a capability call on the provider data-plane topic, and its error vocabulary.

Caller -> provider: `open` (seq 0), `input`s, one `input_end` (the caller's half-close: ends its
input only), or `cancel` at any time. Provider -> caller: `started` (seq 0), ordered `output`s and
exactly one `end` (ok, or a typed error). Both directions carry sequence numbers, so a receiver
delivers them in order whatever the network did. Frames are JSON: small, and readable in a capture.
Describe requests (discovery) ride the same topic's request/reply.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .api import IoMode

# code -> HTTP status. 4xx: the caller's to fix (x-should-retry: false); 5xx: the provider's or the cluster's.
ERRORS: dict[str, int] = {
    "invalid_request": 400,  # the body or first message is malformed
    "invalid_input": 400,  # an input does not match the capability's input schema
    "wrong_mode": 400,  # a streaming capability through the unary route, or the reverse
    "unknown_node": 404,
    "unknown_capability": 404,
    "model_not_placed": 404,  # a first-party speech capability with no model of its kind placed
    "revision_mismatch": 409,  # the descriptor changed since discovery: discover again
    "payload_too_large": 413,
    "busy": 429,  # the node's concurrent-call cap is reached
    "cancelled": 499,  # the caller cancelled (or went away)
    "provider_error": 502,  # the provider's handler raised
    "invalid_output": 502,  # the provider produced an output that breaks its own schema
    "node_unreachable": 503,
    "deadline_exceeded": 504,
}


def status_of(code: str) -> int:
    return ERRORS.get(code, 502)


class CallError(Exception):
    """A typed failure of a call: a code from ERRORS and a message that says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return status_of(self.code)


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    call_id: str = Field(min_length=1, max_length=64)


class Open(_Frame):
    kind: Literal["open"] = "open"
    capability: str  # id@version
    revision: str
    mode: IoMode
    deadline_s: float = Field(gt=0)
    input: Any = None  # unary and server_streaming: the one input
    has_input: bool = False


class Input(_Frame):
    kind: Literal["input"] = "input"
    seq: int = Field(ge=1)
    data: Any = None


class InputEnd(_Frame):
    kind: Literal["input_end"] = "input_end"
    seq: int = Field(ge=1)


class Cancel(_Frame):
    kind: Literal["cancel"] = "cancel"
    reason: str = "cancelled by the caller"


class Started(_Frame):
    kind: Literal["started"] = "started"
    seq: Literal[0] = 0
    revision: str


class Output(_Frame):
    kind: Literal["output"] = "output"
    seq: int = Field(ge=1)
    data: Any = None


class End(_Frame):
    kind: Literal["end"] = "end"
    seq: int = Field(ge=0)
    ok: bool
    code: str = ""
    message: str = ""

    @property
    def status(self) -> int:
        return 200 if self.ok else status_of(self.code)


Frame = Annotated[Open | Input | InputEnd | Cancel | Started | Output | End, Field(discriminator="kind")]
_FRAME: TypeAdapter[Any] = TypeAdapter(Frame)


def encode(frame: BaseModel) -> bytes:
    return frame.model_dump_json().encode()


def decode(payload: bytes) -> Any:
    return _FRAME.validate_json(payload)


class Reorder:
    """Delivers frames of one direction in seq order; frames without a seq (cancel) pass at once."""

    def __init__(self, first: int) -> None:
        self.next = first
        self._held: dict[int, Any] = {}

    def push(self, frame: Any) -> list[Any]:
        seq = getattr(frame, "seq", None)
        if seq is None:
            return [frame]
        if seq < self.next or len(self._held) > 4096:
            return []  # a duplicate, or a flood past any sane reordering window
        self._held[seq] = frame
        ready = []
        while self.next in self._held:
            ready.append(self._held.pop(self.next))
            self.next += 1
        return ready
