"""The bully election on an in-memory multi-node bus (see bully_fakes.py). Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
import time

import msgpack
import pytest
from bully_fakes import FAST, FakeNode, agreed_master, cluster, start_nodes, wait_agreed, wait_until
from pydantic import ValidationError
from skulk_election_bully.election import FORCE_MASTER_SENIORITY, BullyElection, ElectionMessage
from skulk_election_bully.plugin import BullyConfig
from skulk_kernel.api import codec

pytestmark = pytest.mark.timeout(60)

# With FAST timings a round takes 0.3 s and a silent master is dropped after 0.6 s.
ROUND = FAST.campaign_timeout_s
FAILOVER = FAST.master_timeout_s + FAST.campaign_timeout_s


async def test_single_node_elects_itself_with_default_timings() -> None:
    async with cluster() as bus:
        started = time.monotonic()
        (node,) = await start_nodes(bus, {"node_id": "solo", "config": BullyConfig()})
        await wait_until(lambda: node.master_id == "solo", 3.0, "self-election", [node])
        took = time.monotonic() - started
        assert took < 2.0, f"a lone node took {took:.2f}s to elect itself"
        assert node.changes == ["solo"]
        assert node.election.is_master


async def test_three_nodes_agree_on_one_master_without_flapping() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b", "node-c")
        master = await wait_agreed(nodes, 3.0)
        assert master == "node-c"  # equal seniority and log: the node id breaks the tie
        await asyncio.sleep(5 * FAST.heartbeat_s)  # heartbeats keep it, nobody re-elects
        assert agreed_master(nodes) == master
        assert all(n.changes == [master] for n in nodes), nodes


async def test_most_applied_events_beats_an_earlier_started_node() -> None:
    async with cluster() as bus:
        # node-z starts first and would win the id tie-break, but has applied less of the log.
        early = await start_nodes(bus, {"node_id": "node-z", "applied": 5})
        await asyncio.sleep(ROUND / 3)
        late = await start_nodes(bus, {"node_id": "node-a", "applied": 50})
        nodes = early + late
        assert await wait_agreed(nodes, 3.0) == "node-a"
        assert all(n.changes == ["node-a"] for n in nodes), nodes


async def test_failover_picks_the_node_that_applied_most_of_the_log() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(
            bus,
            {"node_id": "node-m", "applied": 100},
            {"node_id": "node-z", "applied": 10},
            {"node_id": "node-a", "applied": 90},
        )
        assert await wait_agreed(nodes, 3.0) == "node-m"
        await nodes[0].crash()
        rest = nodes[1:]
        assert await wait_agreed(rest, FAILOVER + 3.0) == "node-a"


async def test_force_master_wins() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(
            bus,
            {"node_id": "node-a", "force_master": True},
            {"node_id": "node-b", "applied": 500},
            {"node_id": "node-z", "applied": 500},
        )
        assert await wait_agreed(nodes, 3.0) == "node-a"
        assert all(n.changes == ["node-a"] for n in nodes), nodes
        assert nodes[0].election.diagnostics()["seniority"] >= FORCE_MASTER_SENIORITY


async def test_a_force_master_joining_later_takes_over() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-b", "node-c")
        assert await wait_agreed(nodes, 3.0) == "node-c"
        nodes += await start_nodes(bus, {"node_id": "node-a", "force_master": True})
        await wait_until(lambda: agreed_master(nodes) == "node-a", 3.0, "the forced master", nodes)


@pytest.mark.parametrize("how", ["stop", "crash"])
async def test_losing_the_master_elects_a_new_one_everyone_reports(how: str) -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b", "node-c", "node-d")
        old = await wait_agreed(nodes, 3.0)
        assert old == "node-d"
        gone = next(n for n in nodes if n.node_id == old)
        rest = [n for n in nodes if n is not gone]
        started = time.monotonic()
        await (gone.stop() if how == "stop" else gone.crash())
        new = await wait_agreed(rest, FAILOVER + 3.0)
        took = time.monotonic() - started
        assert new == "node-c"
        # A goodbye needs one round; silence needs the master timeout first.
        assert took < (ROUND if how == "stop" else FAILOVER) + 1.5, took
        for n in rest:
            assert n.changes[0] == old and n.changes[-1] == new, n
            assert n.changes.count(new) == 1, n  # adopted once, no back-and-forth


async def test_a_joining_node_does_not_depose_a_healthy_master() -> None:
    async with cluster() as bus:
        # The incumbent has the smallest id and has applied less than the newcomers, and still stays.
        nodes = await start_nodes(bus, {"node_id": "node-b", "applied": 7}, {"node_id": "node-a", "applied": 5})
        master = await wait_agreed(nodes, 3.0)
        assert master == "node-b"
        clock = nodes[0].election.clock
        for i, name in enumerate(["node-x", "node-y", "node-z"]):
            nodes += await start_nodes(bus, {"node_id": name, "applied": 7 + i})
            await wait_agreed(nodes, 3.0)
        await asyncio.sleep(3 * ROUND)  # let every membership round finish
        assert agreed_master(nodes) == master
        # [scale]: a join under a healthy master runs no cluster-wide round; only the master answers
        # the newcomer's campaign (a round on every node per join was N x N messages per join)
        assert nodes[0].election.clock == clock, "a join under a healthy master does not bump the clock"
        assert all(n.election.stats.rounds <= 1 for n in nodes[:2]), [n.election.stats.rounds for n in nodes]
        # Nobody ever reported anything but the one master: no needless change anywhere.
        assert all(n.changes == [master] for n in nodes), nodes
        assert sum(n.election.stats.master_changes for n in nodes) == len(nodes)


async def test_followers_coming_and_going_never_move_the_master() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b", "node-c", "node-d")
        master = await wait_agreed(nodes, 3.0)
        followers = [n for n in nodes if n.node_id != master]
        await followers[0].stop()
        await followers[1].crash()
        nodes = [n for n in nodes if n not in followers[:2]]
        nodes += await start_nodes(bus, "node-e", "node-f")
        await asyncio.sleep(FAILOVER + 2 * ROUND)
        assert agreed_master(nodes) == master
        assert all(n.changes == [master] for n in nodes), nodes


async def test_a_frozen_master_is_replaced_and_the_cluster_converges_when_it_returns() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b", "node-c")
        old = await wait_agreed(nodes, 3.0)
        frozen = next(n for n in nodes if n.node_id == old)
        rest = [n for n in nodes if n is not frozen]
        bus.muted.add(old)  # nothing it says reaches anyone; it still hears the others
        new = await wait_agreed(rest, FAILOVER + 3.0)
        assert new != old
        # It hears the new master (backed by everyone else) and stands down even before it thaws.
        await wait_until(lambda: not frozen.election.is_master, 3.0, "the frozen master to stand down", nodes)
        bus.heal()
        assert await wait_agreed(nodes, 3.0) == new
        await asyncio.sleep(5 * FAST.heartbeat_s)
        assert agreed_master(nodes) == new
        assert frozen.changes == [old, new], frozen


async def test_split_brain_heals_to_one_master() -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b", "node-c", "node-d", "node-e")
        assert await wait_agreed(nodes, 3.0) == "node-e"
        minority, majority = nodes[3:], nodes[:3]  # node-d, node-e | node-a, node-b, node-c
        bus.partition([n.node_id for n in minority], [n.node_id for n in majority])
        # Each side runs its own cluster: two masters, neither hearing the other.
        await wait_agreed(majority, FAILOVER + 3.0)
        assert agreed_master(minority) == "node-e"
        assert agreed_master(majority) == "node-c"
        started = time.monotonic()
        bus.heal()
        # They hear each other; the master backed by more nodes keeps the cluster within a round.
        assert await wait_agreed(nodes, 3.0) == "node-c"
        assert time.monotonic() - started < ROUND + 1.0
        await asyncio.sleep(5 * FAST.heartbeat_s)
        assert agreed_master(nodes) == "node-c"
        assert sum(n.election.stats.conflicts for n in nodes) >= 1


async def test_malformed_election_messages_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b")
        master = await wait_agreed(nodes, 3.0)
        good = {
            "kind": "announce",
            "nodeId": "node-evil",
            "clock": 99,
            "seniority": 10**9,
            "commandsSeen": 10**9,
            "masterId": "node-evil",
        }
        bad: list[bytes] = [
            b"\xc1garbage",  # not msgpack
            msgpack.packb([1, 2, 3]),  # not a map
            msgpack.packb({**good, "extra": 1}),  # unknown field
            msgpack.packb({**good, "kind": "coup"}),  # unknown kind
            msgpack.packb({**good, "clock": -1}),  # out of range
            msgpack.packb({**good, "clock": "99"}),  # wrong type (strict)
            msgpack.packb({**good, "seniority": True}),  # a bool is not a number here
            msgpack.packb({k: v for k, v in good.items() if k != "clock"}),  # missing field
            msgpack.packb({**good, "nodeId": master, "masterId": master}),  # speaks for another node
            b"",
        ]
        caplog.set_level(logging.WARNING, logger="skulk.election")
        for payload in bad:
            bus.inject("node-evil", payload)
        await wait_until(
            lambda: all(n.election.stats.dropped == len(bad) for n in nodes), 2.0, "every bad message dropped", nodes
        )
        await asyncio.sleep(3 * FAST.heartbeat_s)
        assert agreed_master(nodes) == master
        assert all(n.changes == [master] for n in nodes), nodes
        assert "malformed election message" in caplog.text
        # Rate-limited: one warning per sender per interval, not one per message.
        assert caplog.text.count("malformed election message") == len(nodes)


async def test_a_well_formed_announce_from_a_stronger_node_is_obeyed() -> None:
    """The protocol itself (not the validation) decides: a valid higher-ranked master is followed."""
    async with cluster() as bus:
        nodes = await start_nodes(bus, "node-a", "node-b")
        await wait_agreed(nodes, 3.0)
        strong = ElectionMessage(
            kind="announce",
            node_id="node-q",
            clock=1,
            seniority=FORCE_MASTER_SENIORITY,
            commands_seen=0,
            master_id="node-q",
        )
        bus.inject("node-q", codec.encode(strong))
        await wait_until(lambda: all(n.master_id == "node-q" for n in nodes), 2.0, "node-q followed", nodes)
        # node-q never speaks again: it times out and the cluster re-elects among its members.
        await wait_agreed(nodes, FAILOVER + 3.0)


def test_message_round_trips_and_rejects_bad_values() -> None:
    msg = ElectionMessage(kind="campaign", node_id="n1", clock=3, seniority=2, commands_seen=-1, master_id=None)
    wire = msgpack.unpackb(codec.encode(msg))
    assert wire == {
        "kind": "campaign",
        "nodeId": "n1",
        "clock": 3,
        "seniority": 2,
        "commandsSeen": -1,
        "masterId": None,
    }
    assert codec.decode(codec.encode(msg), ElectionMessage) == msg
    with pytest.raises(ValidationError):
        ElectionMessage(kind="campaign", node_id="", clock=0, seniority=0, commands_seen=0)


def test_config_rejects_a_master_timeout_shorter_than_two_heartbeats() -> None:
    assert BullyConfig().campaign_timeout_s == 1.0
    with pytest.raises(ValidationError):
        BullyConfig(heartbeat_s=1.0, master_timeout_s=1.5)
    with pytest.raises(ValidationError):
        BullyConfig(unknown=1)


async def test_stop_is_idempotent_and_restart_works() -> None:
    async with cluster() as bus:
        node = FakeNode(bus, "node-a")
        await node.start()
        await wait_until(lambda: node.master_id == "node-a", 2.0, "self-election", [node])
        await node.election.stop()
        await node.election.stop()
        assert node.election.diagnostics()["master"] == "node-a"  # what it last knew
        await node.election.start(node, node.set_master)
        await wait_until(lambda: node.changes == ["node-a", "node-a"], 2.0, "re-election", [node])
        await node.election.stop()
        assert BullyElection(FAST).diagnostics()["master"] is None


@pytest.mark.parametrize("seed", [3, 17, 42])
async def test_random_churn_heals_to_one_stable_master(seed: int) -> None:
    """Joins, clean stops, crashes, muted nodes, partitions and log growth at random; then heal."""
    import random

    rng = random.Random(seed)
    async with cluster() as bus:
        nodes: list[FakeNode] = []

        async def add() -> None:
            node = FakeNode(
                bus,
                f"n{len(nodes):02d}-{rng.randint(0, 99)}",
                applied=rng.randint(-1, 20),
                force_master=rng.random() < 0.05,
            )
            nodes.append(await node.start())

        for _ in range(rng.randint(2, 5)):
            await add()
        for _ in range(8):
            live = [n for n in nodes if n.alive]
            op = rng.choice(["add", "stop", "crash", "mute", "partition", "heal", "grow"])
            if op == "add" or len(live) < 2:
                await add()
            elif op == "stop":
                await rng.choice(live).stop()
            elif op == "crash":
                await rng.choice(live).crash()
            elif op == "mute":
                bus.muted.add(rng.choice(live).node_id)
            elif op == "partition":
                ids = [n.node_id for n in live]
                rng.shuffle(ids)
                cut = rng.randint(1, len(ids) - 1)
                bus.partition(ids[:cut], ids[cut:])
            elif op == "heal":
                bus.heal()
            else:
                rng.choice(live).state.last_event_applied_idx += rng.randint(1, 5)
            await asyncio.sleep(rng.uniform(0, 2 * ROUND))
        bus.heal()
        # A master that was cut off until just now may still be timed out by its followers (rightly:
        # they did not hear it for master_timeout_s); after that window the cluster must settle.
        await asyncio.sleep(FAST.master_timeout_s)
        live = [n for n in nodes if n.alive]
        master = await wait_agreed(live, FAILOVER + 2.0)
        reported = [len(n.changes) for n in live]
        await asyncio.sleep(FAILOVER + ROUND)
        assert agreed_master(live) == master
        assert [len(n.changes) for n in live] == reported, "the healed cluster must not keep changing"
