"""The master answers every command with an outcome, and a command sent again gets the same answer.

Senders re-send a command under its id until they hear back (skulk_kernel.outcomes); the master must
answer the repeat from memory, not decide it again: `SetTracingEnabled` records a fact every time it
is decided, so deciding a repeat would index a second event.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from skulk_kernel.api import (
    CommandId,
    ForwardedCommand,
    ModelId,
    NodeId,
    Outcome,
    PlaceInstance,
    SetTracingEnabled,
    Topic,
    codec,
)
from skulk_master import MASTER
from skulk_testing.nodes import in_process_node

pytestmark = pytest.mark.timeout(60)


async def test_a_repeated_command_is_answered_from_memory_and_a_refusal_says_why(tmp_path: Path) -> None:
    async with in_process_node(["election-bully", "master"], home=tmp_path / "n") as node:
        deadline = time.monotonic() + 10
        while not node.is_master:
            assert time.monotonic() < deadline, "the lone node never became master"
            await asyncio.sleep(0.05)
        heard: list[Outcome] = []
        node.subscribe(Topic.OUTCOMES, lambda _sender, payload: heard.append(codec.decode(payload, Outcome)))
        master = node.services.require(MASTER)
        command = SetTracingEnabled(command_id=CommandId("t-1"), enabled=True)
        payload = codec.encode(ForwardedCommand(origin=NodeId(node.node_id), command=command))
        before = master.state.last_event_applied_idx
        await master._on_command(node.node_id, payload)
        await master._on_command(node.node_id, payload)  # the sender did not hear the first answer
        assert master.state.last_event_applied_idx == before + 1  # one event, not two
        await asyncio.sleep(0.1)
        first, second = heard[:2]
        assert first == second and first.ok and first.event_idx == before + 1 and first.events == 1

        outcome = await node.submit(PlaceInstance(command_id=CommandId("p-1"), model_id=ModelId("nobody/none")))
        assert outcome.status == "refused" and outcome.kind == "unknown_model"
        assert "not in the catalog" in outcome.reason and outcome.master_id == node.node_id
