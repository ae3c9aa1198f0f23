"""Skulk's worker role.

`WORKER` is the key the worker plugin publishes its per-node `Worker` under
(``node.services.get(WORKER)``); `Worker` is imported for the type checker only, since it pulls in
psutil and the runner supervisor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:
    from .worker import Worker

WORKER: ServiceKey[Worker] = ServiceKey("worker")
