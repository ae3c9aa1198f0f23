"""The steward on real node processes with the echo engine (the model does not matter here):
exactly one steward, re-placed after kill -9 of its node, hidden from user model lists; proposals
run once only after an approval; no placeable card answers 503 with the reason."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = pytest.mark.slow

PROFILE = """
[profile]
name = "steward-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai", "api-anthropic", "api-ollama", "steward"]

[planes]
control = "zenoh"

[plugins.master]
default_models = {default_models}
node_timeout_s = 30

[plugins.steward]
models = {models}
proposal_ttl_s = {ttl}
canary_interval_s = 2
"""


def _profile(tmp: Path, models: list[str], default_models: list[str], ttl: float = 600) -> Path:
    path = tmp / f"steward-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(
        PROFILE.format(
            models=repr(models).replace("'", '"'), default_models=repr(default_models).replace("'", '"'), ttl=ttl
        )
    )
    return path


def _nodes(tmp: Path, profile: Path, count: int) -> list[NodeProcess]:
    version = f"steward-{uuid.uuid4().hex[:10]}"
    return [
        start_node(str(profile), "--node-name", f"n{i}", home=tmp / f"n{i}", env={"SKULK_NETWORK_VERSION": version})
        for i in range(count)
    ]


def stewards(node: NodeProcess) -> list[dict[str, Any]]:
    out = []
    for inst in node.state()["instances"].values():
        body = next(iter(inst.values()))
        if body.get("systemRole") == "steward":
            out.append(body)
    return out


def wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def ready_steward(node: NodeProcess) -> dict[str, Any] | None:
    status = node.get("/v1/steward").json()
    return status if status["ready"] else None


def test_one_steward_replaced_after_kill_and_hidden_and_proposals(tmp_path: Path) -> None:
    profile = _profile(tmp_path, ["skulk/echo"], ["skulk/echo"], ttl=6)
    nodes = _nodes(tmp_path, profile, 2)
    try:
        for n in nodes:
            n.wait_api(60)
        wait(lambda: all(len(n.state()["topology"]["nodes"]) == 2 for n in nodes), 60, "two nodes")
        status = wait(lambda: ready_steward(nodes[0]), 60, "a ready steward")
        assert len(stewards(nodes[0])) == 1 and status["model"] == "skulk/echo"
        # hidden from user model lists: the steward is no model there, nor a running user instance
        for n in nodes:
            listed = [m["id"] for m in n.get("/v1/models").json()["data"]]
            assert "skulk/steward" not in listed
            running = [m["model"] for m in n.get("/api/ps").json()["models"]]
            assert running.count("skulk/echo") <= 1  # the user's echo instance only
        # the canary ran and is shown
        canary = wait(lambda: nodes[1].get("/v1/steward").json()["canary"], 30, "a canary")
        assert canary["ok"] and canary["latencyS"] > 0

        # --- proposals: nothing until approved, once when approved, refused when used or expired
        user = next(
            iid
            for iid, inst in nodes[0].state()["instances"].items()
            if next(iter(inst.values())).get("systemRole") is None
        )
        made = nodes[1].post("/v1/steward/proposals", json={"action": {"kind": "delete_instance", "instance_id": user}})
        assert made.status_code == 201, made.text
        pid = made.json()["id"]
        wait(lambda: any(p["id"] == pid for p in nodes[0].get("/v1/steward").json()["proposals"]), 10, "replication")
        assert "steward" in nodes[0].state()["pluginData"]
        time.sleep(1.5)
        assert user in nodes[0].state()["instances"]  # not approved: nothing happened
        approved = nodes[0].post(f"/v1/steward/proposals/{pid}/approve")
        assert approved.status_code == 200, approved.text
        wait(lambda: user not in nodes[1].state()["instances"], 15, "the approved delete")
        done = wait(
            lambda: (
                next(p for p in nodes[1].get("/v1/steward").json()["proposals"] if p["id"] == pid)["status"] == "done"
            ),
            15,
            "the outcome",
        )
        assert done
        again = nodes[1].post(f"/v1/steward/proposals/{pid}/approve")
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"
        steward_id = stewards(nodes[0])[0]["instanceId"]
        refused = nodes[0].post(
            "/v1/steward/proposals", json={"action": {"kind": "delete_instance", "instance_id": steward_id}}
        )
        assert refused.status_code == 400
        late = nodes[0].post(
            "/v1/steward/proposals", json={"action": {"kind": "place_instance", "model_id": "skulk/echo"}}
        )
        late_id = late.json()["id"]
        time.sleep(6.5)
        expired = nodes[0].post(f"/v1/steward/proposals/{late_id}/approve")
        assert expired.status_code in (409, 410), expired.text  # 410 before the master marks it, 409 after
        wait(
            lambda: (
                next(p for p in nodes[0].get("/v1/steward").json()["proposals"] if p["id"] == late_id)["status"]
                == "expired"
            ),
            10,
            "the expiry",
        )

        # --- kill -9 the steward's node: the steward runs on the survivor
        holder = stewards(nodes[0])[0]["shardAssignments"]["nodeToRunner"]
        (holder_id,) = holder
        victim = next(n for n in nodes if n.get("/node_id").json() == holder_id)
        survivor = next(n for n in nodes if n is not victim)
        killed = time.monotonic()
        victim.kill()
        wait(
            lambda: (s := ready_steward(survivor)) is not None and s["nodeIds"] != [holder_id],
            45,
            "the steward on the survivor",
        )
        took = time.monotonic() - killed
        print(f"steward back on the survivor {took:.1f}s after kill -9")
        assert len(stewards(survivor)) == 1
    finally:
        for n in nodes:
            n.stop()


def test_no_node_can_hold_a_steward_answers_503_with_the_reason(tmp_path: Path) -> None:
    profile = _profile(tmp_path, ["nobody/absent-model"], ["skulk/echo"])
    (node,) = _nodes(tmp_path, profile, 1)
    try:
        node.wait_api(60)
        node.wait_ready("skulk/echo", 60)
        body = {"model": "skulk/steward", "messages": [{"role": "user", "content": "hi"}]}
        answer = node.post("/v1/chat/completions", json=body)
        assert answer.status_code == 503
        assert "nobody/absent-model: not in the catalog" in answer.json()["error"]["message"]
        anthropic = node.post("/v1/messages", json={**body, "max_tokens": 16})
        assert anthropic.status_code == 503 and anthropic.json()["type"] == "error"
        status = node.get("/v1/steward").json()
        assert status["status"] == "unplaceable" and "no node can hold" in status["reason"]
        assert node.post("/v1/chat/completions", json={**body, "model": "skulk/echo"}).status_code == 200
    finally:
        node.stop()
