"""Downloads through huggingface_hub against a loopback hub: add by repository id (pinned to a
commit), progress in /state and the log, resume after kill -9, search, add-card, refusals, and an
offline node that never reaches the hub."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from .conftest import GGUF, REPO, Nodes, wait


def _installed(node, model_id: str) -> bool:
    entry = next((m for m in node.get("/models").json()["data"] if m["id"] == model_id), None)
    return bool(entry and entry["installed"])


def test_add_by_repo_id_downloads_with_progress_and_resumes_after_kill(nodes: Nodes, smollm2_gguf: Path) -> None:
    size = smollm2_gguf.stat().st_size
    nodes.hub.throttle_bps = 12e6  # ~8 s for the file: room to kill it midway
    node = nodes.start("a").wait_api()
    answer = node.post("/models/add", json={"repo_id": REPO})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    commit = nodes.hub.repos[REPO].commit
    assert body["revision"] == commit and body["download"] == "started"
    card = node.get("/state").json()["customModelCards"][REPO]
    assert card["sections"]["source"]["revision"] == commit  # pinned, never "main"
    assert card["nLayers"] == 30 and card["storageSize"] == size  # built from the GGUF header alone

    def progress() -> dict | None:
        seen = node.state()["downloadProgress"]
        reading = next(iter(seen.values()), None)
        return reading if reading and 0.25 * size < reading["downloadedBytes"] < 0.8 * size else None

    reading = wait(progress, 60, "download progress past a quarter")
    assert reading["totalBytes"] == size and GGUF in reading["phase"]  # per-file bytes in the phase
    assert "downloading " + REPO in node.log()  # the CLI log's progress line
    node.kill()  # kill -9 mid download
    node.proc.wait(10)
    before_restart = nodes.hub.sent_for(GGUF)
    assert before_restart < size

    nodes.hub.throttle_bps = 0
    again = nodes.start("a").wait_api()
    again.wait_until(lambda: _installed(again, REPO), 120, "the resumed download to finish")
    fetched = nodes.hub.sent_for(GGUF)
    assert fetched < 1.2 * size, f"resume fetched {fetched} bytes for a {size}-byte file"
    assert nodes.hub.repos[REPO].downloads == 1  # one full GET, then a range GET
    assert any("resuming the interrupted download" in line for line in again.log().splitlines())
    installed = Path(nodes.tmp / "a" / "models" / REPO.replace("/", "--") / GGUF)
    assert installed.stat().st_size == size


def test_refusals_search_and_add_card(nodes: Nodes, tmp_path: Path) -> None:
    node = nodes.start("a", HF_TOKEN="hf_secret_token_xyz").wait_api()
    bad_rev = node.post("/models/add", json={"repo_id": REPO, "revision": "nope"})
    assert bad_rev.status_code == 400 and "revision" in bad_rev.json()["error"]["message"]
    missing = node.post("/models/add", json={"repo_id": "test-org/absent"})
    assert missing.status_code == 400 and "no such repository" in missing.json()["error"]["message"]
    not_id = node.post("/models/add", json={"repo_id": "not a repo"})
    assert not_id.status_code == 400
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    refused = node.post("/models/add", json={"path": str(outside)})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "path_outside_model_dirs"

    commit = nodes.hub.repos[REPO].commit
    pinned = node.post("/models/add", json={"repo_id": REPO, "revision": commit, "download": False})
    assert pinned.status_code == 200 and pinned.json()["revision"] == commit
    assert nodes.hub.tokens_seen and set(nodes.hub.tokens_seen) == {"hf_secret_token_xyz"}  # HF_TOKEN honoured

    found = node.get("/models/search", params={"q": "smollm2"}).json()["data"]
    sources = {(m["id"], m["source"]) for m in found}
    assert (REPO, "catalog") in sources  # the card just added
    assert ("HuggingFaceTB/SmolLM2-135M-Instruct", "catalog") in sources  # a bundled card
    assert node.get("/models/search").status_code == 400

    card = {"model_id": "acme/tiny", "n_layers": 2, "hidden_size": 64, "storage_size": 1000}
    unpinned = {**card, "source": {"kind": "hub", "repo_id": "acme/tiny", "revision": "main"}}
    assert node.post("/models/add-card", json={"card": unpinned}).json()["error"]["code"] == "unpinned_revision"
    assert node.post("/models/add-card", json={"card": {"n_layers": 2}}).status_code == 400
    ok = node.post("/models/add-card", json={"card": card})
    assert ok.status_code == 200, ok.text
    assert "acme/tiny" in node.state()["customModelCards"]

    # no API returns the token
    for path in ("/state", "/models", "/v1/diagnostics/node", "/models/search?q=smol"):
        assert "hf_secret_token_xyz" not in node.get(path).text, path


def test_offline_node_never_reaches_the_hub_and_serves_what_it_has(nodes: Nodes) -> None:
    online = nodes.start("a").wait_api()
    assert online.post("/models/add", json={"repo_id": REPO}).status_code == 200
    online.wait_until(lambda: _installed(online, REPO), 120, "the download")
    online.stop()
    served = len(nodes.hub.requests)

    offline = nodes.start("a", "--offline").wait_api()
    answer = offline.post("/models/add", json={"repo_id": REPO})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "offline"
    found = offline.get("/models/search", params={"q": "smol"}).json()
    assert found["hub"].startswith("skipped")
    assert _installed(offline, REPO)  # what it holds is still its own
    time.sleep(1.0)
    assert len(nodes.hub.requests) == served, nodes.hub.requests[served:]
    _assert_only_loopback(offline.pid(), member_addresses(offline))


def member_addresses(node) -> set[str]:
    """Every address a member of the node's cluster (itself included) reports in NodeResources."""
    return {a for r in node.state()["nodeResources"].values() for a in r.get("addresses", [])}


def _assert_only_loopback(pid: int, members: set[str]) -> None:
    """Every connection of the node's process tree goes to loopback or to a member."""
    import psutil

    proc = psutil.Process(pid)
    for conn in [*proc.net_connections(kind="inet"), *(c for p in proc.children(True) for c in p.net_connections())]:
        if conn.raddr:
            ip = conn.raddr.ip
            assert ip.startswith("127.") or ip == "::1" or ip in members, (conn, members)


def test_client_errors_are_plain(nodes: Nodes) -> None:
    node = nodes.start("a").wait_api()
    assert node.post("/models/add", content=b"not json").status_code == 400
    assert node.post("/models/add", json={"repo_id": 5}).status_code == 400
    assert httpx.post(node.url + "/models/add-card", json=[1]).status_code == 400
