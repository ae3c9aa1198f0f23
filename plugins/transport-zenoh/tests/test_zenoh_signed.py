"""Per-node signatures: a member holding the secret still cannot pose as another node (or the master)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from skulk_kernel.api import Topic
from skulk_transport_zenoh.sealed import Opener, Rejected, Sealer
from skulk_transport_zenoh.secret import ClusterSecret, encode_token
from skulk_transport_zenoh.signing import NodeSigner, Verifier
from skulk_transport_zenoh.transport import ZenohTransport
from zenoh_helpers import loopback_config, wait_until

VERSION = "v"
CONTROL = "skulk/v/control/global_events"


def _signed(key: str) -> bool:
    return key.startswith("skulk/v/control/")


class _StolenBinding:
    """A signer that presents another node's (public) binding but signs with a key of its own."""

    def __init__(self, binding: bytes, own: NodeSigner) -> None:
        self.binding = binding
        self._own = own

    def sign(self, data: bytes) -> bytes:
        return self._own.sign(data)


def _member(cluster: ClusterSecret, node_id: str, session: bytes | None = None) -> Sealer:
    session = session or os.urandom(8)
    return Sealer(cluster.key("mac"), node_id, session, NodeSigner(cluster, VERSION, node_id, session))


def test_a_member_cannot_sign_as_another_node() -> None:
    cluster = ClusterSecret(os.urandom(32), "test")
    mac = cluster.key("mac")
    opener = Opener(mac, verifier=Verifier(cluster, VERSION), needs_signature=_signed)
    master = _member(cluster, "master")
    assert opener.open(CONTROL, master.seal(CONTROL, b"event 1", sign=True)) == ("master", b"event 1")

    mole_session = os.urandom(8)
    mole_signer = NodeSigner(cluster, VERSION, "mole", mole_session)
    attempts = {
        # Skulk's own code with a lying node id: its binding names "mole"
        "own binding": Sealer(mac, "master", mole_session, mole_signer),
        # the master's binding copied off the wire, signed with the mole's key
        "copied binding": Sealer(mac, "master", master.session, _StolenBinding(master._signer.binding, mole_signer)),  # type: ignore[arg-type,union-attr]
        # modified code that mints a CA binding for "master" (the CA derives from the secret)
        "minted binding": _member(cluster, "master"),
    }
    for what, forger in attempts.items():
        with pytest.raises(Rejected) as exc:
            opener.open(CONTROL, forger.seal(CONTROL, b"forged", sign=True))
        assert exc.value.kind == "impersonation", what
    with pytest.raises(Rejected) as exc:  # the MAC alone is no longer enough on signed topics
        opener.open(CONTROL, _member(cluster, "mole").seal(CONTROL, b"unsigned"))
    assert exc.value.kind == "unsigned"
    # the mole under its own id is fine, and unsigned frames stay fine where nobody signs
    assert opener.open(CONTROL, _member(cluster, "mole").seal(CONTROL, b"x", sign=True))[0] == "mole"
    telemetry = "skulk/v/telemetry/readings"
    assert opener.open(telemetry, master.seal(telemetry, b"reading")) == ("master", b"reading")
    # once the master has left, its next start (a new key) is accepted
    opener.verifier.release("master")  # type: ignore[union-attr]
    restarted = _member(cluster, "master")
    assert opener.open(CONTROL, restarted.seal(CONTROL, b"event 1", sign=True)) == ("master", b"event 1")
    # another cluster's CA binds nothing here, even with this cluster's MAC key
    foreign = Sealer(
        mac, "other", os.urandom(8), NodeSigner(ClusterSecret(os.urandom(32), "x"), VERSION, "other", b"s" * 8)
    )
    with pytest.raises(Rejected, match="another node"):
        opener.open(CONTROL, foreign.seal(CONTROL, b"x", sign=True))


# ------------------------------------------------------------------ real Zenoh sessions (mutual TLS)


async def _start(version: str, node_id: str, token: str, **overrides: Any) -> ZenohTransport:
    from skulk_kernel.node import NodeOptions

    transport = ZenohTransport(loopback_config(version, **overrides))
    await transport.start(node_id, {"plane": "control", "options": NodeOptions(extra={"join_token": token})})
    return transport


async def test_a_member_posing_as_the_master_or_a_peer_is_refused_on_the_wire(version: str) -> None:
    raw = os.urandom(32)
    token = encode_token(raw)
    master = await _start(version, "master", token)
    worker = await _start(version, "worker", token, connect=master.listen_locators)
    mole = await _start(version, "mole", token, connect=master.listen_locators)
    got: dict[str, list[tuple[str, bytes]]] = {"master": [], "worker": []}
    for name, transport in (("master", master), ("worker", worker)):
        for topic in (Topic.GLOBAL_EVENTS, Topic.COMMANDS):
            transport.subscribe(topic, lambda s, p, _n=name: got[_n].append((s, p)))
    try:
        for t in (master, worker):
            await wait_until(lambda t=t: {"mole", "master", "worker"} - {t.node_id} <= t.peers, 15, "the mesh")
        await asyncio.sleep(0.5)
        await master.publish(Topic.GLOBAL_EVENTS, b"real event")
        await worker.publish(Topic.COMMANDS, b"real command")
        await wait_until(lambda: ("master", b"real event") in got["worker"], 10, "the master's event")
        await wait_until(lambda: ("worker", b"real command") in got["master"], 10, "the worker's command")

        cluster = ClusterSecret(raw, "test")
        real = mole._sealer
        assert real is not None
        mole_signer = real._signer
        forgeries = [
            # the mole's own binding under the master's id (Skulk's code with a lying id)
            (Topic.GLOBAL_EVENTS, Sealer(cluster.key(f"frame-mac:{version}"), "master", real.session, mole_signer)),
            # a minted CA binding for the master's id: the master is live with another key
            (Topic.GLOBAL_EVENTS, _forger(cluster, version, "master")),
            # a command posing as the worker
            (Topic.COMMANDS, _forger(cluster, version, "worker")),
        ]
        for topic, forger in forgeries:
            mole._sealer = forger
            await mole.publish(topic, b"forged")
        mole._sealer = real
        await mole.publish(Topic.COMMANDS, b"honest command")
        await wait_until(lambda: ("mole", b"honest command") in got["master"], 10, "the mole's honest command")
        await wait_until(lambda: worker.rejected_frames.get("impersonation", 0) >= 3, 10, "the worker's rejections")
        await wait_until(lambda: master.rejected_frames.get("impersonation", 0) >= 3, 10, "the master's rejections")
        assert all(p != b"forged" for side in got.values() for _, p in side)
        # the worker pinned both keys; the master refuses its own id and the worker's second key
        assert worker.rejected_frames == {"impersonation": 3}
        assert master.rejected_frames == {"impersonation": 3}
    finally:
        for transport in (mole, worker, master):
            await transport.stop()


def _forger(cluster: ClusterSecret, version: str, node_id: str) -> Sealer:
    session = os.urandom(8)
    key = cluster.key(f"frame-mac:{version}")
    return Sealer(key, node_id, session, NodeSigner(cluster, version, node_id, session))
