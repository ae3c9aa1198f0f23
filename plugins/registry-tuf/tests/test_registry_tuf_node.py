"""Acceptance 5 of [store] with a real node process: a registry served on loopback by a real HTTP
server, made and signed with the real `skulk-kernel registry` CLI (through the plugin's
register_cli_commands hook), verified by python-tuf's ngclient inside the node.

One node goes through every case in turn: a valid registry adds its cards to `/models`; a tampered
target, an expired timestamp and rolled-back metadata are each refused with the reason in `/state`
health and the log while the last good cards stay listed; with the server stopped the last good
catalog is still used, also by the node restarted while the registry is down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from registry_tuf_helpers import LoopbackServer, restore_repo, snapshot_repo, tamper_card, write_card
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = pytest.mark.slow

PROFILE = """
[profile]
name = "registry-node"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "registry-tuf"]

[planes]
control = "local"

[plugins.master]
default_models = []

[plugins.registry-tuf]
url = "{url}"
root = "{root}"
refresh_interval_s = 1
"""


def cli(profile: Path, *argv: str) -> str:
    """`skulk-kernel registry ...` as a user runs it (plugin commands come from SKULK_PROFILE)."""
    env = {**os.environ, "SKULK_PROFILE": str(profile)}
    done = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "registry", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def model_ids(node: NodeProcess) -> set[str]:
    return {entry["id"] for entry in node.get("/models").json()["data"]}


def health_messages(node: NodeProcess) -> list[str]:
    node_id = node.get("/node_id").json()
    reasons: list[dict[str, Any]] = node.state()["nodeHealth"][node_id]["reasons"]
    return [r["message"] for r in reasons if r["message"].startswith("registry-tuf")]


def wait_refused(node: NodeProcess, code: str) -> str:
    found: list[str] = []

    def refused() -> bool:
        found[:] = [m for m in health_messages(node) if code in m]
        return bool(found)

    node.wait_until(refused, 30, f"{code} in health")
    return found[0]


def wait_models(node: NodeProcess, *wanted: str) -> None:
    node.wait_until(lambda: set(wanted) <= model_ids(node), 30, f"{wanted} in /models")


def test_node_uses_a_signed_registry_and_refuses_bad_ones(tmp_path: Path) -> None:
    registry, cards = tmp_path / "registry", tmp_path / "cards"
    bootstrap = tmp_path / "bootstrap.toml"  # the CLI needs a profile that loads the plugin
    bootstrap.write_text(PROFILE.format(url="http://127.0.0.1:1", root="/nonexistent"))
    root = Path(cli(bootstrap, "init", str(registry)).strip())
    assert root.is_file()
    write_card(cards, "alpha")
    cli(bootstrap, "sign", str(cards), str(registry))
    server = LoopbackServer(registry / "repo").start()
    profile = tmp_path / "node.toml"
    profile.write_text(PROFILE.format(url=server.url, root=root))
    env = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    started: list[NodeProcess] = []
    try:
        node = start_node(str(profile), home=tmp_path / "home", env=env)
        started.append(node)
        node.wait_api()
        a, b, c = "registry-org/alpha", "registry-org/beta", "registry-org/gamma"
        wait_models(node, a)
        assert health_messages(node) == []
        assert node.get("/registry").json()["version"] == 1

        # a tampered target: the new version's card does not match its signed hash
        server.stop()  # the node refreshes every second: it must not see the version before the tampering
        write_card(cards, "beta")
        cli(bootstrap, "sign", str(cards), str(registry))
        tamper_card(registry, "beta")
        server.start()
        message = wait_refused(node, "registry_tampered")
        assert "does not match its signed hash" in message and "still using the last good catalog" in message
        assert b not in model_ids(node) and a in model_ids(node)
        assert "registry" in node.log() and "tampered" in node.log()
        cli(bootstrap, "sign", str(cards), str(registry))  # re-signing repairs the served copy
        wait_models(node, a, b)
        node.wait_until(lambda: health_messages(node) == [], 30, "a clean health after the repair")
        good = snapshot_repo(registry, tmp_path / "good")

        # an expired timestamp
        write_card(cards, "gamma")
        cli(bootstrap, "sign", str(cards), str(registry), "--timestamp-expires-in-s", "-60")
        assert "timestamp.json is expired" in wait_refused(node, "registry_expired")
        assert c not in model_ids(node) and {a, b} <= model_ids(node)
        assert "expired" in node.log()
        cli(bootstrap, "sign", str(cards), str(registry))
        wait_models(node, a, b, c)

        # rolled back: the server offers an older (validly signed) version again
        server.stop()
        restore_repo(good, registry)
        server.start()
        message = wait_refused(node, "registry_rolled_back")
        assert "must be >=" in message
        assert {a, b, c} <= model_ids(node)  # the newest good catalog, not the older one served

        # the registry goes away: the last good catalog keeps being used, across a restart
        server.stop()
        wait_refused(node, "registry_unreachable")
        assert {a, b, c} <= model_ids(node)
        node.stop()
        node = start_node(str(profile), home=tmp_path / "home", env=env)
        started.append(node)
        node.wait_api()
        assert {a, b, c} <= model_ids(node)
        assert "still using the last good catalog" in wait_refused(node, "registry_unreachable")
        status = node.get("/registry").json()
        assert status["refusal"]["code"] == "registry_unreachable" and status["version"] >= 5
    finally:
        server.stop()
        for started_node in started:
            started_node.stop()
