"""The plugin and its adapter against the skulk-testing conformance suites."""

from __future__ import annotations

from typing import Any

import pytest
from skulk_api_anthropic.adapter import AnthropicAdapter
from skulk_testing.conformance import ApiAdapterConformance, PluginConformance


class TestAnthropicPlugin(PluginConformance):
    plugin_name = "api-anthropic"
    hook_owners = ("api-control",)  # it implements register_api_routes


class TestAnthropicAdapter(ApiAdapterConformance):
    @pytest.fixture
    def adapter(self) -> AnthropicAdapter:
        return AnthropicAdapter(model="skulk/echo")

    @pytest.fixture
    def request_body(self) -> dict[str, Any]:
        return {"model": "skulk/echo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
