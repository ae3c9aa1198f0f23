"""The plugin contract, and conflicts reaching node health."""

from __future__ import annotations

from skulk_testing.conformance import PluginConformance


class TestHardwarePlugin(PluginConformance):
    plugin_name = "hardware"
    hook_owners = ("api-control",)  # it implements register_api_routes
