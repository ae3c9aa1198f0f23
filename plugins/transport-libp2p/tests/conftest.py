from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from libp2p_helpers import loopback_config, unique_version
from skulk_transport_libp2p.transport import Libp2pTransport


@pytest.fixture
def version() -> str:
    return unique_version()


@pytest.fixture
async def make_transport(version: str) -> AsyncIterator[Any]:
    """start(node_id, **config overrides) -> a started Libp2pTransport; all are stopped afterwards."""
    started: list[Libp2pTransport] = []

    async def start(node_id: str, **overrides: Any) -> Libp2pTransport:
        overrides.setdefault("version", version)
        transport = Libp2pTransport(loopback_config(overrides.pop("version"), **overrides))
        await transport.start(node_id, {"plane": "control"})
        started.append(transport)
        return transport

    yield start
    for transport in reversed(started):
        await transport.stop()
