"""The node's background refresh: the first right away, then one per interval, off the event loop."""

from __future__ import annotations

import asyncio

from skulk_kernel.api import NodeSurface

from .service import RegistryStore

TICK_S = 1.0  # how often the loop wakes; the store itself refuses refreshes inside the interval


async def refresh_loop(node: NodeSurface, store: RegistryStore) -> None:
    while not node.stopping:
        await asyncio.to_thread(store.refresh)  # network and disk: never on the event loop
        await asyncio.sleep(min(TICK_S, store.refresh_interval_s))
