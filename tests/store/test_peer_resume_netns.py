"""A peer copy resumes mid-file after the requesting node is killed (needs root: a network namespace).

Node A, in a network namespace whose link sends at most 160 Mbit/s (`tc tbf`), holds a 64 MB model;
node B, on this host, is asked for it and killed (SIGKILL, with its copy process) once a few ranges
have landed. Restarted and asked again, B continues from the ranges it had recorded: the file
arrives whole (SHA-256), B's log says it resumed, and A served little more than the file once.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from skulk_store.cards import card_from_mapping
from skulk_store.store import LocalModelStore, folder_name
from skulk_testing.netns import Netns
from skulk_testing.nodes import NodeProcess, free_port

from tests.security.test_netns_security import NsNode, _token, _zenoh_port

from .conftest import wait

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root, iproute2 and tc")

MODEL, NAME = "test-org/resumed-copy", "weights.bin"
SIZE = 64 << 20
PROFILE = """
[profile]
name = "peer-resume"
plugins = ["transport-zenoh", "election-bully", "master", "store", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns().up()
    try:
        cmd = f"tc qdisc add dev {ns.ns_if} root tbf rate 160mbit burst 1mb latency 50ms"
        subprocess.run(ns.command(*cmd.split()), check=True, capture_output=True)
        yield ns
    finally:
        ns.down()


def _card(digest: str) -> dict[str, object]:
    source = {"kind": "hub", "repo_id": MODEL, "revision": "0" * 40, "main_file": NAME}
    return {
        "model_id": MODEL,
        "n_layers": 1,
        "hidden_size": 8,
        "storage_size": SIZE,
        "source": source | {"files": {NAME: {"size": SIZE, "sha256": digest}}},
    }


def test_a_copy_resumes_after_the_requester_is_killed(tmp_path: Path, netns: Netns) -> None:
    blob = os.urandom(SIZE)
    digest = hashlib.sha256(blob).hexdigest()
    held = tmp_path / "a" / "models" / folder_name(MODEL)
    held.mkdir(parents=True)
    (held / NAME).write_bytes(blob)
    LocalModelStore(tmp_path / "a" / "models").install(card_from_mapping(_card(digest), "test"), held, NAME)
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE)
    (tmp_path / "open.toml").write_text(PROFILE + "\n[plugins.api-control]\nopen = true\n")
    version = f"resume{secrets.token_hex(4)}"
    common = ("--api-host", "0.0.0.0", "--no-default-models", "--no-worker")
    a = NsNode(
        profile=str(tmp_path / "open.toml"),
        home=tmp_path / "a" / "home",
        api_port=free_port(),
        args=(*common, "--node-name", "a"),
        env={
            "HOME": str(tmp_path / "owner"),
            "SKULK_NETWORK_VERSION": version,
            "SKULK_JOIN_TOKEN": "",
            "SKULK_MODELS_DIR": str(tmp_path / "a" / "models"),
        },
    )
    a.netns = netns
    b: NodeProcess | None = None
    try:
        a.start().wait_api()
        a_id = a.get("/node_id").json()
        b = NodeProcess(
            profile=str(profile),
            home=tmp_path / "b" / "home",
            api_port=free_port(),
            args=(*common, "--node-name", "b", "--offline", "--bootstrap-peers", f"{netns.ns_ip}:{_zenoh_port(a)}"),
            env={
                "HOME": str(tmp_path / "other"),
                "SKULK_NETWORK_VERSION": version,
                "SKULK_JOIN_TOKEN": _token(tmp_path, "owner"),
                "SKULK_MODELS_DIR": str(tmp_path / "b" / "models"),
            },
        )
        b.start().wait_api()

        def ready() -> bool:
            assert b is not None
            state = b.state()
            present = state["nodeResources"].get(a_id, {}).get("modelsPresent", [])
            return MODEL in state["customModelCards"] and MODEL in present

        wait(lambda: len(b.state()["topology"]["nodes"]) == 2, 90, "A and B in one cluster")
        assert b.post("/models/add-card", json={"card": _card(digest)}).status_code == 200
        wait(ready, 60, "the card and A's inventory on B")

        record = tmp_path / "b" / "models" / ".downloads" / folder_name(MODEL) / ".peer" / f"{NAME}.part.ranges"
        assert b.post(f"/store/models/{MODEL}/download").json()["status"] == "started"
        wait(lambda: record.is_file() and len(json.loads(record.read_text())["done"]) >= 2, 60, "two ranges recorded")
        b.kill()
        b.proc.wait(10)  # type: ignore[union-attr]
        wait(lambda: not _copy_processes(tmp_path), 10, "the copy process gone with its node")
        assert record.is_file()

        b.start().wait_api()
        wait(ready, 90, "B back in the cluster")
        assert b.post(f"/store/models/{MODEL}/download").status_code == 200
        wait(lambda: _status(b) in ("installed", "failed"), 90, "B's copy")
        assert _status(b) == "installed", b.log()[-3000:]
        copy = tmp_path / "b" / "models" / folder_name(MODEL) / NAME
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest
        assert "resumed with" in b.log()
        served = sum(httpx.get(f"{a.url}/store/transfers", timeout=10).json()["served_to"].values())
        assert SIZE <= served < 1.5 * SIZE, served  # the ranges in flight at the kill crossed twice at most
    finally:
        if b is not None:
            b.stop()
        a.stop()


def _status(node: NodeProcess) -> str:
    return str(node.get(f"/store/models/{MODEL}/download").json().get("status"))


def _copy_processes(tmp_path: Path) -> list[str]:
    """The copy processes (`skulk_store.copyproc`) started by this test's nodes and still running."""
    found = []
    for pid in subprocess.run(["pgrep", "-f", "skulk_store.copyproc"], capture_output=True, text=True).stdout.split():
        try:
            if str(tmp_path) in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass  # gone meanwhile
    return found
