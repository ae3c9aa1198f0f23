"""Real node processes with the observe plugin: a Zenoh cluster on this host, or one local node.

Each cluster gets a fresh SKULK_NETWORK_VERSION so it never joins another test's nodes (or an
operator's). Every node started is stopped (its process group killed) when the test ends.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from skulk_testing.nodes import NodeProcess, start_node

CLUSTER_PROFILE = """
[profile]
name = "observe-cluster-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai", "observe"]

[planes]
control = "zenoh"

[plugins.master]
default_models = {default_models}
node_timeout_s = 30

[plugins.transport-zenoh]
multicast_scouting = true

[plugins.observe]
stalled_after_s = 2
fanout_timeout_s = 5
"""

LOCAL_PROFILE = """
[profile]
name = "observe-local-test"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "api-openai", "observe"]

[planes]
control = "local"

[plugins.master]
default_models = ["skulk/echo"]

[plugins.observe]
stalled_after_s = 2
"""


class Cluster:
    def __init__(self, tmp: Path, profile: Path) -> None:
        self.tmp = tmp
        self.profile = profile
        self.version = f"obs{uuid.uuid4().hex[:10]}"
        self.nodes: list[NodeProcess] = []
        self._ids: dict[int, str] = {}

    def start(self, env: dict[str, str] | None = None) -> NodeProcess:
        node = start_node(
            str(self.profile),
            "--node-name",
            f"n{len(self.nodes)}",
            home=self.tmp / f"node{len(self.nodes)}",
            env={"SKULK_NETWORK_VERSION": self.version, **(env or {})},
        )
        self.nodes.append(node)
        return node

    def alive(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def node_id(self, node: NodeProcess) -> str:
        if id(node) not in self._ids:
            self._ids[id(node)] = node.get("/node_id").json()
        return self._ids[id(node)]

    def by_id(self, node_id: str) -> NodeProcess:
        return next(n for n in self.alive() if self.node_id(n) == node_id)

    def agreed(self) -> str | None:
        nodes = self.alive()
        views = [n.get("/v1/diagnostics/node", timeout=3).json() for n in nodes]
        masters = {v["runtime"]["masterNodeId"] for v in views}
        hashes = {v["stateHash"] for v in views}
        members = {len(n.state()["topology"]["nodes"]) for n in nodes}
        if len(masters) == 1 and None not in masters and len(hashes) == 1 and members == {len(nodes)}:
            return str(masters.pop())
        return None

    def wait_agreed(self, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                found = self.agreed()
            except (httpx.HTTPError, KeyError, ValueError) as exc:  # a node still starting
                found, last = None, exc
            if found:
                return found
            time.sleep(0.3)
        logs = "\n".join(n.log()[-1500:] for n in self.alive())
        raise TimeoutError(f"cluster did not agree in {timeout}s ({last!r}):\n{logs}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(default_models: tuple[str, ...] = ()) -> Cluster:
        profile = tmp_path / f"profile{len(made)}.toml"
        profile.write_text(CLUSTER_PROFILE.format(default_models=json.dumps(list(default_models))))
        cluster = Cluster(tmp_path / f"cluster{len(made)}", profile)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


@pytest.fixture
def local_node(tmp_path: Path) -> Iterator[NodeProcess]:
    profile = tmp_path / "local.toml"
    profile.write_text(LOCAL_PROFILE)
    node = start_node(
        str(profile), home=tmp_path / "home", env={"SKULK_NETWORK_VERSION": f"obs{uuid.uuid4().hex[:10]}"}
    )
    try:
        yield node.wait_api()
    finally:
        node.stop()


def place(node: NodeProcess, model_id: str, excluded: list[str]) -> str:
    response = node.post("/place_instance", json={"model_id": model_id, "excluded_nodes": excluded})
    assert response.status_code == 200, response.text
    return str(response.json()["instance_id"])


def wait_instance_ready(node: NodeProcess, instance_id: str, timeout: float) -> None:
    node.wait_until(lambda: instance_id in node.ready_instances(), timeout, f"instance {instance_id} ready")


def stream_chat(node: NodeProcess, text: str, *, max_tokens: int | None = None, timeout: float = 60) -> tuple[str, str]:
    """(command id from the `: command_id` comment, the streamed text)."""
    body: dict[str, Any] = {"model": "skulk/echo", "stream": True, "messages": [{"role": "user", "content": text}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    command_id, out = "", ""
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith(": command_id "):
                command_id = line.split(" ", 2)[2].strip()
            elif line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    out += choice.get("delta", {}).get("content") or ""
    assert command_id, "the stream carried no `: command_id` comment"
    return command_id, out
