"""Several Zenoh transports in one process (each its own session and node id), on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from skulk_kernel.api import PeerEvent, Topic
from skulk_testing.conformance import Inbox
from skulk_transport_zenoh.frames import MAGIC
from skulk_transport_zenoh.transport import NoReply, RequestError, ZenohTransport
from zenoh_helpers import loopback_config, multicast_group, unique_version, wait_until

JOIN_TIMEOUT = 15.0


async def all_see_each_other(transports: list[ZenohTransport]) -> float:
    ids = {t.node_id for t in transports}
    try:
        return await wait_until(
            lambda: all(t.peers == ids - {t.node_id} for t in transports),
            JOIN_TIMEOUT,
            "every transport to see every other one",
        )
    except TimeoutError as exc:
        state = {
            t.node_id: {"zid": t.zid, "peers": sorted(t.peers), "sessions": sorted(t._connected_zids())}
            for t in transports
        }
        raise TimeoutError(f"{exc}: {state}") from None


async def warm_up(publisher: ZenohTransport, topic: Topic, inboxes: list[Inbox]) -> None:
    """Publish until every inbox heard one: remote subscriptions are live from then on."""
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not all(inbox.messages for inbox in inboxes):
        assert time.monotonic() < deadline, "subscriptions never became live"
        await publisher.publish(topic, b"warm-up")
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    for inbox in inboxes:
        inbox.messages.clear()


# ------------------------------------------------------------------ discovery


@pytest.mark.parametrize("count", [2, 3])
async def test_multicast_scouting_finds_peers(make_transport: Any, count: int) -> None:
    group = multicast_group()
    events: list[PeerEvent] = []
    first = await make_transport("node-0", multicast=group)
    first.on_peer(events.append)
    transports = [first] + [await make_transport(f"node-{i}", multicast=group) for i in range(1, count)]
    took = await all_see_each_other(transports)
    assert {e.node_id for e in events if e.joined} == {f"node-{i}" for i in range(1, count)}
    print(f"multicast: {count} transports saw each other {took * 1000:.0f} ms after the last started")


@pytest.mark.parametrize("count", [2, 3])
async def test_connect_endpoints_find_peers_without_multicast(make_transport: Any, count: int) -> None:
    first = await make_transport("node-0")
    assert first.listen_locators and all(":0" not in loc for loc in first.listen_locators)
    transports = [first] + [await make_transport(f"node-{i}", connect=first.listen_locators) for i in range(1, count)]
    await all_see_each_other(transports)


async def test_bootstrap_peers_become_connect_endpoints(make_transport: Any, version: str) -> None:
    from skulk_kernel.node import NodeOptions

    first = await make_transport("node-0")
    port = first.listen_locators[0].rsplit(":", 1)[1]
    second = ZenohTransport(loopback_config(version))
    await second.start("node-1", {"plane": "control", "options": NodeOptions(bootstrap_peers=(f"127.0.0.1:{port}",))})
    try:
        assert second.connect_endpoints == [f"tls/127.0.0.1:{port}"]  # secure: TLS only
        await all_see_each_other([first, second])
    finally:
        await second.stop()


async def test_a_late_subscriber_on_peer_gets_current_members(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    await all_see_each_other([first, second])
    events: list[PeerEvent] = []
    second.on_peer(events.append)
    assert events == [PeerEvent("node-0", True)]


async def test_a_stopped_peer_leaves(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    events: list[PeerEvent] = []
    first.on_peer(events.append)
    await all_see_each_other([first, second])
    await second.stop()
    await wait_until(lambda: PeerEvent("node-1", False) in events, 5, "node-1 to leave")
    assert first.peers == frozenset()


# ------------------------------------------------------------------ delivery


async def test_broadcast_reaches_every_subscriber_in_order(make_transport: Any) -> None:
    first = await make_transport("node-0")
    others = [await make_transport(f"node-{i}", connect=first.listen_locators) for i in (1, 2)]
    transports = [first, *others]
    await all_see_each_other(transports)
    inboxes = [Inbox() for _ in transports]
    for transport, inbox in zip(transports, inboxes, strict=True):
        transport.subscribe(Topic.GLOBAL_EVENTS, inbox)
    await warm_up(first, Topic.GLOBAL_EVENTS, inboxes)
    sent = [f"event-{i:05d}".encode() + b"." * 100 for i in range(2000)]
    started = time.monotonic()
    for payload in sent:
        await first.publish(Topic.GLOBAL_EVENTS, payload)
    for inbox in inboxes:
        await inbox.wait_for(len(sent), 20)
    took = time.monotonic() - started
    for inbox in inboxes:  # own subscriber included, complete, in order, nothing extra
        assert inbox.payloads() == sent
        assert {sender for sender, _ in inbox.messages} == {"node-0"}
    print(f"2000 ordered control messages to 3 subscribers in {took * 1000:.0f} ms")


async def test_every_node_publishes_and_order_holds_per_publisher(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    await all_see_each_other([first, second])
    inboxes = [Inbox(), Inbox()]
    first.subscribe(Topic.LOCAL_EVENTS, inboxes[0])
    second.subscribe(Topic.LOCAL_EVENTS, inboxes[1])
    await warm_up(first, Topic.LOCAL_EVENTS, inboxes)
    await warm_up(second, Topic.LOCAL_EVENTS, inboxes)

    async def burst(transport: ZenohTransport) -> None:
        for i in range(500):
            await transport.publish(Topic.LOCAL_EVENTS, f"{transport.node_id}:{i}".encode())

    await asyncio.gather(burst(first), burst(second))
    for inbox in inboxes:
        messages = await inbox.wait_for(1000, 20)
        for node in ("node-0", "node-1"):
            got = [p for s, p in messages if s == node]
            assert got == [f"{node}:{i}".encode() for i in range(500)]


async def test_send_reaches_only_the_addressed_node(make_transport: Any) -> None:
    first = await make_transport("node-0")
    others = [await make_transport(f"node-{i}", connect=first.listen_locators) for i in (1, 2)]
    transports = [first, *others]
    await all_see_each_other(transports)
    inboxes = [Inbox() for _ in transports]
    for transport, inbox in zip(transports, inboxes, strict=True):
        transport.subscribe(Topic.CHUNKS, inbox)
    # warm up the addressed subscription of node-1
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not inboxes[1].messages:
        assert time.monotonic() < deadline
        await first.send("node-1", Topic.CHUNKS, b"warm-up")
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    inboxes[1].messages.clear()
    chunks = [f"chunk-{i}".encode() for i in range(300)]
    for chunk in chunks:
        await first.send("node-1", Topic.CHUNKS, chunk)
    await inboxes[1].wait_for(len(chunks), 10)
    await asyncio.sleep(0.2)
    assert inboxes[1].messages == [("node-0", c) for c in chunks]
    assert inboxes[0].messages == [] and inboxes[2].messages == []


async def test_send_to_self_short_circuits(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    await all_see_each_other([first, second])
    mine, theirs = Inbox(), Inbox()
    first.subscribe(Topic.CHUNKS, mine)
    second.subscribe(Topic.CHUNKS, theirs)
    await first.send("node-0", Topic.CHUNKS, b"to-me")
    # delivered before send() returned: no queue, no thread, no network
    assert mine.messages == [("node-0", b"to-me")]
    await asyncio.sleep(0.2)
    assert theirs.messages == []


async def test_own_publish_is_delivered_once_and_synchronously(make_transport: Any) -> None:
    first = await make_transport("node-0")
    inbox = Inbox()
    first.subscribe(Topic.COMMANDS, inbox)
    await first.publish(Topic.COMMANDS, b"mine")
    assert inbox.messages == [("node-0", b"mine")]
    await asyncio.sleep(0.2)
    assert inbox.messages == [("node-0", b"mine")]


async def test_a_failing_subscriber_does_not_stop_delivery(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    await all_see_each_other([first, second])

    def broken(sender: str, payload: bytes) -> None:
        raise RuntimeError("subscriber bug")

    inbox = Inbox()
    second.subscribe(Topic.COMMANDS, broken)
    second.subscribe(Topic.COMMANDS, inbox)
    await warm_up(first, Topic.COMMANDS, [inbox])
    for i in range(5):
        await first.publish(Topic.COMMANDS, b"%d" % i)
    await inbox.wait_for(5, 5)


async def test_subscribe_before_start(make_transport: Any) -> None:
    early = Inbox()
    first = await make_transport("node-0", subscribe={Topic.STATE_SYNC: early})
    second = await make_transport("node-1", connect=first.listen_locators)
    await all_see_each_other([first, second])
    await warm_up(second, Topic.STATE_SYNC, [early])


async def test_publish_before_start_is_an_error() -> None:
    transport = ZenohTransport(loopback_config(unique_version()))
    with pytest.raises(RuntimeError, match="not started"):
        await transport.publish(Topic.COMMANDS, b"x")
    await transport.stop()  # a never-started transport stops quietly


# ------------------------------------------------------------------ request / reply


async def test_request_reply(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)
    third = await make_transport("node-2", connect=first.listen_locators)
    second.serve(Topic.STATE_SYNC, lambda sender, payload: b"sync:" + sender.encode() + b":" + payload)

    async def slow_async(sender: str, payload: bytes) -> bytes:
        await asyncio.sleep(0.01)
        return b"async:" + payload

    third.serve(Topic.STATE_SYNC, slow_async)
    await all_see_each_other([first, second, third])
    await asyncio.sleep(0.1)
    assert await first.request("node-1", Topic.STATE_SYNC, b"q", 5) == b"sync:node-0:q"
    assert await first.request("node-2", Topic.STATE_SYNC, b"q", 5) == b"async:q"
    big = bytes(range(256)) * 4096  # 1 MiB snapshot
    assert await first.request("node-1", Topic.STATE_SYNC, big, 10) == b"sync:node-0:" + big
    everyone = await first.request_all(Topic.STATE_SYNC, b"all", 2)
    assert everyone == {"node-1": b"sync:node-0:all", "node-2": b"async:all"}
    with pytest.raises(NoReply):  # nobody serves this topic there: answered at once
        await first.request("node-1", Topic.ELECTION, b"q", 5)
    with pytest.raises(TimeoutError):
        await first.request("node-9", Topic.STATE_SYNC, b"q", 0.5)


async def test_request_errors_and_timeouts(make_transport: Any) -> None:
    first = await make_transport("node-0")
    second = await make_transport("node-1", connect=first.listen_locators)

    def failing(sender: str, payload: bytes) -> bytes:
        raise ValueError("no snapshot yet")

    def slow(sender: str, payload: bytes) -> bytes:
        time.sleep(1.0)
        return b"late"

    second.serve(Topic.STATE_SYNC, failing)
    second.serve(Topic.ELECTION, slow)
    await all_see_each_other([first, second])
    await asyncio.sleep(0.1)
    with pytest.raises(RequestError, match="no snapshot yet"):
        await first.request("node-1", Topic.STATE_SYNC, b"q", 5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await first.request("node-1", Topic.ELECTION, b"q", 0.3)
    assert time.monotonic() - started < 0.9
    # the transport is still fine afterwards
    second.serve(Topic.STATE_SYNC, lambda s, p: b"ok")
    assert await first.request("node-1", Topic.STATE_SYNC, b"q", 5) == b"ok"


async def test_request_to_self_short_circuits(make_transport: Any) -> None:
    first = await make_transport("node-0")
    first.serve(Topic.STATE_SYNC, lambda sender, payload: sender.encode() + payload)
    assert await first.request("node-0", Topic.STATE_SYNC, b"!", 1) == b"node-0!"


# ------------------------------------------------------------------ malformed frames


async def test_malformed_frames_are_dropped(make_transport: Any, version: str) -> None:
    import zenoh

    # unsecured (secure = false): a bare session can connect at all (tests/test_zenoh_secure.py has
    # the secured transport, which a bare session cannot even reach)
    first = await make_transport("node-0", secure=False)
    inbox = Inbox()
    first.subscribe(Topic.COMMANDS, inbox)
    first.subscribe(Topic.CHUNKS, inbox)
    first.serve(Topic.STATE_SYNC, lambda s, p: b"fine")

    raw = zenoh.Config()  # a bare Zenoh session, not a skulk transport
    raw.insert_json5("mode", '"peer"')
    raw.insert_json5("listen/endpoints", "[]")
    raw.insert_json5("connect/endpoints", json.dumps(first.listen_locators))
    raw.insert_json5("scouting/multicast/enabled", "false")
    session = await asyncio.to_thread(zenoh.open, raw)
    try:
        await wait_until(lambda: bool(session.info.peers_zid()), 10, "the raw session to connect")
        await asyncio.sleep(0.2)
        garbage = [
            b"",
            b"\x00\xff garbage",
            MAGIC,
            MAGIC + b"\x10short",
            MAGIC + b"\x00" + b"payload",
            MAGIC + b"\x02\xff\xfe" + b"bad utf-8",
            bytes(range(256)) * 100,
        ]
        keys = [f"skulk/{version}/control/commands", f"skulk/{version}/data/chunks/node-0"]
        for key in keys:
            for frame in garbage:
                session.put(key, frame, congestion_control=zenoh.CongestionControl.BLOCK)
        # a request with a garbage frame gets an error reply, not a crash
        replies = list(session.get(f"skulk/{version}/rpc/state_sync/node-0", payload=b"junk", timeout=2))
        assert replies and replies[0].err is not None
        # a well-formed frame from the raw session after all that still arrives
        session.put(keys[0], MAGIC + b"\x03raw" + b"valid", congestion_control=zenoh.CongestionControl.BLOCK)
        await inbox.wait_for(1, 5)
        await asyncio.sleep(0.1)
        assert inbox.messages == [("raw", b"valid")]
        assert first.malformed_frames >= len(garbage) * len(keys)
        # and the transport works as before
        await first.publish(Topic.COMMANDS, b"own")
        assert inbox.messages[-1] == ("node-0", b"own")
    finally:
        session.close()


# ------------------------------------------------------------------ version gating in one process


@pytest.mark.parametrize("discovery", ["endpoints", "multicast"])
async def test_session_auth_refuses_another_version_and_reports_it(make_transport: Any, discovery: str) -> None:
    if discovery == "multicast":
        group = multicast_group()
        first = await make_transport("node-0", multicast=group, session_auth=True)
        other = await make_transport("node-x", version=unique_version(), multicast=group, session_auth=True)
    else:
        first = await make_transport("node-0", session_auth=True)
        other = await make_transport(
            "node-x", version=unique_version(), connect=first.listen_locators, session_auth=True
        )
    await wait_until(
        lambda: "node-x" in first.mismatched_peers and "node-0" in other.mismatched_peers,
        10,
        "both sides to report the mismatch",
    )
    assert first.mismatched_peers["node-x"].network_version == other.network_version
    assert first.mismatched_peers["node-x"].address == ", ".join(other.listen_locators)
    assert first.peers == frozenset() and other.peers == frozenset()
    assert first._connected_zids() == set()  # refused at the session level


async def test_another_version_is_seen_but_never_a_member(make_transport: Any) -> None:
    first = await make_transport("node-0")  # the default: no session auth, versioned key space
    other = await make_transport("node-x", version=unique_version(), connect=first.listen_locators)
    inbox = Inbox()
    first.subscribe(Topic.COMMANDS, inbox)
    await wait_until(lambda: first.mismatched_peers.get("node-x") is not None, 10, "the liveliness mismatch")
    assert first._connected_zids()  # the sessions are connected, the key spaces are not
    for _ in range(20):
        await other.publish(Topic.COMMANDS, b"from another version")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert inbox.messages == [] and first.peers == frozenset() and other.peers == frozenset()
    assert "node-0" in other.mismatched_peers


async def test_session_auth_members_exchange_messages(make_transport: Any) -> None:
    first = await make_transport("node-0", session_auth=True)
    second = await make_transport("node-1", session_auth=True, connect=first.listen_locators)
    await all_see_each_other([first, second])
    inbox = Inbox()
    second.subscribe(Topic.COMMANDS, inbox)
    await warm_up(first, Topic.COMMANDS, [inbox])


async def test_a_failed_start_leaves_nothing_behind(make_transport: Any, version: str) -> None:
    first = await make_transport("node-0")
    taken = first.listen_locators[0]  # a port already in use: Zenoh cannot listen there
    transport = ZenohTransport(loopback_config(version, listen=[taken]))
    with pytest.raises(Exception):  # noqa: B017 - Zenoh raises its own ZError
        await transport.start("node-1", {"plane": "control"})
    assert transport._session is None
    with pytest.raises(RuntimeError, match="not started"):
        await transport.publish(Topic.COMMANDS, b"x")
