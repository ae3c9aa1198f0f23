"""Hosts that are apart ([hosts] closing note): joining across network namespaces against loopback,
and a peer model copy across namespaces against a raw TCP copy between the same namespaces.

    .venv/bin/python bench/bench_hosts.py [--rounds 2] [--size-mb 256] [--out bench/results/hosts.json]

Needs root (network and mount namespaces). Every figure comes from this run, the two sides of each
comparison interleaved round by round:

* **join**: three nodes (a light profile: the echo engine, Zenoh with bootstrap peers, the join
  token carried to the joiners) on this host's loopback, then each in its own namespace on one
  bridge (skulk_testing.lan), keys required. Timed from starting the two joiners (the first node's
  API already up) to the first node's topology holding all three. Ratio `lan_vs_loopback` = LAN
  seconds / loopback seconds.
* **copy**: node A (namespace 1, its own disk) holds a `size`-byte model; node B (namespace 2, its
  own disk: no hardlink shortcut) is asked for it (`POST /store/models/{id}/download`) and timed to
  `installed` (grant, copy over the bridge, SHA-256, install: what a user waits for). The raw copy
  is one TCP connection between the same two namespaces: `sendfile` in a process in namespace 1,
  `recv_into` + `write` into a file on B's disk in a process in namespace 2. Ratio `peer_vs_raw` =
  raw seconds / peer seconds (1.0: the copy is as fast as the wire allows here);
  `peer_copy_alone_mb_s` is the copy without the grant, the SHA-256 and the install (B's log).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL, NAME = "bench-org/hosts-copy", "weights.bin"


def make_blob(path: Path, size: int) -> str:
    """A file of `size` random bytes (written once, kept between runs); its SHA-256."""
    import hashlib

    digest_file = path.with_suffix(".sha256")
    if path.is_file() and path.stat().st_size == size and digest_file.is_file():
        return digest_file.read_text().strip()
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size // (1 << 20)):
            chunk = os.urandom(1 << 20)
            f.write(chunk)
            digest.update(chunk)
    digest_file.write_text(digest.hexdigest())
    return digest.hexdigest()


def card_mapping(size: int, digest: str) -> dict[str, Any]:
    """A hub-style card pinning the blob's size and SHA-256 (B verifies what it copies)."""
    files = {NAME: {"size": size, "sha256": digest}}
    source = {"kind": "hub", "repo_id": MODEL, "revision": "0" * 40, "main_file": NAME, "files": files}
    return {"model_id": MODEL, "n_layers": 1, "hidden_size": 8, "storage_size": size, "source": source}


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


