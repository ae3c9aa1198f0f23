"""Skulk's bully election plugin (entry point: `skulk_election_bully.plugin`).

`ELECTION` is the key the plugin publishes its `BullyElection` under, for whoever wants to show its
`diagnostics()`; the class is imported for the type checker only, as `plugin.py` imports it lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:
    from .election import BullyElection

ELECTION: ServiceKey[BullyElection] = ServiceKey("election-bully")
