"""The cluster's placement defaults (`PUT /config`) fill what a placement leaves out ([dashboard] Settings)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from skulk_api_control.placement_defaults import with_defaults
from skulk_kernel.api import ModelCard

CARD = ModelCard(model_id="org/m", n_layers=1, hidden_size=8, context_length=4096)


def node(**settings: Any) -> Any:
    data = {f"config.{k}": {"value": v, "setBy": "n", "at": 0.0} for k, v in settings.items()}
    return SimpleNamespace(state=SimpleNamespace(plugin_data={"observe": data}))


def test_defaults_fill_only_what_the_request_leaves_out() -> None:
    n = node(default_context_tokens=2048, default_kv_cache_type="q8_0")
    assert with_defaults(n, {"model_id": "org/m"}, CARD) == {
        "model_id": "org/m",
        "context_tokens": 2048,
        "kv_cache_type": "q8_0",
    }
    asked = {"model_id": "org/m", "context_tokens": 1024, "kv_cache_type": "f16"}
    assert with_defaults(n, asked, CARD) == asked


def test_a_default_above_the_models_context_is_capped_and_nonsense_is_ignored() -> None:
    assert with_defaults(node(default_context_tokens=100_000), {"model_id": "org/m"}, CARD)["context_tokens"] == 4096
    assert with_defaults(node(default_kv_cache_type="q2"), {"model_id": "org/m"}, CARD) == {"model_id": "org/m"}
    assert with_defaults(node(), {"model_id": "org/m", "kv_cache_type": None}, None) == {
        "model_id": "org/m",
        "kv_cache_type": None,
    }
