"""skulk-echo-provider: the reference extension (a unary and a bidirectional capability)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from skulk_providers.api import Capability, Descriptor, IoMode

TEXT = {"type": "string", "maxLength": 100_000}


class EchoUnary(Capability):
    descriptor = Descriptor(
        id="echo.unary",
        version="1.0.0",
        description="Returns the text it is given, with its length. fail=true makes the handler raise (for tests).",
        input_schema={"type": "object", "properties": {"text": TEXT, "fail": {"type": "boolean"}},
                      "required": ["text"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {"text": TEXT, "length": {"type": "integer", "minimum": 0}},
                       "required": ["text", "length"], "additionalProperties": False},
        mode=IoMode.UNARY,
    )  # fmt: skip

    async def call(self, payload: Any) -> Any:
        if payload.get("fail"):
            raise RuntimeError("asked to fail")
        return {"text": payload["text"], "length": len(payload["text"])}


class EchoDuplex(Capability):
    descriptor = Descriptor(
        id="echo.duplex",
        version="1.0.0",
        description="Echoes every input text upper-cased as it arrives; after the caller half-closes, one summary.",
        input_schema={"type": "object", "properties": {"text": TEXT}, "required": ["text"],
                      "additionalProperties": False},
        output_schema={"type": "object", "properties": {"text": TEXT, "index": {"type": "integer", "minimum": 0}},
                       "required": ["text", "index"], "additionalProperties": False},
        mode=IoMode.BIDIRECTIONAL,
    )  # fmt: skip

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        count = 0
        async for message in inputs:
            count += 1
            yield {"text": message["text"].upper(), "index": count}
        yield {"text": f"{count} messages", "index": count + 1}


class EchoExtension:
    """The entry point `echo`: built for this Skulk (skulk-kernel 0.1)."""

    skulk_requires = ">=0.1,<0.2"

    def capabilities(self) -> Sequence[Capability]:
        return [EchoUnary(), EchoDuplex()]


class FutureExtension(EchoExtension):
    """The entry point `echo-future`: built for a Skulk that does not exist yet (refused at load)."""

    skulk_requires = ">=9,<10"
