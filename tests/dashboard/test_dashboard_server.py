"""api-control's dashboard routes on a real dev node: assets, SPA fallbacks, the State push channel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from .conftest import Dashboard

HTML = {"accept": "text/html,application/xhtml+xml"}


@pytest.fixture(scope="module")
def bare_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A dev node whose dashboard folder does not exist (no Node.js on the machine, say)."""
    node = start_node(
        "dev",
        "--no-default-models",
        home=tmp_path_factory.mktemp("bare"),
        env={"SKULK_DASHBOARD_DIR": str(tmp_path_factory.mktemp("empty") / "nothing")},
    )
    try:
        yield node.wait_api()
    finally:
        node.stop()


@pytest.fixture(scope="module")
def built_node(dashboard: Dashboard, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = start_node("dev", "--no-default-models", home=tmp_path_factory.mktemp("built"), env=dashboard.node_env())
    try:
        yield node.wait_api()
    finally:
        node.stop()


def test_without_assets_root_says_how_to_build_and_the_api_works(bare_node: NodeProcess) -> None:
    page = bare_node.get("/", headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "cd dashboard &amp;&amp; npm ci &amp;&amp; npm run build" in page.text and "./skulk run" in page.text
    assert bare_node.get("/ui/chat", headers=HTML).status_code == 200
    assert bare_node.get("/state").json()["topology"]["nodes"]
    assert bare_node.get("/models").json()["data"]


def test_assets_spa_fallbacks_and_api_routes_are_not_shadowed(built_node: NodeProcess, dashboard: Dashboard) -> None:
    index = (dashboard.dist / "index.html").read_text()
    for path in ("/", "/ui", "/ui/topology", "/ui/models", "/ui/chat", "/ui/instances", "/ui/keys", "/ui/settings"):
        response = built_node.get(path, headers=HTML)
        assert response.status_code == 200 and response.text == index, path
    script = next((dashboard.dist / "assets").glob("*.js"))
    asset = built_node.get(f"/ui/assets/{script.name}")
    assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    assert "immutable" in asset.headers["cache-control"]
    assert built_node.get("/ui/assets/missing.js").status_code == 404
    assert built_node.get("/ui/..%2f..%2fpyproject.toml").status_code == 404
    # the API paths a page might be confused with still answer JSON
    assert built_node.get("/models", headers=HTML).json()["data"]
    assert "instances" in built_node.get("/state", headers=HTML).json()
    assert built_node.get("/instance/nope").status_code == 404


def _messages(response: httpx.Response) -> Iterator[dict]:
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "state":
            yield json.loads(line[6:])


def test_push_channel_sends_state_on_change_and_on_a_tick(bare_node: NodeProcess) -> None:
    with httpx.stream("GET", bare_node.url + "/v1/events/stream", timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = _messages(response)
        first = next(messages)
        assert first["reason"] == "initial"
        assert first["state"]["topology"]["nodes"] == [first["observerNodeId"]]
        assert first["liveness"][first["observerNodeId"]]["reachable"] is True
        assert set(first["state"]) >= {"instances", "runners", "nodeHealth", "nodeMemory", "downloadProgress"}
        started = time.monotonic()
        wanted = not first["state"]["tracingEnabled"]
        assert httpx.put(bare_node.url + "/v1/tracing", json={"enabled": wanted}, timeout=10).status_code == 200
        changed = next(m for m in messages if m["state"]["tracingEnabled"] == wanted)
        assert changed["reason"] == "change" and time.monotonic() - started < 1.5
        tick = next(m for m in messages if m["reason"] == "tick")
        assert tick["seq"] > changed["seq"]
