"""Peer transfer between real nodes: the model crosses the (loopback) hub once.

A downloads it from the hub; the planner prefers A (files present); placed on B, B stages it by
copying from A; C (started `--offline`), asked to fetch it, copies from A and B at once; with one
flipped byte in the only remaining copy, a fourth node detects it by SHA-256 and fetches the file
again. The hub's access log shows one download until that damaged copy is the only one left.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from .conftest import GGUF, REPO, Nodes, wait
from .test_downloads import _assert_only_loopback, member_addresses


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _model_file(nodes: Nodes, name: str) -> Path:
    return nodes.tmp / name / "models" / REPO.replace("/", "--") / GGUF


def _instance_node(node, instance_id: str) -> list[str]:
    wrapped = node.state()["instances"].get(instance_id)
    if not wrapped:
        return []
    return list(next(iter(wrapped.values()))["shardAssignments"]["nodeToRunner"])


def _holders(node) -> dict[str, list[str]]:
    return {nid: r.get("modelsPresent", []) for nid, r in node.state()["nodeResources"].items()}


def test_model_crosses_the_hub_once(nodes: Nodes, smollm2_gguf: Path) -> None:
    pytest.importorskip("xllamacpp")
    want = _sha(smollm2_gguf)
    a = nodes.start("a", llama=True).wait_api()
    b = nodes.start("b", llama=True).wait_api()
    c = nodes.start("c", "--offline", llama=True).wait_api()  # offline: peers only, never the hub
    ids = {name: node.get("/node_id").json() for name, node in (("a", a), ("b", b), ("c", c))}
    wait(lambda: all(len(n.state()["topology"]["nodes"]) == 3 for n in (a, b, c)), 90, "a three-node cluster")

    assert a.post("/models/add", json={"repo_id": REPO}).status_code == 200
    wait(lambda: REPO in _holders(c).get(ids["a"], []), 120, "A's inventory (models_present) on C")
    assert nodes.hub.repos[REPO].downloads == 1

    # locality: with the files on A only, the planner places on A
    placed = a.post("/place_instance", json={"model_id": REPO}).json()
    wait(lambda: _instance_node(a, placed["instance_id"]), 30, "the first instance")
    assert _instance_node(a, placed["instance_id"]) == [ids["a"]]

    # placed on B: B copies from A, not from the hub (the worker's staging seam, ensure_local)
    on_b = a.post("/place_instance", json={"model_id": REPO, "excluded_nodes": [ids["a"], ids["c"]]}).json()
    b.wait_until(lambda: _instance_node(b, on_b["instance_id"]) == [ids["b"]], 30, "placement on B")
    b.wait_until(lambda: REPO in b.get("/store/storage").json()["models"], 240, "B's staged copy")
    assert _sha(_model_file(nodes, "b")) == want
    assert b.get("/store/transfers").json()["copied_from"][REPO] == {ids["a"]: smollm2_gguf.stat().st_size}
    assert nodes.hub.repos[REPO].downloads == 1
    for instance_id in list(a.state()["instances"]):  # the rest is about files: no re-placements
        httpx.delete(f"{a.url}/instance/{instance_id}", timeout=20)
    wait(lambda: not a.state()["instances"], 30, "instances deleted")

    # C fetches with A and B holding it: from both at once
    wait(lambda: REPO in _holders(c).get(ids["b"], []), 30, "B's inventory on C")
    assert c.post(f"/store/models/{REPO}/download").json()["status"] == "started"
    c.wait_until(lambda: _status(c).get("status") in ("installed", "failed"), 240, "C's copy")
    status = _status(c)
    assert status["status"] == "installed", status
    sources = status["sources"]
    # both asked at once; ranges go to whichever connection is free, so a source still connecting when
    # the other has moved all 98 MB over loopback gets none (seen once beside the model suites). That
    # the two share the work at wire speed is bench_store's proof (two sources 1.87-1.94x one).
    assert set(sources) == {ids["a"], ids["b"]}, sources
    assert sum(sources.values()) == smollm2_gguf.stat().st_size
    assert _sha(_model_file(nodes, "c")) == want
    assert nodes.hub.repos[REPO].downloads == 1
    _assert_only_loopback(c.pid(), member_addresses(c))  # loopback and members only

    # one flipped byte in B's copy, and B the only holder left: D detects the damage by SHA-256,
    # tries B alone once more, then fetches the file again from the hub
    with open(_model_file(nodes, "b"), "r+b") as f:
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    a.stop()
    c.stop()
    d = nodes.start("d", "--no-worker", llama=True).wait_api()
    wait(lambda: REPO in _holders(d).get(ids["b"], []), 90, "D sees B holding the model")
    wait(lambda: REPO in d.state()["customModelCards"], 60, "the card in D's State (after the failover)")
    started = d.post(f"/store/models/{REPO}/download")
    assert started.status_code == 200 and started.json()["status"] == "started", started.text
    d.wait_until(lambda: _status(d).get("status") in ("installed", "failed"), 240, "D's copy")
    status = _status(d)
    assert status["status"] == "installed", status
    assert _sha(_model_file(nodes, "d")) == want
    assert "failed SHA-256 verification" in d.log()
    assert nodes.hub.repos[REPO].downloads == 2  # the damaged peer copy was fetched again


def _status(node) -> dict:
    answer = node.get(f"/store/models/{REPO}/download")
    assert answer.status_code == 200, answer.text
    return answer.json()
