"""Issue [dashboard] acceptance 1: the Models page against a loopback hub (tests/store/hub_server.py,
which speaks the hub's protocol to the store's real huggingface_hub client): search, add by
repository id, progress with speed, cancel, resume, place, chat. The browser side is
`dashboard/e2e/hub.mjs`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from skulk_testing.nodes import start_node
from skulk_transport_zenoh.secret import encode_token

from tests.store.hub_server import HubRepo, LoopbackHub

from .conftest import DASHBOARD, Dashboard

pytestmark = pytest.mark.slow

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
TOKEN = "hf_dashboardSealedToken0123456789"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROFILE = """
[profile]
name = "dashboard-hub"
plugins = ["master", "worker", "engine-llamacpp", "store", "api-control", "api-openai", "observe"]

[planes]
control = "local"

[plugins.master]
default_models = []

[plugins.engine-llamacpp]
n_threads = 1
"""


def test_search_add_cancel_resume_place_and_chat(dashboard: Dashboard, models_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import provision_smollm2

    gguf = Path(provision_smollm2(models_dir))
    readme = tmp_path / "README.md"
    readme.write_text("# SmolLM2-135M-Instruct, Q4_1 GGUF (loopback hub)\n")
    hub = LoopbackHub(throttle_bps=gguf.stat().st_size / 12)  # about 12 s: time to see progress and cancel
    hub.add(HubRepo.from_files(REPO, {GGUF: gguf, "README.md": readme}))
    profile = tmp_path / "hub.toml"
    profile.write_text(PROFILE)
    with hub:
        env = {
            "HF_ENDPOINT": "http://127.0.0.1:9",  # nothing there: the Settings page's hub_endpoint must win
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "SKULK_MODELS_DIR": str(tmp_path / "models"),
            "SKULK_JOIN_TOKEN": encode_token(os.urandom(32)),  # a cluster secret: the hub token is sealed with it
            **dashboard.node_env(),
        }
        node = start_node(str(profile), "--node-name", "hub", home=tmp_path / "home", env=env)
        try:
            node.wait_api()
            cmd = [shutil.which("node") or "node", "e2e/hub.mjs", "--url", node.url, "--out", str(dashboard.artifacts)]
            cmd += ["--query", "smollm2", "--repo", REPO, "--hub-url", hub.url, "--hub-token", TOKEN]
            done = subprocess.run(
                cmd,
                cwd=DASHBOARD,
                capture_output=True,
                text=True,
                timeout=480,
                env={**os.environ, "CHROMIUM": str(dashboard.chromium)},
            )
            print(done.stdout)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            assert done.returncode == 0 and lines, f"hub.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            result = json.loads(lines[-1][7:])
            readable = node.get("/state").text + node.get("/config").text
        finally:
            node.stop()
        sent = hub.sent_for(GGUF)
    size = gguf.stat().st_size
    assert f"hub:{REPO}" in result["hits"]
    # the hub token set on the Settings page: sent to the hub by the node, readable by no API client
    assert TOKEN in hub.tokens_seen and TOKEN not in readable
    assert any(GGUF in f and "Q4_1" in f for f in result["files"]), result["files"]
    assert "/s" in result["speed"], result
    assert "MiB" in result["completed"] and "1000 B" not in result["completed"], result
    assert result["chatModel"] == result["modelId"] and result["answer"].strip()
    # resumed, not restarted: the hub sent the file about once (a Range request picked up the rest)
    assert sent < 1.5 * size, (sent, size)
    serious = {page: found for page, found in result["axe"].items() if found}
    assert not serious, json.dumps(serious, indent=1)
    assert not result["consoleErrors"], result["consoleErrors"]
    mib = 2**20
    print(f"\nhub download {size / mib:.1f} MiB, sent {sent / mib:.1f} MiB across cancel + resume; {result['speed']}")
