"""Issue [scale], ghost nodes: a node that crash-loops (kill -9 and restart, same data directory)
leaves exactly one live entry in the topology, and none once it stays down.

Identity is not persisted, so every restart is a new node id; each dead incarnation is pruned as
soon as its session is closed and its heartbeats stopped (`departed_after_s`), and every node, not
only the master, forgets its readings (no ghost in anyone's `nodeHealth`). Eight nodes, all but
two without an API (the lightest node there is), on Zenoh: the control plane's part, the detection
of a departure, is the one `test_healing.py` runs on both transports.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from .conftest import zenoh_only

pytestmark = pytest.mark.slow

NODES = int(os.environ.get("SKULK_GHOST_NODES", "8"))
RESTARTS = int(os.environ.get("SKULK_GHOST_RESTARTS", "20"))


def node_id_from_log(node, timeout: float = 30) -> str:
    """The id a node announces in its log (a node without an API has no /node_id to ask)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"skulk\.node: node ([0-9a-f-]{36}) \(", node.log())
        if found:
            return found.group(1)
        assert node.proc.poll() is None, node.log()[-3000:]
        time.sleep(0.1)
    raise TimeoutError(f"no node id in the log:\n{node.log()[-3000:]}")


@zenoh_only
def test_a_crash_looping_node_leaves_one_entry_then_none(cluster_factory):
    cluster = cluster_factory(default_models=())
    observers = [cluster.start(), cluster.start()]
    steady = [*observers, *(cluster.start("--no-api") for _ in range(NODES - 3))]
    looper = cluster.start("--no-api")
    for node in observers:
        node.wait_api(60)
    steady_ids = {node_id_from_log(n) for n in steady}
    watcher = observers[0]

    def members() -> set[str]:
        return set(watcher.state()["topology"]["nodes"])

    most_ghosts = 0
    looper_id = node_id_from_log(looper)
    for _ in range(RESTARTS):
        watcher.wait_until(lambda i=looper_id: i in members(), 30, f"incarnation {looper_id} to join")
        most_ghosts = max(most_ghosts, len(members() - steady_ids - {looper_id}))
        looper.kill(signal.SIGKILL)
        looper.proc.wait(10)
        looper.start()  # the same SKULK_HOME: a crash loop under a supervisor
        looper_id = node_id_from_log(looper)

    # one live entry for the looping node: the dead incarnations are gone within seconds
    watcher.wait_until(lambda: members() == steady_ids | {looper_id}, 20, "exactly one entry for the looper")
    for node in observers:  # no ghost left in any node's telemetry either (followers forget too)
        node.wait_until(
            lambda n=node: set(n.state()["nodeHealth"]) == steady_ids | {looper_id}, 20, "no ghost in nodeHealth"
        )
    print(f"{NODES} nodes, {RESTARTS} restarts: at most {most_ghosts} dead incarnation(s) listed at a time")

    looper.kill(signal.SIGKILL)
    looper.proc.wait(10)
    watcher.wait_until(lambda: members() == steady_ids, 20, "no entry once the looper stays down")
    for node in observers:
        node.wait_until(lambda n=node: set(n.state()["nodeHealth"]) == steady_ids, 20, "no ghost in nodeHealth")
