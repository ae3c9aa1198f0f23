"""The store host role between real node processes on one host (the bundled `store-host` profile
and a llama.cpp worker with a staging budget of one and a half models).

The host downloads the models once from the loopback hub; the worker stages each by hard link (the
same inode, no byte over the network) and serves it; staging past the budget evicts the least
recently used copy that no instance uses and never the one in use; purge-staging removes the
unused copies and reports the bytes; a download cancelled on the host stops mid-file and, when the
worker asks for that model, the host resumes it and the worker stages it; deleting the model on
the host leaves the worker's staged copy serving.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from skulk_testing.nodes import start_node

from .conftest import GGUF, LLAMA, MEMBER, REPO, Nodes, wait
from .hub_server import HubRepo

REPO_B = "test-org/SmolLM2-copy-b"
REPO_C = "test-org/SmolLM2-copy-c"
REPO_D = "test-org/SmolLM2-copy-d"


def _worker_profile(nodes: Nodes, budget: int) -> Path:
    text = MEMBER.replace('"engine-echo"', '"engine-llamacpp"').replace('"api-control"', '"api-control", "api-openai"')
    path = nodes.tmp / "staging-worker.toml"
    path.write_text(text + LLAMA + f"\n[plugins.store]\nstaging_budget_bytes = {budget}\n")
    return path


def _file(nodes: Nodes, name: str, repo: str) -> Path:
    return nodes.tmp / name / "models" / repo.replace("/", "--") / GGUF


def _storage(node) -> dict:
    answer = node.get("/store/storage")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _stage(node, model_id: str) -> dict:
    started = node.post(f"/store/models/{model_id}/download")
    assert started.status_code == 200, started.text
    node.wait_until(lambda: _status(node, model_id) in ("installed", "failed"), 120, f"staging {model_id}")
    status = node.get(f"/store/models/{model_id}/download").json()
    assert status["status"] == "installed", status
    return _storage(node)


def _status(node, model_id: str) -> str:
    return str(node.get(f"/store/models/{model_id}/download").json().get("status"))


def _chat(node, model_id: str) -> str:
    body = {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    answer = httpx.post(f"{node.url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def test_store_host_staging_eviction_purge_cancel_and_delete(nodes: Nodes, smollm2_gguf: Path) -> None:
    pytest.importorskip("xllamacpp")
    size = smollm2_gguf.stat().st_size
    for repo in (REPO_B, REPO_C, REPO_D):
        nodes.hub.add(HubRepo.from_files(repo, {GGUF: smollm2_gguf}))
    host = start_node("store-host", "--node-name", "host", home=nodes.tmp / "host" / "home", env=nodes.env("host"))
    nodes.started.append(host)
    host.wait_api()
    worker = start_node(
        str(_worker_profile(nodes, budget=int(size * 1.5))),
        "--node-name",
        "worker",
        home=nodes.tmp / "worker" / "home",
        env=nodes.env("worker"),
    )
    nodes.started.append(worker)
    worker.wait_api()
    ids = {"host": host.get("/node_id").json(), "worker": worker.get("/node_id").json()}
    wait(lambda: all(len(n.state()["topology"]["nodes"]) == 2 for n in (host, worker)), 90, "a two-node cluster")
    assert _storage(host)["role"] == "host" and _storage(worker)["role"] == "worker"

    # the host fetches the canonical copies (once each); every node sees its registry
    for repo in (REPO, REPO_B, REPO_C):
        added = host.post("/models/add", json={"repo_id": repo})
        assert added.status_code == 200 and added.json()["download"] == "started", added.text

    def registry_lists(*repos: str) -> bool:
        hosts = worker.get("/store/registry").json()["hosts"]
        return set(repos) <= set(hosts.get(ids["host"], {}).get("models", {}))

    wait(lambda: registry_lists(REPO, REPO_B, REPO_C), 180, "the host's registry on the worker")
    assert worker.get("/store/registry").json()["hosts"][ids["host"]]["reachable"] is True
    assert all(nodes.hub.repos[r].downloads == 1 for r in (REPO, REPO_B, REPO_C))

    # staged by hard link: the same inode, one more link, nothing over the network
    copies = _stage(worker, REPO_B)["staging"]["copies"]
    assert copies[REPO_B]["how"] == "hardlink" and copies[REPO_B]["source"] == ids["host"]
    canonical_b = _file(nodes, "host", REPO_B)
    assert _file(nodes, "worker", REPO_B).stat().st_ino == canonical_b.stat().st_ino
    assert canonical_b.stat().st_nlink == 2

    # C does not fit beside B (budget 1.5 models): B, the least recently used, goes
    storage = _stage(worker, REPO_C)
    assert set(storage["staging"]["copies"]) == {REPO_C} and REPO_B not in storage["models"]
    assert canonical_b.stat().st_nlink == 1 and canonical_b.exists()  # the canonical copy stays

    # placed on the worker: staged by hard link (evicting C) and served
    placed = worker.post("/place_instance", json={"model_id": REPO})
    assert placed.status_code == 200, placed.text
    worker.wait_until(lambda: REPO in _storage(worker)["models"], 120, "the placed model staged")
    assert _file(nodes, "worker", REPO).stat().st_ino == _file(nodes, "host", REPO).stat().st_ino
    wait(lambda: _chat(worker, REPO), 120, "a chat answer from the staged model", interval=1.0)
    storage = _storage(worker)
    assert set(storage["staging"]["copies"]) == {REPO} and storage["models"][REPO]["in_use"]
    transfers = host.get("/store/transfers").json()
    assert transfers["served_to"] == {} and worker.get("/store/transfers").json()["copied_from"] == {}

    # B again while the instance uses the model: the model in use is never evicted (over budget)
    storage = _stage(worker, REPO_B)
    assert set(storage["staging"]["copies"]) == {REPO, REPO_B} and storage["staging"]["over_budget"]

    # purge: the unused copy goes, the one in use stays; bytes reported
    purged = worker.post("/store/purge-staging").json()
    assert purged["purged"] == [REPO_B] and purged["kept_in_use"] == [REPO]
    assert purged["bytes_freed"] >= size and purged["disk_bytes_freed"] == 0  # hard links: the host keeps the bytes
    assert set(_storage(worker)["staging"]["copies"]) == {REPO}
    assert host.post("/store/purge-staging").status_code == 400  # a host holds no staging
    wait(lambda: set(worker.get("/store/registry").json()["staged"].get(ids["worker"], {})) == {REPO}, 30, "staged")

    # a download cancelled through /store stops mid-file ...
    nodes.hub.throttle_bps = 15e6
    assert host.post("/models/add", json={"repo_id": REPO_D}).json()["download"] == "started"
    sent = lambda: nodes.hub.bytes_sent[f"{REPO_D}/{GGUF}"]  # noqa: E731
    wait(lambda: sent() > 10_000_000, 60, "the first bytes of D")
    cancelled = httpx.delete(f"{host.url}/store/models/{REPO_D}/download", timeout=10)
    assert cancelled.status_code == 200, cancelled.text
    host.wait_until(lambda: _status(host, REPO_D) == "cancelled", 30, "the cancel")
    time.sleep(1.0)  # the hub's sender notices the closed connection
    stopped_at = sent()
    time.sleep(1.5)
    assert sent() - stopped_at <= 256 * 1024 and stopped_at < size  # nothing more crosses (15 MB/s before)
    assert httpx.delete(f"{host.url}/store/models/{REPO_D}/download", timeout=10).status_code == 404

    # ... and the worker asking for it makes the host resume it (the partial bytes kept), then stage it
    nodes.hub.throttle_bps = 0
    copies = _stage(worker, REPO_D)["staging"]["copies"]
    staging_lines = [line for line in worker.log().splitlines() if "skulk.store" in line and "progress" not in line]
    assert REPO_D in copies, "\n".join(staging_lines[-30:])  # not fetched from the hub by the worker itself
    assert copies[REPO_D]["how"] == "hardlink"
    assert sent() < 1.2 * size and nodes.hub.repos[REPO_D].downloads == 1
    assert _file(nodes, "worker", REPO_D).stat().st_ino == _file(nodes, "host", REPO_D).stat().st_ino

    # deleting the model on the host: gone from its registry; the worker's staged copy still serves
    deleted = httpx.delete(f"{host.url}/store/models/{REPO}", timeout=20)
    assert deleted.status_code == 200, deleted.text
    assert not _file(nodes, "host", REPO).exists()
    wait(lambda: not registry_lists(REPO) and registry_lists(REPO_D), 30, "the registry without the deleted model")
    assert _file(nodes, "worker", REPO).stat().st_nlink == 1
    assert _chat(worker, REPO)
