"""The kernel's in-process transport passes the transport conformance suite."""

from __future__ import annotations

import pytest
from skulk_testing.conformance import Inbox, TransportConformance

from skulk_kernel.topics import Topic
from skulk_kernel.transport_local import LocalTransport


class TestLocalTransport(TransportConformance):
    @pytest.fixture
    def transport(self) -> LocalTransport:
        return LocalTransport()

    async def test_send_to_another_node_goes_nowhere(self, started: LocalTransport) -> None:
        """A lone node has no peers: a send to someone else is dropped, never delivered locally."""
        inbox = Inbox()
        started.subscribe(Topic.CHUNKS, inbox)
        await started.send("someone-else", Topic.CHUNKS, b"lost")
        assert inbox.messages == []

    async def test_stop_drops_subscriptions(self, started: LocalTransport) -> None:
        inbox = Inbox()
        started.subscribe(Topic.COMMANDS, inbox)
        await started.stop()
        await started.publish(Topic.COMMANDS, b"after stop")
        assert inbox.messages == []