JOIN_PROFILE = """
[profile]
name = "bench-hosts-join"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "api-control"]

[planes]
control = "zenoh"
telemetry = "zenoh"
data = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""
COPY_PROFILE = JOIN_PROFILE.replace('"worker", "engine-echo"', '"store"').replace(
    "bench-hosts-join", "bench-hosts-copy"
)


def _token(home: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "cluster", "token", "-q"],
        env={**os.environ, "HOME": str(home), "SKULK_JOIN_TOKEN": ""},
        capture_output=True,
        timeout=60,
    )
    return out.stdout.decode().strip()


def _zenoh_port(diag: dict[str, Any]) -> str:
    return str(diag["transports"]["control"]["listen"][0].rsplit(":", 1)[1])


# ====================================================================== join


def join_round(tmp: Path, lan: bool) -> float:
    from skulk_testing.lan import LanNode
    from skulk_testing.netns import Bridge
    from skulk_testing.nodes import NodeProcess, free_port

    profile = tmp / "join.toml"
    profile.write_text(JOIN_PROFILE)
    version = f"bh{secrets.token_hex(4)}"
    bridge = Bridge().up() if lan else None
    started: list[NodeProcess] = []

    def node(name: str, token: str, *args: str) -> NodeProcess:
        env = {"HOME": str(tmp / f"user-{name}"), "SKULK_NETWORK_VERSION": version, "SKULK_JOIN_TOKEN": token}
        argv = ("--node-name", name, *args)
        made: NodeProcess
        if bridge is not None:
            made = LanNode(profile=str(profile), home=tmp / name, api_port=free_port(), args=argv, env=env)
            made.netns = bridge.join()
        else:
            made = NodeProcess(profile=str(profile), home=tmp / name, api_port=free_port(), args=argv, env=env)
        started.append(made.start())
        return made

    def local_get(n: NodeProcess, path: str) -> Any:
        if isinstance(n, LanNode):
            return n.local("GET", path)[1]
        return n.get(path).json()

    try:
        a = node("a", "").wait_api(90)
        token = _token(tmp / "user-a")
        host = a.netns.ns_ip if isinstance(a, LanNode) else "127.0.0.1"
        peers = ("--bootstrap-peers", f"{host}:{_zenoh_port(local_get(a, '/v1/diagnostics/node'))}")
        began = time.perf_counter()
        for name in ("b", "c"):
            node(name, token, *peers)
        a.wait_until(lambda: len(local_get(a, "/state")["topology"]["nodes"]) == 3, 120, "three in the topology")
        return time.perf_counter() - began
    finally:
        for n in started:
            n.stop()
        if bridge is not None:
            bridge.down()


def bench_join(rounds: int, tmp: Path) -> dict[str, Any]:
    out: dict[str, list[float]] = {"loopback_s": [], "lan_s": []}
    for r in range(rounds):
        for kind in ("loopback", "lan"):
            took = join_round(Path(tempfile.mkdtemp(dir=tmp, prefix=f"join-{kind}-")), lan=kind == "lan")
            out[f"{kind}_s"].append(took)
            print(f"join round {r} {kind}: {took:.2f} s", flush=True)
    loop, lan = statistics.median(out["loopback_s"]), statistics.median(out["lan_s"])
    return {
        "loopback_s": round(loop, 2),
        "lan_s": round(lan, 2),
        "lan_vs_loopback": round(lan / loop, 2),
        "runs_s": out,
    }


# ====================================================================== copy


RAW_SEND = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn, open(sys.argv[2], "rb") as f:
        conn.sendfile(f)
"""
RAW_RECEIVE = """
import socket, sys, time
host, port, size, dest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
buf = memoryview(bytearray(1 << 20))
began = time.perf_counter()
with socket.create_connection((host, port)) as sock, open(dest, "wb", buffering=0) as out:
    got = 0
    while got < size:
        n = sock.recv_into(buf)
        if not n:
            raise SystemExit(f"ended after {got} of {size}")
        out.write(buf[:n])
        got += n
print(time.perf_counter() - began)
"""


def _copy_seconds(log: str) -> float:
    """The copy alone (bytes over the bridge, before SHA-256 and install), from B's log line."""
    import re

    found = re.findall(r"copied \S+ \([\d.]+ MB\) from \d+ peer\(s\) .* in ([\d.]+) s", log)
    return float(found[-1]) if found else float("nan")


