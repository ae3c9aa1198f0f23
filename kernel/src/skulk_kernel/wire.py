"""Wire conventions shared by every kernel type.

Two conventions keep `/state` and the control API shape-compatible with the reference system:

* every model serializes with camelCase aliases (and accepts either spelling on input);
* members of a sum type serialize as single-key tagged objects: ``{"RunnerReady": {}}``.

`Tagged` models wrap themselves in their class name; `tagged_union(*types)` builds the annotated
Union that dispatches on that key. Every model is frozen and forbids unknown fields, because a
replicated type that silently drops a field is how two nodes end up with different State.
"""

from __future__ import annotations

from typing import Annotated, Any, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """Base of every replicated or wire-visible kernel type."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, ser_json_inf_nan="strings"
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-compatible wire form (camelCase, tagged)."""
        return self.model_dump(mode="json", by_alias=True)


class Tagged(WireModel):
    """A member of a sum type: serialized as ``{ClassName: {...fields}}``."""

    @model_serializer(mode="wrap")
    def _wrap_in_tag(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {type(self).__name__: handler(self)}

    @model_validator(mode="before")
    @classmethod
    def _unwrap_tag(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) == 1 and cls.__name__ in data:
            inner = data[cls.__name__]
            return {} if inner is None else inner
        return data


def _tag_of(value: Any) -> str | None:
    if isinstance(value, dict):
        return next(iter(value)) if len(value) == 1 else None
    return type(value).__name__


def tagged_union(*types: Any) -> Any:
    """An annotated Union of Tagged types that validates by the single key of the wire object.

    Takes the member classes, or one ``A | B`` union (so a module can write the union once, as the
    type alias a checker sees, and rebind it to the validating form at run time).
    """
    if len(types) == 1 and get_args(types[0]):
        types = get_args(types[0])
    members = tuple(Annotated[t, Tag(t.__name__)] for t in types)
    # Union over a runtime tuple: `X | Y` cannot spell it, so ruff's UP007 rewrite breaks it.
    return Annotated[Union[members], Discriminator(_tag_of)]  # type: ignore[valid-type]  # noqa: UP007
