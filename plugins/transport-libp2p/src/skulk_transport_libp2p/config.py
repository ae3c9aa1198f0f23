"""`[plugins.transport-libp2p]`, the network version and the private-network key. Pure: no libp2p here."""

from __future__ import annotations

import hashlib
import os
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The same network version transport-zenoh gates on (and the same environment override), so one
# SKULK_NETWORK_VERSION keeps a node out of another version's cluster on every plane.
NETWORK_VERSION = "1"
ENV_NETWORK_VERSION = "SKULK_NETWORK_VERSION"
ENV_BOOTSTRAP = "SKULK_LIBP2P_BOOTSTRAP"
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_version(version: str) -> str:
    if not _VERSION_RE.fullmatch(version):
        raise ValueError(f"network version {version!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return version


class Libp2pConfig(BaseModel):
    """`[plugins.transport-libp2p]` in a profile. Every default suits a LAN of a few dozen nodes."""

    model_config = ConfigDict(extra="forbid")

    listen: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
        description="listen multiaddrs (port 0: a free port)",
    )
    bootstrap: list[str] = Field(
        default_factory=list,
        description=(
            "multiaddrs to dial (/ip4/H/tcp/P, /p2p/ID optional), added to the multiaddrs in "
            f"NodeOptions.bootstrap_peers and ${ENV_BOOTSTRAP} (comma-separated)"
        ),
    )
    mdns: bool = Field(default=True, description="find peers on the LAN by mDNS")
    lease_s: float = Field(default=3.0, gt=0.3, le=600, description="a peer silent this long is dropped")
    beat_s: float = Field(default=0.5, gt=0.02, description="heartbeat interval on each peer link")
    redial_s: float = Field(default=1.0, gt=0.05, description="how often known, unconnected peers are dialed")
    dial_timeout_s: float = Field(default=3.0, gt=0.1, description="a dial (TCP + PSK + Noise + mux) gives up after")
    gossip_heartbeat_s: int = Field(default=1, ge=1, le=60, description="gossipsub heartbeat (library default 120)")
    queue_depth: int = Field(default=8192, ge=64, description="per-peer gossipsub send queue (library default 32)")
    pace_at: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="publishes wait while any peer's queue is fuller than this fraction",
    )
    send_queue: int = Field(default=8192, ge=16, description="messages waiting to enter libp2p (then publish waits)")
    reorder_gap_s: float = Field(
        default=1.0,
        gt=0,
        description="a missing message holds back later ones from its publisher this long",
    )
    max_request_bytes: int = Field(default=4 << 20, ge=1024, description="largest request (and link frame) read")
    restart_backoff_s: float = Field(default=0.5, gt=0, description="first wait before restarting after a crash")
    network_version: str | None = Field(
        default=None,
        description=f"overrides ${ENV_NETWORK_VERSION} and the built-in NETWORK_VERSION",
    )

    @field_validator("network_version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        return None if value is None else check_version(value)


def effective_network_version(config: Libp2pConfig | None = None) -> str:
    """config.network_version, else $SKULK_NETWORK_VERSION, else NETWORK_VERSION (as transport-zenoh)."""
    if config is not None and config.network_version:
        return config.network_version
    return check_version(os.environ.get(ENV_NETWORK_VERSION) or NETWORK_VERSION)


def network_psk(version: str, cluster_secret: bytes = b"") -> str:
    """The libp2p private-network key (64 hex digits) of a network version.

    Every connection is encrypted with it below Noise, so a node of another version, or one
    without the cluster secret (the transport passes a key derived from it), cannot even negotiate
    a protocol.
    """
    return hashlib.sha256(b"skulk-libp2p-pnet:" + version.encode() + b":" + cluster_secret).hexdigest()


def bootstrap_multiaddrs(config: Libp2pConfig, bootstrap_peers: tuple[str, ...] | list[str]) -> list[str]:
    """The multiaddrs to dial: config, then node options, then the environment. Others are ignored.

    NodeOptions.bootstrap_peers is shared by every transport of the node; entries that are not
    multiaddrs (``tcp/HOST:PORT`` is Zenoh's) belong to another transport.
    """
    env = [p for p in os.environ.get(ENV_BOOTSTRAP, "").split(",") if p]
    found = [p.strip() for p in [*config.bootstrap, *bootstrap_peers, *env]]
    return list(dict.fromkeys(p for p in found if p.startswith("/")))
