"""Issue [answers] acceptance 1 and 2: every control route answers with the master's outcome.

Real node processes over Zenoh with the bully election; a real `kill -9` of the master. Right after
start (the API answers before any master is elected) and while the master is being replaced, each
control route answers a definite result: success once the master has indexed the command, or a
4xx/503 that says why; never a 500 or a traceback, and never a doubled effect. A refused command
carries the master's own reason to the HTTP client.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from skulk_testing.nodes import NodeProcess

from .conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROFILE = """
[profile]
name = "outcomes-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store", "observe",
           "api-control", "api-openai"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []
node_timeout_s = 6
"""


def model_folder(models: Path, name: str) -> Path:
    """A Hugging Face style folder the store can card from its config.json alone."""
    folder = models / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 128}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_cluster(tmp: Path) -> Cluster:
    profile = tmp / "outcomes.toml"
    profile.write_text(PROFILE)
    models = tmp / "models"
    models.mkdir(exist_ok=True)
    return Cluster(tmp, profile, f"o{uuid.uuid4().hex[:10]}", {"SKULK_MODELS_DIR": str(models)})


def definite(response: httpx.Response, what: str) -> dict[str, Any]:
    """A success, or a 4xx/503 whose JSON says why; anything else fails the test."""
    assert response.status_code != 500 and response.status_code < 600, f"{what}: {response.status_code} {response.text}"
    body = response.json()
    if response.status_code != 200:
        assert response.status_code in (400, 403, 404, 409, 503), f"{what}: {response.status_code} {response.text}"
        assert body["error"]["message"], f"{what}: an error without a message: {body}"
    return body


def control_calls(node: NodeProcess, models: Path, tag: str) -> dict[str, httpx.Response]:
    """The control routes of the acceptance, sent at once from threads; the instance is deleted after."""
    calls = {
        "tracing": lambda: httpx.put(node.url + "/v1/tracing", json={"enabled": True}, timeout=30),
        "config": lambda: httpx.put(node.url + "/config", json={"log_level": "INFO"}, timeout=30),
        "models/add": lambda: httpx.post(
            node.url + "/models/add",
            json={"path": str(model_folder(models, f"m-{tag}")), "model_id": f"test/{tag}"},
            timeout=30,
        ),
        "place": lambda: httpx.post(node.url + "/place_instance", json={"model_id": "skulk/echo"}, timeout=30),
    }
    answers: dict[str, httpx.Response] = {}

    def run(name: str) -> None:
        answers[name] = calls[name]()

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    placed = answers["place"]
    if placed.status_code == 200:
        answers["delete"] = httpx.delete(f"{node.url}/instance/{placed.json()['instance_id']}", timeout=30)
    return answers


def created_events(node: NodeProcess, instance_id: str) -> int:
    events = node.get("/events", params={"limit": 2000}).json()["events"]
    return sum(1 for e in events if "InstanceCreated" in (text := json.dumps(e)) and instance_id in text)


def no_route_failures(*nodes: NodeProcess, tracebacks: bool = True) -> None:
    """No request failed inside the HTTP server (and, unless a kill is expected to cause some, no traceback)."""
    for node in nodes:
        log = node.log()
        assert "Exception in ASGI application" not in log, log[-3000:]
        assert not tracebacks or "Traceback" not in log, log[-3000:]


def test_control_routes_answer_from_the_first_second(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path)
    try:
        node = cluster.start()
        node.wait_until(lambda: node.get("/node_id", timeout=1).status_code == 200, 60, "the API")
        first = node.get("/v1/diagnostics/node").json()["runtime"]
        answers = control_calls(node, tmp_path / "models", "early")
        for name, response in answers.items():
            body = definite(response, name)
            assert response.status_code == 200, f"{name} right after start: {response.status_code} {body}"
        state = node.state()
        assert state["tracingEnabled"] is True
        assert "test/early" in state["customModelCards"]
        placed = answers["place"].json()["instance_id"]
        assert placed not in state["instances"]  # deleted: the delete answered after the master indexed it
        assert created_events(node, placed) == 1  # sent again while the session began, placed once
        no_route_failures(node)
        print(f"API up with master {first['masterNodeId']!r}; every route answered 200")
    finally:
        cluster.stop()


def test_refusals_carry_the_masters_reason_and_failover_answers_definitely(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path)
    try:
        for _ in range(3):
            cluster.start()
        master_id, _ = cluster.wait_agreed(90)
        master = cluster.by_id(master_id)
        follower = next(n for n in cluster.alive() if n is not master)

        # acceptance 2: an unknown model and an impossible placement, refused by the master, say so unchanged
        unknown = follower.post("/place_instance", json={"model_id": "nobody/nothing-here"})
        wide = follower.post("/place_instance", json={"model_id": "skulk/echo", "min_nodes": 7})
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_model", unknown.text
        assert wide.status_code in (400, 503), wide.text
        for refused in (unknown, wide):
            reason = refused.json()["error"]["message"]
            master.wait_until(lambda r=reason: r in master.log(), 10, "the master's log line with the reason")
            assert f"failed: {reason}" in master.log(), (reason, master.log()[-2000:])

        # acceptance 1 during failover: kill -9 the master, then at once every route through a follower
        master.kill()
        answers = control_calls(follower, tmp_path / "models", "failover")
        for name, response in answers.items():
            definite(response, name)
        survivors = cluster.alive()
        cluster.wait_agreed(60, survivors)
        state = follower.state()
        if answers["tracing"].status_code == 200:
            assert state["tracingEnabled"] is True
        if answers["models/add"].status_code == 200:
            assert "test/failover" in state["customModelCards"]
        if answers["place"].status_code == 200:
            placed = answers["place"].json()["instance_id"]
            assert created_events(follower, placed) <= 1, "the placement was indexed twice"
            if answers["delete"].status_code == 200:
                assert placed not in state["instances"]
        statuses = {name: r.status_code for name, r in answers.items()}
        print(f"during failover: {statuses}")
        no_route_failures(*survivors, tracebacks=False)
    finally:
        cluster.stop()
