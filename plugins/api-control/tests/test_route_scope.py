"""Which scope each route needs when API keys are enforced (the auth gate's one decision)."""

from __future__ import annotations

import pytest
from skulk_api_control.auth import route_scope


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/", None),
        ("GET", "/ui/assets/app.js", None),
        # probes (load balancers, guidellm) carry no key, like vLLM's /health
        ("GET", "/health", None),
        ("HEAD", "/health", None),
        ("GET", "/v1/health", None),
        ("POST", "/v1/chat/completions", "inference"),
        ("POST", "/api/chat", "inference"),
        ("POST", "/v1/completions", "inference"),
        ("POST", "/tokenize", "inference"),
        ("GET", "/tokenizer_info", "inference"),
        ("GET", "/v1/models", "inference"),
        ("POST", "/v1/rerank", "inference"),
        ("POST", "/rerank", "inference"),
        ("POST", "/v1/score", "inference"),
        ("GET", "/api/ps", "inference"),
        # Ollama's model management changes what the cluster holds: operator keys only
        ("POST", "/api/pull", "operator"),
        ("POST", "/api/push", "operator"),
        ("POST", "/api/create", "operator"),
        ("POST", "/api/copy", "operator"),
        ("DELETE", "/api/delete", "operator"),
        ("POST", "/api/blobs/sha256:00", "operator"),
        ("HEAD", "/api/blobs/sha256:00", "operator"),
        ("GET", "/state", "operator"),
        ("POST", "/place_instance", "operator"),
        ("POST", "/store/purge-staging", "operator"),
        # node to node: the store checks membership and its own transfer tokens
        ("POST", "/store/peer/grant", None),
        ("GET", "/store/peer/files/org/model", None),
    ],
)
def test_route_scope(method: str, path: str, scope: str | None) -> None:
    assert route_scope(method, path) == scope
