"""The kernel's own trylast implementations of the decision hooks."""

from __future__ import annotations

from typing import Any

from .hookspecs import hookimpl


@hookimpl(trylast=True)
def resolve_model(ref: str, catalog: dict[str, Any]) -> Any:
    if ref in catalog:
        return catalog[ref]
    lowered = ref.lower()
    for model_id, card in catalog.items():
        mid = model_id.lower()
        if mid == lowered or mid.endswith("/" + lowered):
            return card
    return None
