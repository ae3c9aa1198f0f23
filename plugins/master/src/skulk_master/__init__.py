"""Skulk's master role.

`MASTER` is the key the master plugin publishes its per-node `Master` under
(``node.services.get(MASTER)``); `Master` is imported for the type checker only, since the
sequencer pulls in msgpack and zstandard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:
    from .sequencer import Master

MASTER: ServiceKey[Master] = ServiceKey("master")
