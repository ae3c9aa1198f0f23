"""Issue [dashboard] with [vision]: Chat takes images for a model with the `vision` capability.

A real node runs engine-echo with `vision_model = true` (skulk/echo-vision answers each image's
sha256 digest, computed from the bytes its runner received) and the text-only skulk/echo. Chromium
picks a PNG through the file input and sends it; the answer carries the digest of the file's bytes
as the test computes them. The text-only model shows no image control; an image over the node's
`images_max_bytes` shows the node's 413 on the answer; axe-core with an image attached. The node
also runs the providers plugin with the example echo provider (pip-installed into a folder of its
own on the node's PYTHONPATH, never into the shared environment): Observe's Capabilities section
lists its descriptors. Browser side: `dashboard/e2e/vision.mjs`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from skulk_testing.nodes import start_node

from .conftest import DASHBOARD, ROOT, Dashboard

pytestmark = pytest.mark.slow

MAX_BYTES = 4096
PROFILE = f"""
[profile]
name = "dashboard-vision"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "api-openai", "providers", "observe"]

[planes]
control = "local"

[plugins.master]
default_models = []

[plugins.engine-echo]
vision_model = true

[plugins.api-control]
images_max_bytes = {MAX_BYTES}

[plugins.providers]
extensions = ["echo"]
"""
ECHO_PROVIDER = ROOT / "examples" / "extensions" / "echo-provider"


def test_an_image_picked_on_the_page_reaches_the_vision_model(dashboard: Dashboard, tmp_path: Path) -> None:
    small = tmp_path / "dot.png"
    Image.new("RGB", (24, 16), (200, 40, 90)).save(small)
    big = tmp_path / "noise.png"
    Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3)).save(big)
    assert small.stat().st_size < MAX_BYTES < big.stat().st_size
    digest = hashlib.sha256(small.read_bytes()).hexdigest()
    profile = tmp_path / "vision.toml"
    profile.write_text(PROFILE)
    ext = tmp_path / "extensions"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--quiet", "--target", str(ext)]
    installed = subprocess.run([*pip, str(ECHO_PROVIDER)], capture_output=True, text=True, timeout=240)
    assert installed.returncode == 0, installed.stderr
    path = os.pathsep.join(p for p in (str(ext), os.environ.get("PYTHONPATH", "")) if p)
    env = {**dashboard.node_env(), "PYTHONPATH": path}
    node = start_node(str(profile), "--node-name", "vision", home=tmp_path / "home", env=env)
    try:
        node.wait_api()
        for model in ("skulk/echo-vision", "skulk/echo"):
            placed = node.post("/place_instance", json={"model_id": model})
            assert placed.status_code == 200, placed.text
        for model in ("skulk/echo-vision", "skulk/echo"):
            node.wait_ready(model, 120)
        cmd = [shutil.which("node") or "node", "e2e/vision.mjs", "--url", node.url, "--out", str(dashboard.artifacts)]
        cmd += ["--image", str(small), "--big", str(big), "--vision", "skulk/echo-vision", "--text", "skulk/echo"]
        done = subprocess.run(
            cmd,
            cwd=DASHBOARD,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "CHROMIUM": str(dashboard.chromium)},
        )
        print(done.stdout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, f"vision.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        result = json.loads(lines[-1][7:])
    finally:
        node.stop()
    assert result["textModelImageControls"] == 0, result
    assert {"echo.unary@1.0.0", "echo.duplex@1.0.0"} <= set(result["capabilities"]), result["capabilities"]
    assert digest in result["answer"], (digest, result["answer"])
    assert result["attachedAfterSend"] == 0
    assert str(MAX_BYTES) in result["bigError"] and "bytes" in result["bigError"], result["bigError"]
    assert not any(result["axe"].values()), json.dumps(result["axe"], indent=1)
    assert not any(result["axeObserve"].values()), json.dumps(result["axeObserve"], indent=1)
    errors = [e for e in result["consoleErrors"] if "413" not in e]  # the refused upload is logged by Chromium
    assert not errors, errors