def bench_copy(blob: Path, digest: str, rounds: int, tmp: Path) -> dict[str, Any]:
    import httpx
    from skulk_store.cards import card_from_mapping
    from skulk_store.store import LocalModelStore, folder_name
    from skulk_testing.lan import LanNode
    from skulk_testing.netns import Bridge
    from skulk_testing.nodes import free_port

    size = blob.stat().st_size
    card = card_from_mapping(card_mapping(size, digest), "bench")
    a_disk, b_disk = tmp / "a-disk", tmp / "b-disk"
    held = a_disk / folder_name(MODEL)
    held.mkdir(parents=True)
    os.link(blob, held / NAME)
    LocalModelStore(a_disk).install(card, held, NAME, {NAME: digest})
    profile = tmp / "copy.toml"
    profile.write_text(COPY_PROFILE)
    version = f"bc{secrets.token_hex(4)}"
    bridge = Bridge().up()
    nodes: list[LanNode] = []
    sender: subprocess.Popen[bytes] | None = None
    out: dict[str, list[float]] = {"raw_s": [], "peer_s": [], "peer_copy_s": []}

    def node(name: str, disk: Path, token: str, *args: str) -> LanNode:
        env = {"HOME": str(tmp / f"user-{name}"), "SKULK_NETWORK_VERSION": version, "SKULK_JOIN_TOKEN": token}
        made = LanNode(
            profile=str(profile), home=tmp / name, api_port=free_port(), args=("--node-name", name, *args), env=env
        )
        made.netns, made.disk = bridge.join(), disk
        nodes.append(made.start())
        return made

    try:
        a = node("a", a_disk, "").wait_api(90)
        peers = ("--bootstrap-peers", f"{a.ns.ns_ip}:{_zenoh_port(a.local('GET', '/v1/diagnostics/node')[1])}")
        b = node("b", b_disk, _token(tmp / "user-a"), "--offline", *peers).wait_api(90)
        operator = a.create_key("bench", "operator")["key"]
        a.key = b.key = operator
        a_id = a.node_id()
        _wait(lambda: b.get("/node_id").status_code == 200, 60)
        added = a.post("/models/add-card", json={"card": card_mapping(size, digest)})
        assert added.status_code == 200, added.text
        _wait(lambda: MODEL in b.get("/state").json()["nodeResources"][a_id].get("modelsPresent", []), 60)
        sender = subprocess.Popen(
            a.ns.command(sys.executable, "-c", RAW_SEND, a.ns.ns_ip, str(blob)), stdout=subprocess.PIPE
        )
        assert sender.stdout is not None
        port = int(sender.stdout.readline())
        raw_dest = b_disk / "raw.bin"
        for r in range(rounds):
            got = subprocess.run(
                b.ns.command(sys.executable, "-c", RAW_RECEIVE, a.ns.ns_ip, str(port), str(size), str(raw_dest)),
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            raw_dest.unlink()
            out["raw_s"].append(float(got.stdout.strip()))
            began = time.perf_counter()
            started = b.post(f"/store/models/{MODEL}/download")
            assert started.status_code == 200, started.text
            while (status := b.get(f"/store/models/{MODEL}/download").json()).get("status") != "installed":
                if status.get("status") == "failed":
                    raise RuntimeError(f"{status} {b.log()[-2000:]}")
                time.sleep(0.02)
            out["peer_s"].append(time.perf_counter() - began)
            out["peer_copy_s"].append(_copy_seconds(b.log()))
            copied = b.get("/store/transfers").json()["copied_from"][MODEL]
            assert copied == {a_id: size}, copied  # over the bridge from A, not a hardlink
            print(
                f"copy round {r}: raw {size / 1e6 / out['raw_s'][-1]:.0f} MB/s, "
                f"peer {size / 1e6 / out['peer_s'][-1]:.0f} MB/s as waited, "
                f"{size / 1e6 / out['peer_copy_s'][-1]:.0f} MB/s the copy alone (B's log)",
                flush=True,
            )
            assert httpx.delete(f"{b.url}/store/models/{MODEL}", headers={"authorization": f"Bearer {operator}"},
                                timeout=30).status_code == 200  # fmt: skip
            _wait(lambda: MODEL not in b.get("/store/storage").json()["models"], 30)
    finally:
        if sender is not None:
            sender.kill()
            sender.wait(5)
        for n in nodes:
            n.stop()
        bridge.down()
    raw, peer = statistics.median(out["raw_s"]), statistics.median(out["peer_s"])
    mb = size / 1e6
    return {
        "size_mb": round(mb),
        "raw_mb_s": round(mb / raw, 1),
        "peer_mb_s": round(mb / peer, 1),
        "peer_vs_raw": round(raw / peer, 3),
        "peer_copy_alone_mb_s": round(mb / statistics.median(out["peer_copy_s"]), 1),
        "peer_vs_raw_per_round": [round(x / y, 3) for x, y in zip(out["raw_s"], out["peer_s"], strict=True)],
        "runs_s": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--skip-join", action="store_true")
    parser.add_argument("--skip-copy", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network and mount namespaces)")
    result: dict[str, Any] = {"rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        if not args.skip_join:
            result["join"] = bench_join(args.rounds, Path(tmp))
        if not args.skip_copy:
            blob = Path(tempfile.gettempdir()) / f"skulk-bench-blob-{args.size_mb}m.bin"
            digest = make_blob(blob, args.size_mb * 1024 * 1024)
            copy_tmp = Path(tmp) / "copy"
            copy_tmp.mkdir()
            result["copy"] = bench_copy(blob, digest, args.rounds, copy_tmp)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
