"""[providers] acceptance 1 and 4: the echo provider, pip-installed, on two real node processes.

`examples/extensions/echo-provider` is pip-installed into the running environment (and uninstalled
afterwards). `skulk-kernel extensions list` lists it: `echo` loaded, `echo-raising` (its import
raises) failed and skipped, `echo-future` (built for skulk-kernel 9) refused with the reason, and
SKULK_EXTENSIONS_DISABLE=1 skips discovery. Node B loads every installed extension and advertises
its capabilities; node A names none (`extensions = []`) and discovers B's through telemetry and
GET /v1/capabilities, then calls B: unary over HTTP, bidirectional over the WebSocket. A
schema-violating payload is a typed 400; a handler that raises is a 502 and B keeps serving; a
closed socket cancels the call at B. Afterwards the event log (GET /events and the files under
each node's home) and State hold nothing of the calls (acceptance 4).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ECHO = Path(__file__).resolve().parents[2] / "examples" / "extensions" / "echo-provider"
DIST = "skulk-echo-provider"

PROFILE = """
[profile]
name = "providers-{role}"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store", "api-control",
           "api-openai", "providers"]

[planes]
control = "zenoh"

[plugins.master]
default_models = ["skulk/echo"]

[plugins.providers]
extensions = {extensions}
"""


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed_echo() -> Iterator[None]:
    if pip("show", DIST).returncode == 0:
        pip("uninstall", "-y", DIST)  # left over from an interrupted run
    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
    result = pip("install", "--no-deps", "--no-input", *isolation, str(ECHO))
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    importlib.invalidate_caches()
    try:
        yield
    finally:
        removed = pip("uninstall", "-y", DIST)
        assert removed.returncode == 0, removed.stderr
        for name in [m for m in sys.modules if m.startswith("skulk_echo_provider")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def extensions_list(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "extensions", "list", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


def by_name(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in records}


def test_extensions_list_shows_loaded_failed_and_refused(installed_echo: None) -> None:
    out = extensions_list("--json")
    assert out.returncode == 0, out.stderr
    records = by_name(json.loads(out.stdout))
    echo = records["echo"]
    assert echo["status"] == "loaded" and echo["distribution"] == DIST
    assert echo["capabilities"] == ["echo.unary@1.0.0", "echo.duplex@1.0.0"]
    assert records["echo-raising"]["status"] == "failed"
    assert "its import raises" in records["echo-raising"]["reason"]
    future = records["echo-future"]
    assert (
        future["status"] == "refused"
        and "skulk-kernel>=9,<10" in future["reason"]
        and "running 0.1" in future["reason"]
    )
    text = extensions_list()
    line = next(x for x in text.stdout.splitlines() if x.startswith("echo-future"))
    assert "refused" in line and "built for skulk-kernel>=9,<10" in line
    off = by_name(json.loads(extensions_list("--json", env={"SKULK_EXTENSIONS_DISABLE": "1"}).stdout))
    assert {r["status"] for r in off.values()} == {"disabled"} and "echo" in off


def _profile(tmp: Path, role: str, extensions: str) -> str:
    path = tmp / f"providers-{role}.toml"
    path.write_text(PROFILE.format(role=role, extensions=extensions))
    return str(path)


@pytest.fixture(scope="module")
def cluster(
    installed_echo: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    tmp = tmp_path_factory.mktemp("providers")
    env = {"SKULK_NETWORK_VERSION": f"providers-{uuid.uuid4().hex[:10]}"}
    a = start_node(_profile(tmp, "a", "[]"), "--node-name", "a", home=tmp / "a", env=env)
    b = start_node(_profile(tmp, "b", '"all"'), "--node-name", "b", home=tmp / "b", env=env)
    try:
        a.wait_api(90)
        b.wait_api(90)
        yield a, b
    finally:
        for node in (a, b):
            node.stop()


def _node_id(node: NodeProcess) -> str:
    return str(node.get("/node_id").json())


def _call(node: NodeProcess, target: str, cap: dict[str, Any], data: Any) -> Any:
    body = {"node_id": target, "capability": cap["ref"], "revision": cap["revision"], "input": data}
    return node.post("/v1/capabilities/call", json=body)


def test_echo_provider_advertised_discovered_and_called(cluster: tuple[NodeProcess, NodeProcess]) -> None:
    from websockets.sync.client import connect

    a, b = cluster
    b_id = _node_id(b)
    marker = f"marker-{uuid.uuid4().hex}"

    def discovered() -> bool:
        caps = a.get("/v1/capabilities").json()["data"]
        return any(c["node_id"] == b_id and c["id"] == "echo.duplex" for c in caps)

    a.wait_until(discovered, 60, "A to discover B's capabilities")
    tags = a.state()["nodeResources"][b_id]["capabilities"]
    assert set(tags) == {"echo.unary@1.0.0", "echo.duplex@1.0.0"}  # the telemetry tag
    per_node = a.get("/v1/capabilities", params={"node_id": b_id}).json()["data"]
    caps = {c["id"]: c for c in per_node}
    assert caps["echo.unary"]["mode"] == "unary" and caps["echo.duplex"]["mode"] == "bidirectional"
    assert caps["echo.unary"]["input_schema"]["required"] == ["text"] and len(caps["echo.unary"]["revision"]) == 16
    assert a.get("/v1/capabilities", params={"node_id": "no-such-node"}).status_code == 404

    # unary, A -> B, over HTTP
    got = _call(a, b_id, caps["echo.unary"], {"text": marker})
    assert got.status_code == 200, got.text
    assert got.json()["output"] == {"text": marker, "length": len(marker)}

    # a schema-violating payload: a typed 400 that says what is wrong
    bad = _call(a, b_id, caps["echo.unary"], {"text": 5})
    assert bad.status_code == 400 and bad.headers.get("x-should-retry") == "false"
    assert bad.json()["error"]["code"] == "invalid_input" and "text" in bad.json()["error"]["message"]
    stale = _call(a, b_id, {**caps["echo.unary"], "revision": "0" * 16}, {"text": "x"})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "revision_mismatch"
    assert a.post("/v1/capabilities/call", json={"node_id": b_id}).status_code == 400
    nowhere = _call(a, "no-such-node", caps["echo.unary"], {"text": "x"})
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "unknown_node"
    not_there = _call(a, _node_id(a), caps["echo.unary"], {"text": "x"})  # A offers nothing
    assert not_there.status_code == 404 and not_there.json()["error"]["code"] == "unknown_capability"

    # a provider that raises: a typed 502, and B keeps serving (capabilities and inference routes)
    raised = _call(a, b_id, caps["echo.unary"], {"text": "x", "fail": True})
    assert raised.status_code == 502 and raised.json()["error"]["code"] == "provider_error"
    assert "asked to fail" in raised.json()["error"]["message"]
    assert _call(a, b_id, caps["echo.unary"], {"text": "after"}).json()["output"]["text"] == "after"
    b.wait_ready("skulk/echo", 90)
    chat = {"model": "skulk/echo", "messages": [{"role": "user", "content": "still serving"}], "max_tokens": 8}
    answer = b.post("/v1/chat/completions", json=chat)
    assert answer.status_code == 200 and "still" in answer.json()["choices"][0]["message"]["content"]

    # B's own records: the broken variants skipped and refused with the reason; B serves on
    records = by_name(b.get("/v1/extensions").json()["data"])
    assert records["echo"]["status"] == "loaded"
    assert records["echo-raising"]["status"] == "failed"
    assert records["echo-future"]["status"] == "refused" and "skulk-kernel>=9,<10" in records["echo-future"]["reason"]
    assert {r["status"] for r in a.get("/v1/extensions").json()["data"]} == {"not_named"}

    # bidirectional, A -> B, over the WebSocket: outputs arrive while input still flows
    ws_url = a.url.replace("http://", "ws://") + "/v1/capabilities/stream"
    duplex = caps["echo.duplex"]
    opening = {"node_id": b_id, "capability": duplex["ref"], "revision": duplex["revision"]}
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(json.dumps(opening))
        started = json.loads(ws.recv(timeout=10))
        assert started["type"] == "started" and started["node_id"] == b_id
        for i, word in enumerate([marker, "two"], start=1):
            ws.send(json.dumps({"type": "input", "data": {"text": word}}))
            out = json.loads(ws.recv(timeout=10))
            assert out == {"type": "output", "seq": i, "data": {"text": word.upper(), "index": i}}
        ws.send(json.dumps({"type": "end"}))  # half-close: the summary still comes
        tail = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
        assert tail == [{"type": "output", "seq": 3, "data": {"text": "2 messages", "index": 3}},
                        {"type": "end", "ok": True}]  # fmt: skip

    # a schema-violating stream input: a typed error frame with its 4xx status
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(json.dumps(opening))
        assert json.loads(ws.recv(timeout=10))["type"] == "started"
        ws.send(json.dumps({"type": "input", "data": {"words": 1}}))
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["code"] == "invalid_input" and err["status"] == 400

    # a unary capability through the socket is refused with the route to use
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({**opening, "capability": caps["echo.unary"]["ref"]}))
        err = json.loads(ws.recv(timeout=10))
        assert err["code"] == "wrong_mode" and "/v1/capabilities/call" in err["message"]

    # an abandoned call (the socket closed mid-stream) is cancelled at B
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(json.dumps(opening))
        assert json.loads(ws.recv(timeout=10))["type"] == "started"
        assert b.get("/v1/extensions").json()["active_calls"] == 1
    # the socket is closed here, the call still open at B
    b.wait_until(lambda: b.get("/v1/extensions").json()["active_calls"] == 0, 15, "B to cancel the abandoned call")

    # acceptance 4: nothing of the calls in the event log or State, on either node
    for node in (a, b):
        assert marker not in json.dumps(node.get("/events", params={"limit": 100000}).json())
        assert marker not in json.dumps(node.state())
        assert "echo.duplex" not in json.dumps(node.get("/events", params={"limit": 100000}).json())
        for path in node.home.rglob("*"):
            if path.is_file() and path.name != "node.log":
                assert marker.encode() not in path.read_bytes(), f"{path} holds a provider frame"
    assert "Traceback" not in a.log() and "Traceback" not in b.log()
    started_at = time.monotonic()
    assert b.get("/node_id").status_code == 200 and time.monotonic() - started_at < 5
