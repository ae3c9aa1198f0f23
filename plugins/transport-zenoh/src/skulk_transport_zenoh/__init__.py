"""Skulk's Zenoh transport: all three planes, membership and request/reply over Eclipse Zenoh.

Importing this package is cheap: `zenoh` is imported only when a transport starts.
"""

from .config import NETWORK_VERSION, ZenohConfig, effective_network_version

__all__ = ["NETWORK_VERSION", "ZenohConfig", "effective_network_version"]
