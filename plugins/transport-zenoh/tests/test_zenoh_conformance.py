"""The kernel's Transport conformance suite and the plugin suite, run against transport-zenoh."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from skulk_testing.conformance import PluginConformance, TransportConformance
from skulk_transport_zenoh.transport import ZenohTransport
from zenoh_helpers import loopback_config, unique_version


class TestZenohPlugin(PluginConformance):
    plugin_name = "transport-zenoh"


class TestZenohTransportConformance(TransportConformance):
    node_id = "conformance-node"

    @pytest.fixture
    def transport(self) -> Any:
        return ZenohTransport(loopback_config(unique_version()))


def test_registration_imports_no_zenoh() -> None:
    """Building the transport object (what every node and runner does) must not import zenoh."""
    import subprocess

    probe = (
        "import sys\nfrom skulk_transport_zenoh.transport import ZenohTransport\n"
        "ZenohTransport()\nprint('zenoh' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
