"""A real cluster for the [resume] tests: one API node (the master, no worker) and SmolLM2 replicas
on worker nodes that the tests kill with SIGKILL and replace with fresh ones.

The node timeout is long on purpose: the tests manage the replicas themselves, so no prune or
automatic re-placement moves an instance while a test counts them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from skulk_testing.nodes import NodeProcess

from tests.cluster.conftest import PROFILE, Cluster, instance_nodes
from tests.conftest import CHAT_MODEL

T = TypeVar("T")


def open_tasks(state: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = [next(iter(t.values())) for t in state["tasks"].values()]
    return [t for t in tasks if t["status"] in ("Pending", "Running")]


class Fabric:
    """The cluster plus what the tests ask of it: N ready replicas on N live workers, kill the server."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api = cluster.start("--force-master", "--no-worker")
        self.api.wait_api(60)
        self.api_id = cluster.node_id(self.api)
        self.workers: list[NodeProcess] = []

    def live_workers(self) -> dict[str, NodeProcess]:
        return {self.cluster.node_id(w): w for w in self.workers if w.proc is not None and w.proc.poll() is None}

    def ready_by_node(self) -> dict[str, str]:
        """live worker node id -> a ready instance of the chat model on it."""
        state = self.api.state()
        live = self.live_workers()
        ready = set(self.api.ready_instances(CHAT_MODEL))
        return {nodes[0]: iid for iid, nodes in instance_nodes(state).items() if iid in ready and nodes[0] in live}

    def replicas(self, n: int, timeout: float = 240) -> list[str]:
        """Exactly `n` ready replicas on `n` different live workers (starting workers as needed)."""
        while len(self.live_workers()) < n:
            worker = self.cluster.start()
            worker.wait_api(60)
            self.workers.append(worker)
        live = self.live_workers()
        in_topology = lambda: set(live) <= set(self.api.state()["topology"]["nodes"])  # noqa: E731
        self.api.wait_until(in_topology, 60, "the workers in the API node's topology")
        for iid in list(self.ready_by_node().values())[n:]:
            assert httpx.delete(self.api.url + "/instance/" + iid, timeout=30).status_code == 200
        asked: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            placed = {nodes[0] for nodes in instance_nodes(self.api.state()).values() if nodes[0] in live} | asked
            for node_id in [k for k in live if k not in placed][: max(0, n - len(placed))]:
                others = [self.api_id, *(k for k in live if k != node_id)]
                response = self.api.post("/place_instance", json={"model_id": CHAT_MODEL, "excluded_nodes": others})
                if response.status_code == 200:  # else its telemetry is not in yet: next round
                    asked.add(node_id)
            found = self.ready_by_node()
            if len(found) == n:
                # a killed node's instance is placed again within seconds (the master heals at the
                # speed of detection): a second one on a live worker would take a share of the
                # requests, so exactly these n stay
                extra = [iid for iid in instance_nodes(self.api.state()) if iid not in found.values()]
                for iid in extra:
                    httpx.delete(self.api.url + "/instance/" + iid, timeout=30)
                self.api.wait_until(
                    lambda extra=set(extra): not extra & set(self.api.state()["instances"]), 60, "extras deleted"
                )
                return list(found.values())
            time.sleep(0.5)
        raise TimeoutError(f"no {n} ready replicas in {timeout}s: {self.ready_by_node()}")

    def serving_node(self, ended: Callable[[], bool] = lambda: False) -> str | None:
        """The node running the one open generation (waits for its task to appear); None when the
        request `ended` first (a short answer on a quick box can run between two polls of /state)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = self.api.state()
            tasks = open_tasks(state)
            if tasks:
                return instance_nodes(state)[tasks[0]["instanceId"]][0]
            if ended():
                return None
            time.sleep(0.05)
        raise TimeoutError("no open task")

    def kill_serving(self) -> str:
        node_id = self.serving_node()
        assert node_id is not None
        self.live_workers()[node_id].kill()
        return node_id

    def resumes(self) -> dict[str, Any]:
        return self.api.get("/v1/diagnostics/node").json()["resumes"]

    def resumed_once(self, attempt: Callable[[], T]) -> tuple[T, dict[str, Any]]:
        """`attempt` (a request whose serving node it kills midway) run until its kill lands while the
        answer is still being generated, up to three times, and resumed once: its result and the
        resume counters after it. On a loaded box the serving node can send its whole answer before
        the kill lands (a client reading behind, a short answer between two polls): no stream failed,
        so there is no resume to judge, and the attempt runs again on two fresh replicas."""
        for _attempt in range(3):
            before = self.resumes()
            got = attempt()
            after = self.resumes()
            if after["failures"] > before["failures"]:
                break
            self.replicas(2)
        assert after["failures"] == before["failures"] + 1, f"no kill landed mid-answer in 3 tries: {after}"
        assert after["resumed"] == before["resumed"] + 1, after
        return got, after


def make_fabric(tmp: Path, models_dir: Path, *, affinity: bool = True) -> Fabric:
    """A fresh API node (master) with its own network version; workers come with `replicas()`."""
    tmp.mkdir(parents=True, exist_ok=True)
    profile = tmp / "profile.toml"
    profile.write_text(
        PROFILE.replace('"api-openai"]', '"api-openai", "api-anthropic", "api-ollama"]').format(
            default_models="[]", timeout=600.0, multicast="true", engine="engine-llamacpp"
        )
        + "\n[plugins.engine-llamacpp]\nn_threads = 1\nn_threads_batch = 1\n"
        + f"\n[plugins.api-control]\nprefix_affinity = {str(affinity).lower()}\n"
    )
    cluster = Cluster(tmp, profile, f"r{uuid.uuid4().hex[:10]}", {"SKULK_MODELS_DIR": str(models_dir)})
    try:
        return Fabric(cluster)
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[Fabric]:
    pytest.importorskip("xllamacpp")
    made = make_fabric(tmp_path_factory.mktemp("resume"), models_dir)
    try:
        yield made
    finally:
        made.cluster.stop()
