"""The master acts on a command only when its claimed origin is the node that sent it.

The transport authenticates the sender (signed frames on Zenoh); `ForwardedCommand.origin` is only
what the sender wrote, so a member must not be able to speak for another node.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from skulk_kernel.api import AddCustomModelCard, CommandId, ForwardedCommand, ModelCard, ModelId, NodeId, codec
from skulk_master import MASTER
from skulk_testing.nodes import in_process_node

pytestmark = pytest.mark.timeout(60)


def _card_command(name: str, origin: str) -> bytes:
    card = ModelCard(model_id=ModelId(name), n_layers=1, hidden_size=8)
    command = AddCustomModelCard(command_id=CommandId(f"c-{name}"), card=card)
    return codec.encode(ForwardedCommand(origin=NodeId(origin), command=command))


async def test_a_command_claiming_another_origin_is_dropped(tmp_path: Path) -> None:
    async with in_process_node(["election-bully", "master"], home=tmp_path / "n") as node:
        deadline = time.monotonic() + 10
        while not node.is_master:
            assert time.monotonic() < deadline, "the lone node never became master"
            await asyncio.sleep(0.05)
        master = node.services.require(MASTER)
        await master._on_command(node.node_id, _card_command("forged", origin="someone-else"))
        await master._on_command(node.node_id, _card_command("honest", origin=node.node_id))
        cards = master.state.custom_model_cards
        assert ModelId("honest") in cards
        assert ModelId("forged") not in cards
