"""The reference system's wire names, kept at the edge of the control API only.

Tools written for the reference read `/state.instances` tagged `MlxRingInstance` and send
`instance_meta: "MlxRing"`; inside Skulk an instance whose ranks form a ring (a single-node
instance is a ring of one) is a `RingInstance`, whatever its engine. This module translates both
ways, so no internal type carries a name that misdescribes it.
"""

from __future__ import annotations

from typing import Any

TO_REFERENCE = {"RingInstance": "MlxRingInstance"}
FROM_REFERENCE = {v: k for k, v in TO_REFERENCE.items()}
INSTANCE_METAS = ("MlxRing",)  # the `instance_meta` values this cluster can run
UNSUPPORTED_METAS = {
    "MlxJaccl": "RDMA over Thunderbolt (MlxJaccl) needs Apple hardware links this cluster does not have",
    "LlamaRpc": "llama.cpp RPC pooling (LlamaRpc) needs an RPC-enabled llama.cpp build that no package ships",
}


def _rename(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {names.get(k, k): _rename(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return value


def to_reference(wire: Any) -> Any:
    """A wire dict (State, an event, an instance) with the reference's tag names."""
    return _rename(wire, TO_REFERENCE)


def from_reference(wire: Any) -> Any:
    """A wire dict in the reference's names (POST /instance bodies) with Skulk's own."""
    return _rename(wire, FROM_REFERENCE)


def instance_meta_error(meta: Any) -> str | None:
    """Why `instance_meta` cannot be honoured, or None when it can."""
    if not isinstance(meta, str | None):  # a list or an object is no name (and unhashable)
        return f"instance_meta must be one of {list(INSTANCE_METAS)}, got {meta!r}"
    if meta is None or meta in INSTANCE_METAS:
        return None
    if meta in UNSUPPORTED_METAS:
        return f"instance_meta {meta!r} is not available: {UNSUPPORTED_METAS[meta]}; use 'MlxRing'"
    return f"instance_meta must be one of {list(INSTANCE_METAS)}, got {meta!r}"
