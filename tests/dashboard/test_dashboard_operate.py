"""Issue [dashboard] acceptance 3, 4 and 5: the Keys, Observe and Integrations pages against two real
nodes (Zenoh on loopback, llama.cpp serving SmolLM2 on the second node only, so a chat sent to the
first crosses both).

The browser side is `dashboard/e2e/operate.mjs`: browser A on loopback (no key), browser B on the
machine's LAN address (the node asks it for a key). Screenshots of every page in both themes land in
tests/dashboard/artifacts/.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.conftest import CHAT_MODEL

from .conftest import DASHBOARD, Dashboard

pytestmark = pytest.mark.slow

PROFILE = """
[profile]
name = "dashboard-operate"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-llamacpp", "store",
           "api-control", "api-openai", "api-anthropic", "observe"]

[planes]
control = "zenoh"
telemetry = "zenoh"
data = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false

[plugins.engine-llamacpp]
n_threads = 1
"""


def lan_address() -> str | None:
    """This machine's own non-loopback address: a browser that uses it is not on loopback to the node."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def operate(dashboard: Dashboard, timeout: float, **options: str) -> dict:
    """Run e2e/operate.mjs; its last `RESULT {json}` line."""
    cmd = [shutil.which("node") or "node", "e2e/operate.mjs", "--out", str(dashboard.artifacts)]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    env = {**os.environ, "CHROMIUM": str(dashboard.chromium)}
    done = subprocess.run(cmd, cwd=DASHBOARD, capture_output=True, text=True, timeout=timeout, env=env)
    print(done.stdout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"operate.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return dict(json.loads(lines[-1][7:]))


def test_keys_integrations_and_traces(dashboard: Dashboard, models_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    pytest.importorskip("openai")
    lan = lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address to reach the node from 'another host'")
    profile = tmp_path / "operate.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_NETWORK_VERSION": f"o{uuid.uuid4().hex[:10]}", "SKULK_MODELS_DIR": str(models_dir)}
    env.update(dashboard.node_env())
    # every address: browser A comes through loopback, browser B through the LAN address
    left = start_node(str(profile), "--node-name", "left", "--api-host", "0.0.0.0", home=tmp_path / "left", env=env)
    nodes: list[NodeProcess] = [left]
    try:
        left.wait_api()
        left.wait_until(
            lambda: left.get("/v1/diagnostics/node").json()["transports"]["control"]["listen"], 20, "listen locators"
        )
        port = left.get("/v1/diagnostics/node").json()["transports"]["control"]["listen"][0].rsplit(":", 1)[1]
        right = start_node(
            str(profile),
            "--node-name",
            "right",
            "--bootstrap-peers",
            f"tcp/127.0.0.1:{port}",
            home=tmp_path / "right",
            env=env,
        )
        nodes.append(right)
        right.wait_api()
        left_id = left.get("/node_id").json()
        left.wait_until(lambda: len(left.state()["topology"]["nodes"]) == 2, 60, "both nodes in the topology")
        placed = left.post("/place_instance", json={"model_id": CHAT_MODEL, "excluded_nodes": [left_id]})
        assert placed.status_code == 200, placed.text
        left.wait_ready(CHAT_MODEL, timeout=300)
        started = time.monotonic()
        result = operate(
            dashboard,
            timeout=420,
            url=left.url,
            lan_url=left.url.replace("127.0.0.1", lan),
            model=CHAT_MODEL,
            python=sys.executable,
            nodes="2",
            right_url=right.url,
        )
        elapsed = time.monotonic() - started
        keys_after = left.get("/v1/keys").json()["keys"]
        right_level = right.get("/v1/diagnostics/node").json()["observe"]["logLevel"]  # in force, not only stored
    finally:
        for n in nodes:
            n.stop()
    # acceptance 3: a key made on the Keys page signs another browser in; revoking it signs it out
    assert result["bScope"] == "operator" and "#key=" not in result["bUrlAfter"]
    assert "browser-b" in result["keyRow"] and "100,000" in result["keyRow"], result["keyRow"]
    assert "revoked" in result["bError"], result["bError"]
    assert result["revokeToSignInS"] < 10, result
    assert result["keyId"] not in {k["id"] for k in keys_after}
    # acceptance 5: the ready model with its context, at the address browser B used; the snippet works
    assert result["servedModels"] == 1 and result["servedContext"] > 0
    assert result["baseUrl"] == left.url.replace("127.0.0.1", lan)
    clients = {"openai-python", "anthropic-python", "ollama", "open-webui", "continue", "aider", "llm", "claude-code"}
    assert clients <= set(result["snippets"])
    run = result["snippetRun"]
    assert run["rc"] == 0 and run["stdout"].strip(), run
    # acceptance 4: the traced chat request's waterfall holds spans from both nodes
    assert result["answer"].strip()
    assert result["traceNodes"] == 2, result["spans"]
    assert len({s["node"] for s in result["spans"]}) == 2
    assert result["healthRows"] == 2 and result["tracingOffShown"]
    assert result["timelineEntries"] > 0
    assert not result["consoleErrors"], result["consoleErrors"]
    # acceptance 2 (in part): the node's own validation message on the page; a placement default and
    # the log level set on the left node's Settings page are in force on the right node within 2 s
    assert "trace_ttl_s must be a positive number" in result["settingError"], result["settingError"]
    assert 2048 not in result["contextOnRightBefore"]
    assert result["contextOnRightAfter"] and set(result["contextOnRightAfter"]) == {2048}, result
    assert result["rightConfig"]["log_level"] == "DEBUG" and result["settingToRightMs"] < 2000, result
    assert right_level == "DEBUG", f"the log level set on the left node's page is {right_level} on the right node"
    # acceptance 7: axe-core finds no serious or critical violation on any page, in either theme
    serious = {page: found for page, found in result["axe"].items() if found}
    assert len(result["axe"]) == 20 and not serious, json.dumps(serious, indent=1)
    assert len(result["screenshots"]) == 20 and all(Path(p).stat().st_size > 10_000 for p in result["screenshots"])
    print(
        f"\ntracing toggle click -> page {result['tracingClickToPageMs']} ms; revoke -> B signed out "
        f"{result['revokeToSignInS']:.1f} s; snippet answered in {run['s']:.1f} s: {run['stdout'].strip()[:80]!r}; "
        f"{len(result['spans'])} spans; scenario {elapsed:.0f} s"
    )
