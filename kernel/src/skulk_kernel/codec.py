"""Bytes on the wire and on disk: msgpack of the camelCase wire form."""

from __future__ import annotations

from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, TypeAdapter

M = TypeVar("M", bound=BaseModel)


def encode(model: BaseModel) -> bytes:
    return msgpack.packb(model.model_dump(mode="json", by_alias=True), use_bin_type=True)


def decode(data: bytes, model: type[M]) -> M:
    return model.model_validate(msgpack.unpackb(data, raw=False))


def decode_union(data: bytes, adapter: TypeAdapter[Any]) -> Any:
    return adapter.validate_python(msgpack.unpackb(data, raw=False))
