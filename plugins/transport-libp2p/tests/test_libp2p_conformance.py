"""The kernel's Transport conformance suite and the plugin suite, run against transport-libp2p."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from libp2p_helpers import loopback_config, unique_version
from skulk_testing.conformance import PluginConformance, TransportConformance
from skulk_transport_libp2p.transport import Libp2pTransport


class TestLibp2pPlugin(PluginConformance):
    plugin_name = "transport-libp2p"
    hook_owners = ("api-control", "hardware")  # plugin_fits is hardware's hook (hardware needs api-control)


class TestLibp2pTransportConformance(TransportConformance):
    node_id = "conformance-node"

    @pytest.fixture
    def transport(self) -> Any:
        return Libp2pTransport(loopback_config(unique_version()))


def test_building_the_transport_imports_neither_libp2p_nor_trio() -> None:
    probe = (
        "import sys\nfrom skulk_transport_libp2p.transport import Libp2pTransport\n"
        "Libp2pTransport()\nprint(sorted(m for m in ('libp2p', 'trio') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
