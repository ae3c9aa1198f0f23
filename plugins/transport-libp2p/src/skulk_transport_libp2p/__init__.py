"""Skulk's libp2p transport: the control (and telemetry) plane over gossipsub, Noise only, version-keyed.

Importing this package is cheap: libp2p and trio are imported only when a transport starts.
"""

from .config import NETWORK_VERSION, Libp2pConfig, effective_network_version

__all__ = ["NETWORK_VERSION", "Libp2pConfig", "effective_network_version"]
