"""What an extension author imports: the capability descriptor, the Capability base class, errors.

An extension is an object (a module, a class or an instance) that an entry point in the
``skulk.extensions`` group names. It declares which Skulk versions it was built for and returns
its capabilities; Skulk does the rest (discovery, calls, streams, schemas, deadlines, lifecycle):

    class Echo(Capability):
        descriptor = Descriptor(id="echo.unary", version="1.0.0", description="...",
                                input_schema={...}, output_schema={...}, mode=IoMode.UNARY)

        async def call(self, payload):
            return {"text": payload["text"]}

    class EchoExtension:
        skulk_requires = ">=0.1,<0.2"          # the skulk-kernel versions it was built for

        def capabilities(self):
            return [Echo()]

A handler never owns the stream: Skulk sends `started` before the handler runs and exactly one
terminal after it returns or raises, so a misbehaving handler cannot corrupt a call's lifecycle.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


class IoMode(StrEnum):
    """How a capability's input and output flow: one message each, or a stream on either side."""

    UNARY = "unary"  # one input, one output (POST /v1/capabilities/call)
    SERVER_STREAMING = "server_streaming"  # one input, a stream of outputs
    CLIENT_STREAMING = "client_streaming"  # a stream of inputs (ended by the caller), one output
    BIDIRECTIONAL = "bidirectional"  # both streams, independent

    @property
    def streams_input(self) -> bool:
        return self in (IoMode.CLIENT_STREAMING, IoMode.BIDIRECTIONAL)


class Descriptor(BaseModel):
    """A capability, self-described: what it is called, what it takes and gives, how it flows.

    `revision` is a digest of everything else, so a caller that pinned the revision it read at
    discovery learns (409 revision_mismatch) when the provider changed under it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$", description="dotted lowercase name, e.g. stt.realtime")
    version: str = Field(description="semantic version of the capability's contract")
    description: str = Field(min_length=1, max_length=2000, description="for people and for models choosing tools")
    input_schema: dict[str, Any] = Field(description="JSON Schema of one input message")
    output_schema: dict[str, Any] = Field(description="JSON Schema of one output message")
    mode: IoMode

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        if not SEMVER.match(value):
            raise ValueError(f"version {value!r} is not a semantic version (MAJOR.MINOR.PATCH)")
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)  # a bad schema fails at load, not at the first call
        except SchemaError as exc:
            raise ValueError(f"not a JSON Schema: {exc.message}") from None
        return value

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ref(self) -> str:
        return f"{self.id}@{self.version}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def revision(self) -> str:
        body = self.model_dump(mode="json", exclude={"ref", "revision"})
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


class Capability:
    """Base class of what an extension offers. Implement `call` (unary) or `stream` (the others).

    `stream` gets the caller's inputs as an async iterator (already schema-checked; it ends when the
    caller half-closes) and yields outputs (each schema-checked before it leaves the node). For
    server_streaming it gets exactly one input; for client_streaming it must yield exactly one output.
    """

    descriptor: Descriptor

    async def call(self, payload: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} implements no unary call")

    def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} implements no stream")

    def ready(self) -> bool:
        """Whether it can serve calls now. Asked every second, cheaply; the node advertises the
        capability (its telemetry tag) only while True. Raising counts as not ready."""
        return True


@runtime_checkable
class Extension(Protocol):
    """What an entry point in `skulk.extensions` resolves to (a class is instantiated after the check)."""

    skulk_requires: str  # PEP 440 specifier of the skulk-kernel versions it was built for, e.g. ">=0.1,<0.2"

    def capabilities(self) -> Sequence[Capability]: ...


class ProviderError(Exception):
    """Raise from a handler to end the call with your own code and message (still a typed error)."""

    def __init__(self, message: str, code: str = "provider_error") -> None:
        super().__init__(message)
        self.code = code
