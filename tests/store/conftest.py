"""Fixtures for the store tests: the bundled SmolLM2 GGUF served by a loopback hub, and nodes that
talk to it through huggingface_hub (HF_ENDPOINT), each with its own models directory."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

from .hub_server import HubRepo, LoopbackHub

MODELS_DIR = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: a single node with a local control plane (one-node tests)
SOLO = """
[profile]
name = "store-solo"
plugins = ["master", "worker", "engine-echo", "store", "api-control"]

[planes]
control = "local"

[plugins.master]
default_models = []
"""

#: a cluster member over Zenoh (multi-node tests); each cluster gets its own network version
MEMBER = """
[profile]
name = "store-member"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []
node_timeout_s = 30

[plugins.transport-zenoh]
multicast_scouting = true
"""

LLAMA = """
[plugins.engine-llamacpp]
n_threads = 1
"""


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The bundled chat model's GGUF, provisioned once per machine (from the package index)."""
    from skulk_engine_llamacpp.models import provision_smollm2

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    return Path(provision_smollm2(MODELS_DIR))


@pytest.fixture
def hub(smollm2_gguf: Path, tmp_path: Path) -> Iterator[LoopbackHub]:
    readme = tmp_path / "README.md"
    readme.write_text("# SmolLM2-135M-Instruct, Q4_1 GGUF (loopback hub)\n")
    server = LoopbackHub()
    server.add(HubRepo.from_files(REPO, {GGUF: smollm2_gguf, "README.md": readme}))
    with server:
        yield server


class Nodes:
    """Real node processes sharing one loopback hub; stopped (killed if need be) after the test."""

    def __init__(self, tmp: Path, hub: LoopbackHub) -> None:
        self.tmp = tmp
        self.hub = hub
        self.version = f"t{uuid.uuid4().hex[:10]}"
        self.started: list[NodeProcess] = []
        self.solo = tmp / "solo.toml"
        self.solo.write_text(SOLO)
        self.member = tmp / "member.toml"
        self.member.write_text(MEMBER)
        self.llama = tmp / "llama.toml"
        self.llama.write_text(MEMBER.replace('"engine-echo"', '"engine-llamacpp"') + LLAMA)

    def env(self, name: str, **extra: str) -> dict[str, str]:
        return {
            "HF_ENDPOINT": self.hub.url,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "SKULK_MODELS_DIR": str(self.tmp / name / "models"),
            "SKULK_NETWORK_VERSION": self.version,
            **extra,
        }

    def start(self, name: str, *args: str, cluster: bool = False, llama: bool = False, **extra: str) -> NodeProcess:
        profile = self.llama if llama else self.member if cluster else self.solo
        node = start_node(
            str(profile), "--node-name", name, *args, home=self.tmp / name / "home", env=self.env(name, **extra)
        )
        self.started.append(node)
        return node

    def stop(self) -> None:
        for node in self.started:
            node.stop()


@pytest.fixture
def nodes(tmp_path: Path, hub: LoopbackHub) -> Iterator[Nodes]:
    made = Nodes(tmp_path, hub)
    try:
        yield made
    finally:
        made.stop()


def wait(check: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> object:
    import time

    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a node still starting
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not within {timeout}s (last: {last!r})")
