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
