"""GET /health: 200 when the node serves, 503 with every reason when it cannot (health.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from skulk_api_control.health import add_health_routes, health_body
from skulk_kernel.api import State
from skulk_kernel.state import Topology


def fake_node(master: str | None = "m", members: tuple[str, ...] = ("n1",), **extra: Any) -> Any:
    state = State().model_copy(update={"topology": Topology(nodes=members)})
    return SimpleNamespace(node_id="n1", master_id=master, state=state, stopping=False, health_notes={}, **extra)


def test_joined_node_with_a_master_serves() -> None:
    status, body = health_body(fake_node())
    assert status == 200
    assert body["status"] == "ok" and body["masterNodeId"] == "m" and "reasons" not in body


def test_no_master_is_503() -> None:
    status, body = health_body(fake_node(master=None))
    assert status == 503
    assert [r["code"] for r in body["reasons"]] == ["no_master"]


def test_not_in_the_topology_yet_is_503() -> None:
    status, body = health_body(fake_node(members=("other",)))
    assert status == 503 and body["reasons"][0]["code"] == "not_joined"


def test_only_blocking_notes_block() -> None:
    node = fake_node()
    node.health_notes = {"store": {"low_disk": "3% free"}}
    assert health_body(node)[0] == 200  # informational: the node still serves
    node.health_notes["engine-x"] = {"blocks_serving_gpu": "the GPU fell off the bus"}
    status, body = health_body(node)
    assert status == 503
    assert body["reasons"] == [{"code": "blocks_serving_gpu", "message": "engine-x: the GPU fell off the bus"}]
    assert body["notes"]["store"] == {"low_disk": "3% free"}


def test_routes_answer_get_and_head_on_both_paths() -> None:
    app = FastAPI()
    node = fake_node(master=None)
    add_health_routes(app, node)
    client = TestClient(app)
    for path in ("/health", "/v1/health"):
        assert client.get(path).status_code == 503
        assert client.head(path).status_code == 503
    node.master_id = "m"
    assert client.get("/health").json()["status"] == "ok"
