"""What the split tests share: placing and clearing instances, and killing a rank mid-stream.

Each engine's split test (MLX pipeline and tensor, llama.cpp over RPC) proves the same failure story
with its own model and engine: a rank's node killed with -9 while a stream is running ends that
stream with an error within seconds, and the master fails the instance with a reason and places it
again on the nodes that are left. The story is written once here so the engines are held to the same
bar.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from skulk_testing.nodes import NodeProcess

LONG_STORY = "Tell me a very long story about the sea."


def place(node: NodeProcess, model: str, *, timeout: float = 300, **body: Any) -> dict[str, Any]:
    """Place ``model`` (``body`` adds placement fields such as ``min_nodes``) and wait until ready."""
    for _ in range(60):  # telemetry may still be gossiping right after the cluster formed
        r = node.post("/place_instance", json={"model_id": model, **body})
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    instance_id = r.json()["instance_id"]
    wanted = body.get("min_nodes", 1)
    node.wait_until(lambda: instance_id in node.ready_instances(model), timeout, f"{model} on {wanted} node(s)")
    return next(iter(node.state()["instances"][instance_id].values()))


def delete_all(node: NodeProcess) -> None:
    for instance_id in list(node.state()["instances"]):
        httpx.delete(node.url + "/instance/" + instance_id, timeout=30)
    node.wait_until(lambda: not node.state()["instances"], 60, "no instances")


def kill_mid_stream(api: NodeProcess, victim: NodeProcess, model: str, after_chunks: int = 8) -> tuple[dict, float]:
    """Stream a long answer from ``api``, kill ``victim`` after a few chunks; the error and its delay.

    Asserts that the stream was still running at the kill and that it ended with an error event
    (not a silent end, not a hang) within 5 s of it.
    """
    error, killed_at, received = None, None, 0
    body = {"model": model, "stream": True, "max_tokens": 400, "temperature": 0}
    body["messages"] = [{"role": "user", "content": LONG_STORY}]
    with httpx.stream("POST", api.url + "/v1/chat/completions", timeout=300, json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                error = data["error"]
                break
            received += 1
            if received == after_chunks:
                victim.kill()
                killed_at = time.monotonic()
        assert killed_at is not None, "the stream ended before the kill"
        gap = time.monotonic() - killed_at
    assert error is not None, "the stream ended without an error after a rank's node died"
    assert gap < 5, f"the stream took {gap:.1f}s to end after the kill"
    return error, gap


def wait_placed_again(nodes: list[NodeProcess], victim: NodeProcess, instance: dict[str, Any]) -> str:
    """Wait until the instance is failed and a new one runs on the survivors alone; the failure's reason."""
    survivors = [n for n in nodes if n is not victim]
    survivor_ids = {n.get("/node_id").json() for n in survivors}

    def placed_again() -> bool:
        state = survivors[0].state()
        failed = any(f["instanceId"] == instance["instanceId"] for f in state["instanceFailures"])
        fresh = [next(iter(w.values())) for iid, w in state["instances"].items() if iid != instance["instanceId"]]
        return failed and any(set(f["shardAssignments"]["nodeToRunner"]) <= survivor_ids for f in fresh)

    survivors[0].wait_until(placed_again, 120, "the instance to be failed and placed again on the survivors")
    failures = survivors[0].state()["instanceFailures"]
    reason = next(f["reason"] for f in failures if f["instanceId"] == instance["instanceId"])
    assert reason, "the failure has no reason"
    return reason
