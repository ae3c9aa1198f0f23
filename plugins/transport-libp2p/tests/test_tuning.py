"""tuning.reopen_stale_streams against a stand-in for py-libp2p's Pubsub (the process test
test_sigstop_leaves_after_the_lease_and_sigcont_rejoins is the proof on real processes: a thawed
peer whose old connection was hung up while a redial was already through kept a dead stream)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from skulk_transport_libp2p import tuning


class FakePubsub:
    def __init__(self, streams: dict[str, Any]) -> None:
        self.peers = streams
        self.dead: list[str] = []

    def _handle_dead_peer(self, peer: str) -> None:
        self.dead.append(peer)
        del self.peers[peer]


def stream(closed: bool) -> Any:
    return SimpleNamespace(muxed_conn=SimpleNamespace(is_closed=closed))


def test_only_streams_on_closed_connections_are_forgotten() -> None:
    pubsub = FakePubsub({"dead": stream(True), "live": stream(False), "bare": SimpleNamespace()})
    assert tuning.reopen_stale_streams(pubsub) == ["dead"]
    assert pubsub.dead == ["dead"]
    assert set(pubsub.peers) == {"live", "bare"}
    assert tuning.reopen_stale_streams(pubsub) == []


def test_a_pubsub_without_peers_is_left_alone() -> None:
    assert tuning.reopen_stale_streams(SimpleNamespace()) == []
