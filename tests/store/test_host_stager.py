"""Which store hosts a worker stages from (`HostStager.hosts`), around a fake node surface.

A store host that is still a member but momentarily out of reach (a session lost for a second on a
loaded machine) is waited for, bounded; one the cluster has dropped is not; a member that never
comes back is given up on after `HOST_RETURN_S` with a warning. Staging itself between real nodes
is proven in `test_store_host.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import pytest
from skulk_kernel.api import State
from skulk_store import staging
from skulk_store.staging import HOST_PREFIX, PLUGIN_DATA, HostEntry, HostStager

HOST = "host-node-id"
WORKER = "worker-node-id"


@dataclass
class FakeNode:
    members: tuple[str, ...]
    peers: set[str] = field(default_factory=set)
    node_id: str = WORKER
    stopping: bool = False

    @property
    def state(self) -> State:
        entry = HostEntry(node_id=HOST, models_dir="/nonexistent", mark="m", models={"org/model": 1})
        return State.model_validate(
            {
                "topology": {"nodes": list(self.members)},
                "plugin_data": {PLUGIN_DATA: {HOST_PREFIX + HOST: entry.model_dump()}},
            }
        )

    def reachable_nodes(self) -> set[str]:
        return {self.node_id, *self.peers}


def _stager(node: FakeNode) -> HostStager:
    return HostStager(node, store=None, fetcher=None, loop=None)  # type: ignore[arg-type]


def test_a_member_host_out_of_reach_for_a_moment_is_waited_for() -> None:
    node = FakeNode(members=(HOST, WORKER))
    threading.Timer(0.6, lambda: node.peers.add(HOST)).start()
    began = time.monotonic()
    assert [h.node_id for h in _stager(node).hosts()] == [HOST]
    assert 0.5 <= time.monotonic() - began < staging.HOST_RETURN_S


def test_a_host_the_cluster_dropped_is_not_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    node = FakeNode(members=(WORKER,))
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, "skulk.store.staging"):
        assert _stager(node).hosts() == []
    assert time.monotonic() - began < 0.5
    assert "no store host is reachable" in caplog.text


def test_a_member_host_that_never_comes_back_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(staging, "HOST_RETURN_S", 0.5)
    node = FakeNode(members=(HOST, WORKER))
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, "skulk.store.staging"):
        assert _stager(node).hosts() == []
    assert 0.5 <= time.monotonic() - began < 2.0
    assert "fetching from the peers or the hub instead" in caplog.text
