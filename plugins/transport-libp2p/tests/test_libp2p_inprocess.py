"""Two or three transports in this process, talking over loopback: delivery, order, send, requests,
membership, version gating and containment."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from libp2p_helpers import unique_version, wait_until
from skulk_kernel.api import PeerEvent, Topic
from skulk_testing.conformance import Inbox


def bootstrap_of(transport: Any) -> list[str]:
    return [a for a in transport.listen if "/tcp/" in a][:1]


async def pair(make_transport: Any) -> tuple[Any, Any]:
    a = await make_transport("a")
    b = await make_transport("b", bootstrap=bootstrap_of(a))
    await wait_until(lambda: "b" in a.peers and "a" in b.peers, 15, "a and b to see each other")
    return a, b


async def test_broadcast_reaches_the_other_node_with_its_sender(make_transport: Any) -> None:
    a, b = await pair(make_transport)
    inbox = Inbox()
    b.subscribe(Topic.COMMANDS, inbox)
    await asyncio.sleep(1.5)  # the mesh forms within a gossipsub heartbeat
    await a.publish(Topic.COMMANDS, b"hello")
    assert await inbox.wait_for(1, 10) == [("a", b"hello")]


async def test_a_burst_of_2000_arrives_complete_and_in_order(make_transport: Any) -> None:
    a, b = await pair(make_transport)
    inbox = Inbox()
    b.subscribe(Topic.GLOBAL_EVENTS, inbox)
    await asyncio.sleep(1.5)
    sent = [b"event-%d" % i for i in range(2000)]
    started = time.monotonic()
    for payload in sent:
        await a.publish(Topic.GLOBAL_EVENTS, payload)
    await inbox.wait_for(len(sent), 60)
    took = time.monotonic() - started
    print(f"2000 control messages in {took:.2f}s ({len(sent) / took:.0f}/s)")
    assert inbox.payloads() == sent
    assert b.describe()["skipped_messages"] == 0


async def test_send_is_node_addressed_and_request_gets_the_reply(make_transport: Any) -> None:
    a, b = await pair(make_transport)
    c = await make_transport("c", bootstrap=bootstrap_of(a))
    await wait_until(lambda: {"b", "c"} <= a.peers, 15, "c to join")
    at_b, at_c = Inbox(), Inbox()
    b.subscribe(Topic.CHUNKS, at_b)
    c.subscribe(Topic.CHUNKS, at_c)
    for i in range(50):
        await a.send("b", Topic.CHUNKS, b"chunk-%d" % i)
    await at_b.wait_for(50, 10)
    assert at_b.messages == [("a", b"chunk-%d" % i) for i in range(50)]
    assert at_c.messages == []
    big = bytes(range(256)) * 8192  # 2 MiB: far above a gossipsub message, fine on a stream
    b.serve(Topic.STATE_SYNC, lambda sender, payload: sender.encode() + b":" + big)
    reply = await a.request("b", Topic.STATE_SYNC, b"q", timeout=10)
    assert reply == b"a:" + big


async def test_stopped_peer_leaves_and_another_version_is_refused(make_transport: Any) -> None:
    a, b = await pair(make_transport)
    events: list[PeerEvent] = []
    a.on_peer(events.append)
    assert PeerEvent("b", True) in events  # current members are replayed
    stranger = await make_transport("stranger", version=unique_version(), bootstrap=bootstrap_of(a))
    await wait_until(
        lambda: "stranger" in a.mismatched_peers and a.node_id in stranger.mismatched_peers,
        15,
        "both sides to report the version mismatch",
    )
    assert "stranger" not in a.peers and stranger.peers == frozenset()
    await b.stop()
    await wait_until(lambda: PeerEvent("b", False) in events, 5, "b to leave")


async def test_a_crash_inside_the_library_restarts_the_transport_not_the_node(make_transport: Any) -> None:
    a, b = await pair(make_transport)
    peer_id = a.peer_id
    a.inject_fault("simulated library bug")
    await wait_until(lambda: a.restarts == 1, 10, "the restart")
    await wait_until(lambda: "b" in a.peers and "a" in b.peers, 20, "the peers to reconnect")
    assert a.peer_id == peer_id  # same key pair: peers redial the same identity
    inbox = Inbox()
    b.subscribe(Topic.COMMANDS, inbox)
    await asyncio.sleep(1.5)
    await a.publish(Topic.COMMANDS, b"after the restart")
    await inbox.wait_for(1, 10)
