"""Model store transfers, as ratios measured in one run (real node processes, loopback only).

    .venv/bin/python bench/bench_store.py [--out bench/results/store.json] [--repeat 2]

* peer copy (one source) MB/s against a raw loopback copy of the same file (a TCP socket, sendfile
  on one side and recv into a file on the other: the ceiling for this host),
* two sources against one (the same fetch with two holders),
* hub download (huggingface_hub against the loopback hub) against the peer copy,
* staging from a store host on the same filesystem (hard links) against the one-source peer copy,
  and `link_or_copy`'s hard link against a local file copy (its fallback) of the same file.

Each fetch is timed from the request (`POST /store/models/{id}/download`, or `/models/add` for the
hub) until the node lists the model as installed, so SHA-256 verification and installing are
inside every figure, as a user waits for them. The model is the bundled SmolLM2 GGUF (98 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.store.conftest import GGUF, REPO, Nodes  # noqa: E402
from tests.store.hub_server import HubRepo, LoopbackHub  # noqa: E402


def raw_loopback_copy(path: Path, dest: Path) -> float:
    """Seconds to move the file through a loopback TCP socket into `dest`."""
    size = path.stat().st_size
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def send() -> None:
        conn, _ = server.accept()
        with conn, open(path, "rb") as f:
            conn.sendfile(f)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as client, open(dest, "wb") as out:
        got = 0
        while got < size:
            block = client.recv(1 << 20)
            if not block:
                break
            out.write(block)
            got += len(block)
    took = time.perf_counter() - began
    sender.join()
    server.close()
    dest.unlink()
    return took


def link_vs_copy(path: Path, tmp: Path) -> tuple[float, float]:
    """Seconds to hard-link and to copy the file locally (the store's staging and its fallback)."""
    import shutil

    from skulk_store.staging import link_or_copy

    linked, copied = [], []
    for i in range(3):
        began = time.perf_counter()
        link_or_copy(path.parent, tmp / f"link{i}", [path.name])
        linked.append(time.perf_counter() - began)
        began = time.perf_counter()
        shutil.copyfile(path, tmp / f"copy{i}")
        copied.append(time.perf_counter() - began)
        shutil.rmtree(tmp / f"link{i}")
        (tmp / f"copy{i}").unlink()
    return min(linked), min(copied)


def _installed(node: Any) -> bool:
    return REPO in node.get("/store/storage").json()["models"]


def _timed(node: Any, start: Any) -> float:
    began = time.perf_counter()
    start()
    while not _installed(node):
        if node.proc is not None and node.proc.poll() is not None:
            raise RuntimeError(node.log()[-3000:])
        time.sleep(0.05)
    return time.perf_counter() - began


def _holders(node: Any) -> dict[str, list[str]]:
    return {nid: r.get("modelsPresent", []) for nid, r in node.state()["nodeResources"].items()}


def _wait(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError("condition not met")


def run(gguf: Path, repeat: int) -> dict[str, Any]:
    size = gguf.stat().st_size
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    readme = tmp / "README.md"
    readme.write_text("bench\n")
    hub = LoopbackHub()
    hub.add(HubRepo.from_files(REPO, {GGUF: gguf, "README.md": readme}))
    hub.start()
    nodes = Nodes(tmp, hub)
    out: dict[str, Any] = {"file_bytes": size, "repeat": repeat}
    try:
        a = nodes.start("a", "--no-worker", cluster=True).wait_api()
        b = nodes.start("b", "--no-worker", cluster=True).wait_api()
        c = nodes.start("c", "--no-worker", cluster=True).wait_api()
        ids = {n: node.get("/node_id").json() for n, node in (("a", a), ("b", b), ("c", c))}
        _wait(lambda: all(len(n.state()["topology"]["nodes"]) == 3 for n in (a, b, c)), 90)
        raw = [raw_loopback_copy(gguf, tmp / "raw.bin") for _ in range(3)]
        hub_s = _timed(a, lambda: a.post("/models/add", json={"repo_id": REPO}))
        _wait(lambda: REPO in _holders(b).get(ids["a"], []), 30)
        one, two = [], []
        for _ in range(repeat):
            one.append(_timed(b, lambda: b.post(f"/store/models/{REPO}/download")))
            _wait(lambda: REPO in _holders(c).get(ids["b"], []), 30)
            two.append(_timed(c, lambda: c.post(f"/store/models/{REPO}/download")))
            sources = c.get(f"/store/models/{REPO}/download").json()["sources"]
            out["two_source_split"] = {k[:8]: v for k, v in sources.items()}
            for node in (b, c):  # drop the copies for the next round
                httpx.delete(f"{node.url}/store/models/{REPO}", timeout=30)
            _wait(lambda: REPO not in _holders(c).get(ids["b"], []), 30)
        # a store host that holds the model, and a worker on this filesystem that stages from it
        from skulk_testing.nodes import start_node

        host = start_node("store-host", "--node-name", "h", home=tmp / "h" / "home", env=nodes.env("h"))
        nodes.started.append(host)
        host.wait_api()
        w = nodes.start("w", "--no-worker", cluster=True).wait_api()
        _wait(lambda: len(w.state()["topology"]["nodes"]) == 5, 90)
        _timed(host, lambda: host.post(f"/store/models/{REPO}/download"))
        host_id = host.get("/node_id").json()
        _wait(lambda: REPO in w.get("/store/registry").json()["hosts"].get(host_id, {}).get("models", {}), 30)
        staged = []
        for _ in range(repeat):
            staged.append(_timed(w, lambda: w.post(f"/store/models/{REPO}/download")))
            how = w.get("/store/storage").json()["staging"]["copies"][REPO]["how"]
            assert how == "hardlink", how
            w.post("/store/purge-staging")
        stage_s = statistics.median(staged)
        link_s, copy_s = link_vs_copy(Path(host.get("/store/storage").json()["models"][REPO]["path"]), tmp)
        out.update(
            stage_hardlink_s=round(stage_s, 3),
            stage_hardlink_vs_peer_copy=round(statistics.median(one) / stage_s, 1),
            hardlink_vs_local_copy=round(copy_s / link_s, 1),
        )
        out["runs_s_staging"] = {"staged": staged, "link": link_s, "copy": copy_s}

        raw_s, one_s, two_s = min(raw), statistics.median(one), statistics.median(two)
        mb = size / 1e6
        out.update(
            raw_loopback_mb_s=round(mb / raw_s, 1),
            peer_one_source_mb_s=round(mb / one_s, 1),
            peer_two_sources_mb_s=round(mb / two_s, 1),
            hub_download_mb_s=round(mb / hub_s, 1),
            peer_vs_raw=round(raw_s / one_s, 3),
            two_vs_one_source=round(one_s / two_s, 3),
            hub_vs_peer=round(one_s / hub_s, 3),
            hub_downloads=hub.repos[REPO].downloads,
            runs_s={"raw": raw, "one": one, "two": two, "hub": hub_s},
            cpu_count=os.cpu_count(),
            load_avg=os.getloadavg(),
        )
        return out
    finally:
        nodes.stop()
        hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "store.json")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from skulk_engine_llamacpp.models import provision_smollm2

    models = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    gguf = Path(provision_smollm2(models))
    result = run(gguf, args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs_s"}, indent=1))


if __name__ == "__main__":
    main()
