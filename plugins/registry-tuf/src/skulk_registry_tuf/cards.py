"""Card files as the registry carries them: the store's card TOML, parsed into a `ModelCard`.

The format is the one of the store's bundled and custom cards (`plugins/store/README.md`, "Cards"):
the `ModelCard` fields at the top level, every table a free section. It is parsed here rather than
imported from the store so that this plugin depends on the kernel alone; a unit test checks that
both parsers read the store's bundled cards alike.
"""

from __future__ import annotations

import tomllib
from typing import Any

from skulk_kernel.api import ModelCard

CARD_FIELDS = frozenset(ModelCard.model_fields)
TUPLE_FIELDS = ("tasks", "capabilities", "compatible_backends", "backend_preference")


class CardError(ValueError):
    """A card file that does not describe a model; the message names the file and what is wrong."""


def card_from_toml_text(text: str, source: str) -> ModelCard:
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{source}: not valid TOML: {exc}") from None
    unknown = [k for k, v in data.items() if k not in CARD_FIELDS and not isinstance(v, dict)]
    if unknown:
        raise CardError(f"{source}: unknown card fields {unknown}")
    fields = {k: v for k, v in data.items() if k in CARD_FIELDS}
    sections = {k: v for k, v in data.items() if k not in CARD_FIELDS and isinstance(v, dict)}
    fields["sections"] = {**fields.get("sections", {}), **sections}
    for key in TUPLE_FIELDS:
        if key in fields:
            fields[key] = tuple(fields[key])
    try:
        return ModelCard(**fields)
    except Exception as exc:  # pydantic's message says which field is wrong
        raise CardError(f"{source}: {exc}") from None
