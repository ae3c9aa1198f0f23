"""The cluster's placement defaults (`PUT /config`: `default_context_tokens`, `default_kv_cache_type`),
filled into a placement that names neither.

They are cluster-wide settings (the observe plugin's replicated config in State), so a default set on
any node shapes the next placement asked of every node. An explicit value in the request wins; a
default context above a model's own is capped to it (a default is not a request to refuse).
"""

from __future__ import annotations

from typing import Any

from skulk_kernel.api import ModelCard, NodeSurface

CONFIG_PLUGIN = "observe"  # whose plugin data holds `config.<name>` (skulk_observe.config)
KV_TYPES = ("f16", "q8_0", "q4_0")


def _setting(node: NodeSurface, name: str) -> Any:
    entry = node.state.plugin_data.get(CONFIG_PLUGIN, {}).get(f"config.{name}")
    return entry.get("value") if isinstance(entry, dict) and not entry.get("secret") else None


def with_defaults(node: NodeSurface, body: dict[str, Any], card: ModelCard | None) -> dict[str, Any]:
    """`body` with the cluster's defaults for what it leaves out (a new dict; the body is not changed)."""
    out = dict(body)
    if out.get("context_tokens") is None:
        context = _setting(node, "default_context_tokens")
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            out["context_tokens"] = min(context, card.context_length) if card is not None else context
    if not out.get("kv_cache_type"):
        kv = _setting(node, "default_kv_cache_type")
        if kv in KV_TYPES:
            out["kv_cache_type"] = kv
    return out
