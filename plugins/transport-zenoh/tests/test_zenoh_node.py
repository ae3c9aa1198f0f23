"""Two real Nodes in one process with every plane on transport-zenoh (the kernel's own wiring)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from skulk_kernel.api import Planes, Profile, Topic
from skulk_testing.nodes import in_process_node
from zenoh_helpers import unique_version, wait_until


def zenoh_profile(version: str, connect: list[str] | None = None) -> Profile:
    return Profile(
        name="zenoh-test",
        plugins=("transport-zenoh", "master"),  # the master role relays readings (each node leads itself here)
        planes=Planes(control="zenoh"),
        plugin_config={
            "transport-zenoh": {
                "listen": ["tcp/127.0.0.1:0"],
                "connect": connect or [],
                "multicast_scouting": False,
                "network_version": version,
            }
        },
    )


async def test_two_nodes_over_zenoh(tmp_path: Path) -> None:
    version = unique_version()
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(in_process_node(zenoh_profile(version), home=tmp_path / "a"))
        transport = first.transports["control"]
        assert transport.name == "zenoh"
        assert first.transports["data"] is transport and first.transports["telemetry"] is transport
        assert first.facts["network_version"] == version
        second = await stack.enter_async_context(
            in_process_node(zenoh_profile(version, transport.listen_locators), home=tmp_path / "b")
        )
        await wait_until(lambda: second.node_id in transport.peers, 15, "the second node to join")

        got: list[tuple[str, bytes]] = []
        second.subscribe(Topic.COMMANDS, lambda sender, payload: got.append((sender, payload)))
        deadline = asyncio.get_running_loop().time() + 10
        while not got:  # the node's own bridge (call_soon_threadsafe -> queue -> pump) delivers it
            assert asyncio.get_running_loop().time() < deadline, "no message crossed the nodes"
            # the transport's broadcast (the node addresses commands to its master alone)
            await transport.publish(Topic.COMMANDS, b"hello from the first node")
            await asyncio.sleep(0.05)
        assert got[0] == (first.node_id, b"hello from the first node")
        # telemetry readings of each node reach the other over the telemetry plane
        await wait_until(lambda: first.node_id in second.readings.nodes(), 10, "the first node's readings")
