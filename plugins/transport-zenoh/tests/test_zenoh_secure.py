"""Members only: the cluster secret, mutual TLS from it, sealed frames (forged, moved, replayed)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from skulk_kernel.api import Topic
from skulk_transport_zenoh import sealed, secret
from skulk_transport_zenoh.sealed import Opener, Rejected, Sealer
from skulk_transport_zenoh.secret import ClusterSecret, SecretError, decode_token, encode_token, resolve_secret
from skulk_transport_zenoh.tls import cluster_ca, zenoh_tls_config
from skulk_transport_zenoh.transport import ZenohTransport
from zenoh_helpers import loopback_config, wait_until

# ------------------------------------------------------------------ the secret


def test_token_round_trip_and_typos_are_caught() -> None:
    raw = os.urandom(32)
    token = encode_token(raw)
    assert token.startswith("skulk1-") and decode_token(token) == raw
    with pytest.raises(SecretError, match="damaged"):
        decode_token(token[:-3] + ("0" if token[-3] != "0" else "1") + token[-2:])
    with pytest.raises(SecretError, match="starts with"):
        decode_token("hello")


def test_resolution_order_and_first_start_creates_a_private_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv(secret.ENV_JOIN_TOKEN, raising=False)
    home = tmp_path / "node"
    home.mkdir()
    first = resolve_secret(home)
    default = tmp_path / "user" / ".skulk" / "cluster.secret"
    assert first.created and first.source == str(default)
    assert stat.S_IMODE(default.stat().st_mode) == 0o600
    again = resolve_secret(tmp_path / "other-node")
    assert again.secret == first.secret and not again.created  # same user, same host: one cluster
    # a secret in the node's data dir wins over the user default, a token file over that
    other = os.urandom(32)
    (home / "cluster.secret").write_text(other.hex())
    assert resolve_secret(home).secret == other
    joined = os.urandom(32)
    (home / "join-token").write_text(encode_token(joined) + "\n")
    assert resolve_secret(home).secret == joined
    env = os.urandom(32)
    monkeypatch.setenv(secret.ENV_JOIN_TOKEN, encode_token(env))
    assert resolve_secret(home).secret == env
    flag = os.urandom(32)
    assert resolve_secret(home, join_token=encode_token(flag)).secret == flag


def test_concurrent_first_starts_agree_on_one_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(secret.ENV_JOIN_TOKEN, raising=False)
    found: list[ClusterSecret] = []
    threads = [threading.Thread(target=lambda: found.append(resolve_secret(None))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({c.secret for c in found}) == 1
    assert sum(c.created for c in found) == 1


def test_every_member_derives_the_same_ca_and_other_secrets_another() -> None:
    from cryptography.hazmat.primitives import serialization

    a = ClusterSecret(b"a" * 32, "test")
    pem = [cluster_ca(a)[1].public_bytes(serialization.Encoding.PEM) for _ in range(2)]
    assert pem[0] == pem[1]
    assert cluster_ca(ClusterSecret(b"b" * 32, "test"))[1].public_bytes(serialization.Encoding.PEM) != pem[0]
    assert a.cluster_id != ClusterSecret(b"b" * 32, "test").cluster_id


# ------------------------------------------------------------------ sealed frames


def test_sealed_frames_reject_forgery_moves_and_replays() -> None:
    key = os.urandom(32)
    sealer, opener = Sealer(key, "node-a"), Opener(key)
    frame = sealer.seal("skulk/1/control/commands", b"payload")
    assert opener.open("skulk/1/control/commands", frame) == ("node-a", b"payload")
    with pytest.raises(Rejected) as replay:
        opener.open("skulk/1/control/commands", frame)
    assert replay.value.kind == "replayed"
    moved = sealer.seal("skulk/1/control/local_events", b"x")
    with pytest.raises(Rejected) as exc:
        opener.open("skulk/1/control/global_events", moved)  # same bytes on another topic
    assert exc.value.kind == "forged"
    with pytest.raises(Rejected) as exc:
        Opener(os.urandom(32)).open("k", sealer.seal("k", b"x"))  # another cluster's key
    assert exc.value.kind == "forged"
    tampered = bytearray(sealer.seal("k", b"payload"))
    tampered[-40] ^= 1
    with pytest.raises(Rejected) as exc:
        opener.open("k", bytes(tampered))
    assert exc.value.kind == "forged"
    for junk in (b"", b"SKZ2", b"SKZ1\x03abcpayload"):
        with pytest.raises(Rejected) as exc:
            opener.open("k", junk)
        assert exc.value.kind == "malformed"


def test_out_of_order_within_the_window_is_delivered_once() -> None:
    key = os.urandom(32)
    sealer, opener = Sealer(key, "n"), Opener(key)
    frames = [sealer.seal("k", str(i).encode()) for i in range(50)]
    for frame in [*frames[25:], *frames[:25]]:  # two planes draining at different speeds
        opener.open("k", frame)
    for frame in frames:
        with pytest.raises(Rejected):
            opener.open("k", frame)
    late = [sealer.seal("k", b"late") for _ in range(sealed.WINDOW + 10)]
    for frame in late[1:]:
        opener.open("k", frame)
    with pytest.raises(Rejected) as exc:
        opener.open("k", late[0])  # older than the window: cannot be told from a replay
    assert exc.value.kind == "replayed"


def test_a_session_first_seen_long_after_it_was_sent_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    key = os.urandom(32)
    sealer = Sealer(key, "n")
    real = sealed.time.time
    monkeypatch.setattr(sealed.time, "time", lambda: real() - 3600)
    old = sealer.seal("k", b"recorded an hour ago")
    monkeypatch.setattr(sealed.time, "time", real)
    with pytest.raises(Rejected) as exc:
        Opener(key, max_age_s=300).open("k", old)
    assert exc.value.kind == "stale"


# ------------------------------------------------------------------ on the wire


def _raw_session(connect: list[str], tls: dict[str, Any] | None) -> Any:
    import zenoh

    raw = zenoh.Config()
    raw.insert_json5("mode", '"peer"')
    raw.insert_json5("listen/endpoints", "[]")
    raw.insert_json5("connect/endpoints", json.dumps(connect))
    raw.insert_json5("scouting/multicast/enabled", "false")
    if tls is not None:
        raw.insert_json5("transport/link/tls", json.dumps(tls))
    return zenoh.open(raw)


async def _start(version: str, node_id: str, token: str, **overrides: Any) -> ZenohTransport:
    from skulk_kernel.node import NodeOptions

    transport = ZenohTransport(loopback_config(version, **overrides))
    await transport.start(node_id, {"plane": "control", "options": NodeOptions(extra={"join_token": token})})
    return transport


async def test_no_session_without_the_secret_and_refusals_are_reported(version: str) -> None:
    cluster, outsider_token = encode_token(os.urandom(32)), encode_token(os.urandom(32))
    member = await _start(version, "member", cluster)
    assert member.listen_locators[0].startswith("tls/")
    port = member.listen_locators[0].rsplit(":", 1)[1]
    outsider = await _start(version, "outsider", outsider_token, connect=[f"tcp/127.0.0.1:{port}"])
    bare = await asyncio.to_thread(_raw_session, [f"tcp/127.0.0.1:{port}", f"tls/127.0.0.1:{port}"], None)
    try:
        await wait_until(lambda: "outsider" in member.refused_peers, 10, "the member to report the refused peer")
        assert "member" in outsider.refused_peers  # and the outsider learns why it is alone
        assert member.peers == frozenset() and outsider.peers == frozenset()
        assert not list(bare.info.peers_zid()) and not list(member._session.info.peers_zid())
        # with the token it joins
        joiner = await _start(version, "joiner", cluster, connect=[f"tcp/127.0.0.1:{port}"])
        try:
            await wait_until(lambda: "joiner" in member.peers, 10, "the joiner to become a member")
        finally:
            await joiner.stop()
    finally:
        bare.close()
        await outsider.stop()
        await member.stop()


async def test_forged_moved_and_replayed_frames_from_a_tls_insider_are_dropped(version: str) -> None:
    """A session that has the TLS credentials but writes its own frames: nothing unsealed gets in."""
    import zenoh

    raw_secret = os.urandom(32)
    token = encode_token(raw_secret)
    member = await _start(version, "member", token)
    sender = await _start(version, "sender", token, connect=member.listen_locators)
    got: list[tuple[str, bytes]] = []
    member.subscribe(Topic.COMMANDS, lambda s, p: got.append((s, p)))
    member.subscribe(Topic.GLOBAL_EVENTS, lambda s, p: got.append((s, p)))
    tls = zenoh_tls_config(ClusterSecret(raw_secret, "test"), "spy")
    spy = await asyncio.to_thread(_raw_session, member.listen_locators, tls)
    captured: list[bytes] = []
    commands = f"skulk/{version}/control/commands"
    spy_sub = spy.declare_subscriber(commands, lambda s: captured.append(s.payload.to_bytes()))
    try:
        await wait_until(lambda: "sender" in member.peers, 10, "the sender to join")
        await wait_until(lambda: bool(list(spy.info.peers_zid())), 10, "the spy to connect")
        await asyncio.sleep(0.5)
        await sender.publish(Topic.COMMANDS, b"real command")
        await wait_until(lambda: bool(captured) and bool(got), 10, "the command to arrive")
        assert got == [("sender", b"real command")]
        put = lambda key, frame: spy.put(key, frame, congestion_control=zenoh.CongestionControl.BLOCK)  # noqa: E731
        put(commands, captured[0])  # replayed
        put(f"skulk/{version}/control/global_events", captured[0])  # moved to another topic
        put(commands, b"SKZ1\x06master" + b"unsealed")  # the old frame, any sender it likes
        put(commands, Sealer(os.urandom(32), "master").seal(commands, b"wrong key"))
        await wait_until(lambda: sum(member.rejected_frames.values()) >= 3, 10, "the rejections")
        await asyncio.sleep(0.3)
        assert got == [("sender", b"real command")]
        assert member.rejected_frames == {"replayed": 1, "forged": 2}
        assert member.malformed_frames >= 1
        # a forged request gets an error reply, not an answer
        member.serve(Topic.STATE_SYNC, lambda s, p: b"secret state")
        await asyncio.sleep(0.3)
        replies = list(spy.get(f"skulk/{version}/rpc/state_sync/member", payload=b"SKZ1\x03spy", timeout=3))
        assert replies and all(r.ok is None for r in replies)
        assert await sender.request("member", Topic.STATE_SYNC, b"", 5) == b"secret state"
    finally:
        spy_sub.undeclare()
        spy.close()
        await sender.stop()
        await member.stop()
