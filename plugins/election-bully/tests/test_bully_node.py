"""The election inside real nodes: the conformance suites, an in-process Node, a node process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from skulk_election_bully import ELECTION
from skulk_election_bully.election import BullyElection
from skulk_testing.conformance import ElectionConformance, PluginConformance
from skulk_testing.nodes import in_process_node

pytestmark = pytest.mark.timeout(120)


class TestBullyPlugin(PluginConformance):
    plugin_name = "election-bully"


class TestBullyElectionContract(ElectionConformance):
    election_timeout_s = 3.0

    @pytest.fixture
    def election(self) -> Any:
        return BullyElection()


async def test_an_in_process_node_on_the_local_transport_elects_itself(tmp_path: Path) -> None:
    async with in_process_node(["election-bully", "master"], home=tmp_path / "n") as node:
        started = time.monotonic()  # the node has started, so has its election
        election = next(iter(node.elections.values()))
        assert isinstance(election, BullyElection)
        assert node.services.get(ELECTION) is election
        deadline = time.monotonic() + 3.0
        while not node.is_master:
            assert time.monotonic() < deadline, f"no self-election: {election.diagnostics()}"
            await _sleep()
        took = time.monotonic() - started
        assert took < 2.5, took
        assert node.master_id == node.node_id


async def test_profile_config_reaches_the_election(tmp_path: Path) -> None:
    from skulk_kernel.api import parse_profile

    profile = parse_profile(
        '[profile]\nname = "t"\nplugins = ["election-bully"]\n'
        "[plugins.election-bully]\ncampaign_timeout_s = 0.2\nheartbeat_s = 0.05\nmaster_timeout_s = 0.5\n",
        "test",
    )
    async with in_process_node(profile, home=tmp_path / "n") as node:
        election = next(iter(node.elections.values()))
        assert election.config.campaign_timeout_s == 0.2
        deadline = time.monotonic() + 2.0
        while not node.is_master:
            assert time.monotonic() < deadline
            await _sleep()


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.02)


PROFILE = """
[profile]
name = "election-test"
plugins = ["election-bully", "master", "worker", "engine-echo", "store", "api-control"]

[planes]
control = "local"
"""


@pytest.mark.slow
def test_a_node_process_reports_itself_as_master(node_factory: Any, tmp_path: Path) -> None:
    profile = tmp_path / "election.toml"
    profile.write_text(PROFILE)
    node = node_factory(str(profile)).wait_api(timeout=60)
    started = time.monotonic()

    def elected() -> bool:
        runtime = node.get("/v1/diagnostics/node", timeout=2).json()["runtime"]
        return runtime["isMaster"] is True and runtime["masterNodeId"] == runtime["nodeId"]

    node.wait_until(elected, 5.0, "the node to elect itself")
    assert time.monotonic() - started < 5.0
    assert "election round" in node.log()


async def test_real_nodes_on_a_shared_bus_elect_one_master_and_fail_over(tmp_path: Path) -> None:
    """Three real Nodes (election + master plugins) in one process over a shared in-memory transport."""
    import asyncio
    import importlib

    from bully_fakes import BusTransport, SharedBus
    from skulk_kernel import hookimpl
    from skulk_kernel.api import build_plugin_manager, parse_profile, register_plugin
    from skulk_kernel.node import Node, NodeOptions

    profile = parse_profile(
        '[profile]\nname = "bus"\nplugins = ["election-bully", "master"]\n[planes]\ncontrol = "testbus"\n'
        "[plugins.election-bully]\ncampaign_timeout_s = 0.3\nheartbeat_s = 0.1\nmaster_timeout_s = 0.6\n",
        "test",
    )
    bus = SharedBus()

    class BusPlugin:
        @hookimpl
        def register_transports(self, register: Any) -> None:
            register(BusTransport(bus))

    nodes: list[Node] = []
    for i in range(3):
        pm = build_plugin_manager(profile)
        register_plugin(pm, BusPlugin(), "testbus")
        nodes.append(Node(profile, NodeOptions(home=tmp_path / f"n{i}", no_api=True, node_name=f"n{i}"), pm=pm))

    def agreed(group: list[Node]) -> str | None:
        masters = {n.master_id for n in group}
        leaders = [n.node_id for n in group if n.is_master]
        return leaders[0] if len(masters) == 1 and len(leaders) == 1 and leaders[0] in masters else None

    async def wait_until(check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def wait_agreed(group: list[Node], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (master := agreed(group)) is None:
            assert time.monotonic() < deadline, [(n.node_id, n.master_id) for n in group]
            await asyncio.sleep(0.02)
        return master

    try:
        for node in nodes:
            await node.start()
        first = await wait_agreed(nodes, 5.0)
        sessions = getattr(importlib.import_module("skulk_master.plugin"), "_masters", None)
        if sessions is not None:  # the master plugin runs its session on the elected node only
            await wait_until(lambda: [n for n, m in sessions.items() if m.active] == [first], 3.0)
        old = next(n for n in nodes if n.node_id == first)
        await old.stop()
        nodes.remove(old)
        second = await wait_agreed(nodes, 5.0)
        assert second != first
        # The new master seeded its session from its replicated State: it has applied the old log.
        new = next(n for n in nodes if n.node_id == second)
        assert new.state.last_event_applied_idx >= 0
        if sessions is not None:
            await wait_until(lambda: [n for n, m in sessions.items() if m.active] == [second], 3.0)
    finally:
        for node in nodes:
            await node.stop()
