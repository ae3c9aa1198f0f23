"""tuning.reopen_stale_streams against a stand-in for py-libp2p's Pubsub (the process test
test_sigstop_leaves_after_the_lease_and_sigcont_rejoins is the proof on real processes: a thawed
peer whose old connection was hung up while a redial was already through kept a dead stream)."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from skulk_transport_libp2p import tuning


class FakePubsub:
    """The four members reopen_stale_streams uses; forgetting a peer drops its subscriptions, as
    py-libp2p's `_handle_dead_peer` does."""

    def __init__(self, streams: dict[str, Any], connected: Iterable[str] = ()) -> None:
        self.peers = streams
        self.connected = set(connected)
        self.peer_topics: dict[str, set[str]] = {}
        self.dead: list[str] = []

    def _handle_dead_peer(self, peer: str) -> None:
        self.dead.append(peer)
        del self.peers[peer]
        for peers in self.peer_topics.values():
            peers.discard(peer)

    def _peer_is_connected(self, peer: str) -> bool:
        return peer in self.connected

    def handle_subscription(self, peer: str, sub: Any) -> None:
        assert sub.subscribe
        self.peer_topics.setdefault(sub.topicid, set()).add(peer)


def stream(closed: bool) -> Any:
    return SimpleNamespace(muxed_conn=SimpleNamespace(is_closed=closed))


def test_only_streams_on_closed_connections_are_forgotten() -> None:
    pubsub = FakePubsub({"dead": stream(True), "live": stream(False), "bare": SimpleNamespace()})
    assert tuning.reopen_stale_streams(pubsub) == ["dead"]
    assert pubsub.dead == ["dead"]
    assert set(pubsub.peers) == {"live", "bare"}
    assert tuning.reopen_stale_streams(pubsub) == []


def test_a_peer_still_connected_keeps_its_subscriptions_a_gone_one_loses_them() -> None:
    pubsub = FakePubsub({"thawed": stream(True), "gone": stream(True)}, connected={"thawed"})
    pubsub.peer_topics = {"commands": {"thawed", "gone"}, "events": {"thawed"}}
    assert sorted(tuning.reopen_stale_streams(pubsub)) == ["gone", "thawed"]
    assert pubsub.peer_topics == {"commands": {"thawed"}, "events": {"thawed"}}


def test_a_pubsub_without_peers_is_left_alone() -> None:
    assert tuning.reopen_stale_streams(SimpleNamespace()) == []
