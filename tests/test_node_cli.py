"""The node command as an operator uses it: start, options, clean stop."""

from __future__ import annotations

import signal
import time

import pytest

pytestmark = pytest.mark.slow


def test_dev_profile_serves_echo_and_stops_cleanly(node_factory):
    node = node_factory("dev").wait_api().wait_ready("skulk/echo", timeout=60)
    diag = node.get("/v1/diagnostics/node").json()
    assert diag["runtime"]["isMaster"] and diag["runtime"]["profile"] == "dev"
    assert {r["modelId"] for r in diag["supervisorRunners"]} == {"skulk/echo", "skulk/echo-embed"}
    node.kill(signal.SIGINT)
    assert node.proc.wait(20) == 0
    assert "stopped" in node.log()


def test_no_default_models_places_nothing(node_factory):
    node = node_factory("dev", "--no-default-models").wait_api()
    time.sleep(4)  # several reconciliation passes
    assert node.state()["instances"] == {}
    placed = node.post("/place_instance", json={"model_id": "skulk/echo"})
    assert placed.status_code == 200
    node.wait_ready("skulk/echo", timeout=60)


def test_bad_profile_is_a_clear_error(node_factory, tmp_path):
    profile = tmp_path / "broken.toml"
    profile.write_text('[profile]\nname = "broken"\nplugins = ["master", "no-such-plugin"]\n')
    node = node_factory(str(profile))
    assert node.proc.wait(30) == 2
    assert "no-such-plugin" in node.log() and "pip install" in node.log()


def test_engines_command_finds_every_installed_engine_installer():
    """The worker owns `engines`; engine plugins offer installers whatever the profile (no clash)."""
    import subprocess
    import sys

    cli = [sys.executable, "-m", "skulk_kernel.cli"]
    status = subprocess.run([*cli, "engines", "status"], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    names = {line.split()[0] for line in status.stdout.splitlines() if line.strip()}
    assert {"vllm", "comfyui", "diffusers"} <= names, status.stdout
    unknown = subprocess.run([*cli, "engines", "install", "nosuch"], capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2
    assert "no installer for engine 'nosuch'" in unknown.stderr and "vllm" in unknown.stderr
    bad = subprocess.run(
        [*cli, "engines", "install", "vllm", "--flavor", "tpu"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
