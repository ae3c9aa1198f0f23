"""`[plugins.transport-zenoh]` and the network version. Pure pydantic: no zenoh import here."""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Nodes of different network versions never form one cluster: the version is part of every key,
# of the session credentials and of the hello that reports a mismatch. Bump it on any change of
# the wire format of any plane (frames, codec, topics, events).
NETWORK_VERSION = "1"
ENV_NETWORK_VERSION = "SKULK_NETWORK_VERSION"
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_version(version: str) -> str:
    if not _VERSION_RE.fullmatch(version):
        raise ValueError(
            f"network version {version!r} must be 1-64 characters of letters, digits, '.', '_' or '-' "
            "(it becomes a Zenoh key chunk)"
        )
    return version


class ZenohConfig(BaseModel):
    """`[plugins.transport-zenoh]` in a profile. Every field has a LAN-friendly default."""

    model_config = ConfigDict(extra="forbid")

    listen: list[str] = Field(
        default_factory=lambda: ["tcp/0.0.0.0:0"],
        description="Zenoh listen endpoints; port 0 picks a free port (see ZenohTransport.listen_locators)",
    )
    connect: list[str] = Field(
        default_factory=list,
        description="Zenoh connect endpoints (tcp/HOST:PORT), added to NodeOptions.bootstrap_peers",
    )
    multicast_scouting: bool = Field(default=True, description="find peers on the LAN by UDP multicast")
    multicast_address: str | None = Field(default=None, description="scouting group; Zenoh's default if unset")
    multicast_interface: str | None = Field(default=None, description="scouting interface; 'auto' if unset")
    gossip_scouting: bool = Field(default=True, description="peers tell each other about peers (keep on)")
    lease_s: float = Field(default=3.0, gt=0.2, le=600, description="a silent peer is dropped after this")
    network_version: str | None = Field(
        default=None,
        description=f"overrides ${ENV_NETWORK_VERSION} and the built-in NETWORK_VERSION",
    )
    session_auth: bool = Field(
        default=False,
        description=(
            "also derive Zenoh user/password from the network version, so another version is refused "
            "in the handshake. Off by default: with Zenoh 1.10 it makes gossip-only meshes (explicit "
            "endpoints, no multicast) miss links under load; the version in every key already keeps "
            "other versions out. Every node of a cluster must use the same setting."
        ),
    )
    secure: bool = Field(
        default=True,
        description=(
            "members only: mutual TLS with a CA derived from the cluster secret, and an HMAC, sender and "
            "counter on every message (see secret.py). Off only for benchmarks: then anyone on the network "
            "can join. Every node of a cluster must use the same setting."
        ),
    )
    sign_control: bool = Field(
        default=True,
        description=(
            "with secure: control-plane and request/reply frames also carry an Ed25519 signature by the "
            "sender's own key, bound to its node id by the cluster CA, so a member cannot pose as another "
            "node (signing.py). Off only for benchmarks. Every node of a cluster must use the same setting."
        ),
    )
    replay_max_age_s: float = Field(
        default=300.0,
        gt=1,
        description="a session first seen with a frame older than this is a replay (or a clock that is off)",
    )
    send_queue: int = Field(default=8192, ge=16, description="bounded send queue per plane (messages)")
    hello_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="how often to probe peers' hello ports for their network version",
    )
    zenoh_log: str | None = Field(
        default=None,
        description="Zenoh's own log filter (e.g. 'warn'); RUST_LOG also works",
    )

    @field_validator("network_version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        return None if value is None else check_version(value)


def effective_network_version(config: ZenohConfig | None = None) -> str:
    """config.network_version, else $SKULK_NETWORK_VERSION, else NETWORK_VERSION."""
    if config is not None and config.network_version:
        return config.network_version
    return check_version(os.environ.get(ENV_NETWORK_VERSION) or NETWORK_VERSION)
