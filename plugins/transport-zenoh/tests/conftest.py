from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from skulk_transport_zenoh.transport import ZenohTransport
from zenoh_helpers import PeerProcess, loopback_config, unique_version


@pytest.fixture
def version() -> str:
    return unique_version()


@pytest.fixture
async def make_transport(version: str) -> AsyncIterator[Any]:
    """start(node_id, **config overrides) -> a started ZenohTransport; all are stopped afterwards."""
    started: list[ZenohTransport] = []

    async def start(node_id: str, *, subscribe: dict[Any, Any] | None = None, **overrides: Any) -> ZenohTransport:
        overrides.setdefault("version", version)
        config = loopback_config(overrides.pop("version"), **overrides)
        transport = ZenohTransport(config)
        for topic, callback in (subscribe or {}).items():
            transport.subscribe(topic, callback)
        await transport.start(node_id, {"plane": "control"})
        started.append(transport)
        return transport

    yield start
    for transport in reversed(started):
        await transport.stop()


@pytest.fixture
def spawn(version: str) -> Iterator[Any]:
    """spawn(node_id, **kw) -> a PeerProcess (not yet ready); every one is reaped afterwards."""
    procs: list[PeerProcess] = []

    def start(node: str, **kwargs: Any) -> PeerProcess:
        kwargs.setdefault("version", version)
        proc = PeerProcess(node, kwargs.pop("version"), **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()
