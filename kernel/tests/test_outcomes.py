"""The sending half of command outcomes (`Submitter`), against a host whose master and State the test moves.

The real round trip (a master answering over Zenoh, a kill during it) is tests/cluster/test_command_outcomes.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from skulk_kernel.api import CommandId, ForwardedCommand, NodeId, Outcome, SetTracingEnabled, codec
from skulk_kernel.outcomes import Submitter

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakeState:
    last_event_applied_idx: int = 0


@dataclass
class Host:
    node_id: str = "me"
    master_id: str | None = None
    state: Any = field(default_factory=FakeState)
    sent: list[str] = field(default_factory=list)  # command ids, in the order published

    async def publish(self, topic: Any, payload: bytes) -> None:
        self.sent.append(codec.decode(payload, ForwardedCommand).command.command_id)

    async def wait_for(self, predicate: Callable[[Any], bool], timeout: float) -> Any:
        async with asyncio.timeout(timeout):
            while not predicate(self.state):
                await asyncio.sleep(0.01)
        return self.state

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        return asyncio.ensure_future(coro)


def tracing(cid: str) -> SetTracingEnabled:
    return SetTracingEnabled(command_id=CommandId(cid), enabled=True)


def answer(submitter: Submitter, sender: str, cid: str, idx: int = 1, status: str = "indexed") -> None:
    outcome = Outcome(command_id=CommandId(cid), status=status, event_idx=idx, master_id=NodeId(sender))  # type: ignore[arg-type]
    submitter.on_outcome(sender, codec.encode(outcome))


async def test_without_a_master_the_command_is_held_then_sent_once_one_is_elected() -> None:
    host = Host()
    sub = Submitter(host)
    outcome = await sub.submit(tracing("c1"), timeout=0.3)
    assert outcome.status == "no_master" and "holds the command" in outcome.reason and host.sent == []
    assert sub.held == 1
    host.master_id = "m"
    sub.master_changed("m")
    await asyncio.sleep(0.05)
    assert host.sent == ["c1"]  # delivered by the kernel once a master is known, with its own id
    answer(sub, "m", "c1")
    await asyncio.sleep(0.05)
    assert sub.held == 0


async def test_a_silent_master_gets_the_same_command_again_until_it_answers() -> None:
    host = Host(master_id="m")
    sub = Submitter(host)
    pending = asyncio.ensure_future(sub.submit(tracing("c2"), timeout=5))
    await asyncio.sleep(0.9)  # resent after 0.25 s, then 0.5 s
    assert host.sent.count("c2") >= 3 and set(host.sent) == {"c2"}
    answer(sub, "stranger", "c2")  # only the master (or this node) answers
    await asyncio.sleep(0.05)
    assert not pending.done()
    host.state.last_event_applied_idx = 1
    answer(sub, "m", "c2", idx=1)
    outcome = await pending
    assert outcome.ok and outcome.event_idx == 1


async def test_an_indexed_outcome_returns_once_this_node_has_applied_it() -> None:
    host = Host(master_id="m")
    sub = Submitter(host)
    pending = asyncio.ensure_future(sub.submit(tracing("c3"), timeout=5))
    await asyncio.sleep(0.05)
    answer(sub, "m", "c3", idx=4)
    await asyncio.sleep(0.1)
    assert not pending.done()  # the master indexed event 4, this node's State is still at 0
    host.state.last_event_applied_idx = 4
    assert (await pending).event_idx == 4


async def test_a_refusal_is_returned_as_the_master_said_it() -> None:
    host = Host(master_id="m")
    sub = Submitter(host)
    pending = asyncio.ensure_future(sub.submit(tracing("c4"), timeout=5))
    await asyncio.sleep(0.05)
    refused = Outcome(command_id=CommandId("c4"), status="refused", reason="no node has room", kind="memory")
    sub.on_outcome("m", codec.encode(refused))
    assert await pending == refused


async def test_a_master_change_sends_again_at_once_to_the_new_master() -> None:
    host = Host(master_id="old")
    sub = Submitter(host)
    pending = asyncio.ensure_future(sub.submit(tracing("c5"), timeout=5))
    await asyncio.sleep(0.05)
    host.master_id = None  # the master died; the election runs
    sub.master_changed(None)
    await asyncio.sleep(0.6)
    sent_while_leaderless = len(host.sent)
    await asyncio.sleep(0.5)
    assert len(host.sent) == sent_while_leaderless  # nobody to send to: held, not spammed
    host.master_id = "new"
    sub.master_changed("new")
    await asyncio.sleep(0.05)
    assert len(host.sent) == sent_while_leaderless + 1
    answer(sub, "new", "c5", idx=0)
    assert (await pending).ok
