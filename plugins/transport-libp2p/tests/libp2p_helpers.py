"""Helpers for the transport-libp2p tests: loopback configs with a network version per test."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from skulk_transport_libp2p.config import Libp2pConfig


def unique_version() -> str:
    return f"t{os.getpid()}-{secrets.token_hex(3)}"


def loopback_config(version: str, *, bootstrap: list[str] | tuple[str, ...] = (), **overrides: Any) -> Libp2pConfig:
    """Listen on 127.0.0.1 (a free port), no mDNS unless asked: tests find each other by bootstrap."""
    fields: dict[str, Any] = dict(
        listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=list(bootstrap), network_version=version, mdns=False
    )
    fields.update(overrides)
    return Libp2pConfig(**fields)


async def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - started
