"""The steward in the dashboard's Chat: `skulk/steward` offered as a model and answered, and a pending
proposal approved in place (operator), on a real node with the echo engine (the model does not matter
here; tests/steward covers the steward itself). The browser side is `dashboard/e2e/steward.mjs`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from skulk_testing.nodes import start_node

from .conftest import DASHBOARD, Dashboard

pytestmark = pytest.mark.slow

PROFILE = """
[profile]
name = "dashboard-steward"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "api-openai", "steward"]

[planes]
control = "local"

[plugins.master]
default_models = []

[plugins.steward]
models = ["skulk/echo"]
"""


def test_chat_with_the_steward_and_approve_its_proposal(dashboard: Dashboard, tmp_path: Path) -> None:
    profile = tmp_path / "steward.toml"
    profile.write_text(PROFILE)
    node = start_node(str(profile), "--node-name", "stew", home=tmp_path / "home", env=dashboard.node_env())
    try:
        node.wait_api()
        node.wait_until(lambda: node.get("/v1/steward").json()["ready"], 60, "a ready steward")
        placed = node.post("/place_instance", json={"model_id": "skulk/echo"})
        assert placed.status_code == 200, placed.text
        node.wait_until(lambda: len(node.ready_instances()) >= 2, 60, "the user's instance ready")
        steward_id = node.get("/v1/steward").json()["instanceId"]
        user = next(i for i in node.ready_instances() if i != steward_id)
        made = node.post("/v1/steward/proposals", json={"action": {"kind": "delete_instance", "instance_id": user}})
        assert made.status_code == 201, made.text
        pid = made.json()["id"]
        cmd = [shutil.which("node") or "node", "e2e/steward.mjs", "--url", node.url, "--out", str(dashboard.artifacts)]
        done = subprocess.run(
            [*cmd, "--proposal", pid],
            cwd=DASHBOARD,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "CHROMIUM": str(dashboard.chromium)},
        )
        print(done.stdout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, f"steward.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        result = json.loads(lines[-1][7:])
        deadline = time.monotonic() + 20
        while user in node.ready_instances() and time.monotonic() < deadline:
            time.sleep(0.2)
        gone = user not in node.ready_instances()
    finally:
        node.stop()
    assert "skulk/steward" in result["options"]
    assert result["answer"].strip(), result
    assert result["statusBefore"] == "pending" and result["statusAfter"] != "pending", result
    assert gone, "the approved delete_instance did not run"
    assert not result["consoleErrors"], result["consoleErrors"]
    assert not any(result["axe"].values()), json.dumps(result["axe"], indent=1)  # acceptance 7
