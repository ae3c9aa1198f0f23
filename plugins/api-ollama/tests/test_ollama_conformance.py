"""The plugin and its adapter against the skulk-testing conformance suites."""

from __future__ import annotations

from typing import Any

import pytest
from skulk_api_ollama.adapter import OllamaChatAdapter
from skulk_testing.conformance import ApiAdapterConformance, PluginConformance


class TestOllamaPlugin(PluginConformance):
    plugin_name = "api-ollama"
    hook_owners = ("api-control",)  # it implements register_api_routes


class TestOllamaAdapter(ApiAdapterConformance):
    @pytest.fixture
    def adapter(self) -> OllamaChatAdapter:
        return OllamaChatAdapter(model="skulk/echo")

    @pytest.fixture
    def request_body(self) -> dict[str, Any]:
        return {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}]}
