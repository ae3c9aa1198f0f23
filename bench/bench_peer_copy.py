"""Peer model copies against a raw TCP copy between the same endpoints (issue 33, acceptance 6).

    .venv/bin/python bench/bench_peer_copy.py [--size-mb 1024] [--rounds 3] [--rate-mbit 800]
                                              [--skip-nodes] [--skip-netns] [--out bench/results/peer_copy.json]

Two parts, each interleaved round by round (raw, then the copies), every figure from this run:

* **nodes** (loopback): two real node processes; A holds a `size`-byte model (installed by the
  store's own `install`, its card added through `/models/add-card` with the pinned SHA-256), B is
  asked for it (`POST /store/models/{id}/download`) and timed until its status is `installed`: the
  grant, the token over the data plane, the copy, the SHA-256 check and the install are all inside
  the figure, as a user waits for them. The raw copy is one TCP connection on the same loopback:
  `sendfile` on one side, `recv_into` a reused buffer and `write` into a file on the other (the
  ceiling for a copy in Python on this host). Ratio: `peer_vs_raw` = raw seconds / peer seconds.
* **netns** (needs root): two network namespaces joined to this one by veth pairs, each running
  the store's own file server (`tests/store/peer_file_server.py`, sendfile) as a process inside
  it, with `tc tbf` limiting what each namespace sends to `rate-mbit` (a member on a slower link
  than the receiver's: the receiver is then not the bottleneck, it can take several times one
  link's rate, which the unlimited loopback figure shows). The requester is the store's data path
  (`skulk_store.rangecopy.FileCopy`, SHA-256 included) in this process. Ratios: one source against
  a raw TCP copy from the same namespace through the same limit (`one_vs_raw`), and two sources
  (one per namespace) against one (`two_vs_one`). With `--rate-mbit 0` the links are unlimited.
  With `--slow-mbit N` a third namespace sends at N mbit/s: the first source and that slow one
  together against the first alone, with the copy's end-game (a range the slow member still holds
  when nothing is left to hand out is fetched again from the fast one) and without it
  (`uneven_vs_fast_alone`, `uneven_no_endgame_vs_fast_alone`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "bench-org/peer-copy-1g"
NAME = "weights.bin"
TOKEN = "bench-token"


# ====================================================================== raw TCP copy


def serve_raw(path: Path, host: str) -> None:
    """Send the whole file by `sendfile` to every connection (a process of its own; prints the port)."""
    server = socket.create_server((host, 0))
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        with conn, open(path, "rb") as f:
            conn.sendfile(f)


def raw_receive(host: str, port: int, size: int, dest: Path) -> float:
    """Seconds to receive `size` bytes from a `serve_raw` listener into `dest`."""
    buf = memoryview(bytearray(1 << 20))
    began = time.perf_counter()
    with socket.create_connection((host, port)) as sock, open(dest, "wb", buffering=0) as out:
        got = 0
        while got < size:
            n = sock.recv_into(buf)
            if not n:
                raise RuntimeError(f"raw copy ended after {got} of {size} bytes")
            out.write(buf[:n])
            got += n
    took = time.perf_counter() - began
    dest.unlink()
    return took


def raw_loopback(path: Path, dest: Path) -> float:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def send() -> None:
        conn, _ = server.accept()
        with conn, open(path, "rb") as f:
            conn.sendfile(f)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return raw_receive("127.0.0.1", port, path.stat().st_size, dest)
    finally:
        sender.join(30)
        server.close()


# ====================================================================== the blob


def make_blob(path: Path, size: int) -> str:
    """A file of `size` random bytes (written once, kept between runs); its SHA-256."""
    digest_file = path.with_suffix(".sha256")
    if path.is_file() and path.stat().st_size == size and digest_file.is_file():
        return digest_file.read_text().strip()
    block = os.urandom(1 << 20)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = block[: min(left, len(block))]
            chunk = hashlib.sha256(chunk).digest() + chunk[32:]  # no two blocks alike
            f.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
            block = chunk
    digest_file.write_text(digest.hexdigest())
    return digest.hexdigest()


def card_mapping(size: int, digest: str) -> dict[str, Any]:
    return {
        "model_id": MODEL,
        "n_layers": 1,
        "hidden_size": 8,
        "storage_size": size,
        "source": {
            "kind": "hub",
            "repo_id": MODEL,
            "revision": "0" * 40,
            "main_file": NAME,
            "files": {NAME: {"size": size, "sha256": digest}},
        },
    }


# ====================================================================== nodes on loopback


def bench_nodes(blob: Path, digest: str, rounds: int, tmp: Path) -> dict[str, Any]:
    from skulk_store.cards import card_from_mapping
    from skulk_store.store import LocalModelStore, folder_name

    from tests.store.conftest import Nodes
    from tests.store.hub_server import LoopbackHub

    size = blob.stat().st_size
    card = card_from_mapping(card_mapping(size, digest), "bench")
    a_models = tmp / "a" / "models"
    held = a_models / folder_name(MODEL)
    held.mkdir(parents=True)
    os.link(blob, held / NAME)
    LocalModelStore(a_models).install(card, held, NAME, {NAME: digest})
    hub = LoopbackHub()
    hub.start()
    nodes = Nodes(tmp, hub)
    out: dict[str, Any] = {"raw_s": [], "peer_s": [], "peer_copy_s": []}
    try:
        a = nodes.start("a", "--no-worker", cluster=True).wait_api()
        b = nodes.start("b", "--no-worker", "--offline", cluster=True).wait_api()
        a_id = a.get("/node_id").json()
        _wait(lambda: len(b.state()["topology"]["nodes"]) == 2, 90)
        answer = a.post("/models/add-card", json={"card": card_mapping(size, digest)})
        assert answer.status_code == 200, answer.text
        _wait(lambda: MODEL in b.state()["customModelCards"], 30)
        _wait(lambda: MODEL in b.state()["nodeResources"][a_id].get("modelsPresent", []), 30)
        dest = tmp / "b" / "models" / "raw.bin"
        dest.parent.mkdir(parents=True, exist_ok=True)
        for r in range(rounds):
            out["raw_s"].append(raw_loopback(blob, dest))
            began = time.perf_counter()
            started = b.post(f"/store/models/{MODEL}/download")
            assert started.status_code == 200, started.text
            while (status := b.get(f"/store/models/{MODEL}/download").json()).get("status") != "installed":
                if status.get("status") == "failed":
                    raise RuntimeError(f"{status} {b.log()[-2000:]}")
                time.sleep(0.01)
            out["peer_s"].append(time.perf_counter() - began)
            copied = b.get("/store/transfers").json()["copied_from"][MODEL]
            assert copied == {a_id: size}, copied
            with open(tmp / "b" / "models" / folder_name(MODEL) / NAME, "rb") as f:
                assert hashlib.file_digest(f, "sha256").hexdigest() == digest
            out["peer_copy_s"].append(_last_copy_seconds(b.log()))
            print(
                f"nodes round {r}: raw {size / 1e6 / out['raw_s'][-1]:.0f} MB/s, "
                f"peer {size / 1e6 / out['peer_s'][-1]:.0f} MB/s (as waited)",
                flush=True,
            )
            assert httpx.delete(f"{b.url}/store/models/{MODEL}", timeout=30).status_code == 200
            _wait(lambda: MODEL not in b.get("/store/storage").json()["models"], 30)
    finally:
        nodes.stop()
        hub.stop()
    return _summary(size, out["raw_s"], {"peer": out["peer_s"]}) | {"runs_s": out}


def _last_copy_seconds(log: str) -> float | None:
    import re

    found = re.findall(r"copied \S+ \([\d.]+ MB\) from \d+ peer\(s\) .* in ([\d.]+) s", log)
    return float(found[-1]) if found else None


# ====================================================================== network namespaces


def bench_netns(blob: Path, digest: str, rounds: int, rate_mbit: int, tmp: Path, slow_mbit: int = 0) -> dict[str, Any]:
    from skulk_store.rangecopy import FileCopy, RangeSource
    from skulk_testing.netns import Netns

    size = blob.stat().st_size
    spaces = [Netns().up() for _ in range(3 if slow_mbit else 2)]
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(ns: Netns, *argv: str) -> int:
        proc = subprocess.Popen(ns.command(sys.executable, *argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout is not None
        return int(proc.stdout.readline())

    served = tmp / "served"
    served.mkdir()
    os.link(blob, served / NAME)
    try:
        for ns, mbit in zip(spaces, [rate_mbit, rate_mbit, slow_mbit], strict=False):
            if mbit:
                _limit(ns, mbit)
        files = [
            spawn(ns, str(ROOT / "tests/store/peer_file_server.py"), str(served), TOKEN, "--host", ns.ns_ip)
            for ns in spaces
        ]
        raw = spawn(spaces[0], __file__, "--serve-raw", str(blob), "--host", spaces[0].ns_ip)
        out: dict[str, list[float]] = {"raw": [], "one": [], "two": []}

        def copy(which: tuple[int, ...], endgame: bool = True) -> float:
            part = tmp / "req" / f"{NAME}.part"
            sources = [RangeSource(f"ns{i}", spaces[i].ns_ip, files[i], f"/files/m?file={NAME}", TOKEN) for i in which]
            began = time.perf_counter()
            result = FileCopy(part, size, digest, sources, endgame=endgame).run()
            took = time.perf_counter() - began
            assert result.status == "ok", (result, [s.last_error for s in sources])
            if which == (0, 1):
                out.setdefault("two_split", []).append(min(result.received.values()) / size)  # type: ignore[arg-type]
            part.unlink()
            return took

        for r in range(rounds):
            out["raw"].append(raw_receive(spaces[0].ns_ip, raw, size, tmp / "raw.bin"))
            out["one"].append(copy((0,)))
            out["two"].append(copy((0, 1)))
            if slow_mbit:  # the order of the two flips each round
                for endgame in (True, False) if r % 2 == 0 else (False, True):
                    out.setdefault("uneven" if endgame else "uneven_no_endgame", []).append(copy((0, 2), endgame))
            print(
                f"netns round {r} ({rate_mbit or 'unlimited'} mbit/s per source): "
                + ", ".join(f"{k} {size / 1e6 / v[-1]:.0f} MB/s" for k, v in out.items() if k != "two_split"),
                flush=True,
            )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        for ns in spaces:
            ns.down()
    summary = _summary(size, out["raw"], {"one": out["one"], "two": out["two"]})
    one, two = statistics.median(out["one"]), statistics.median(out["two"])
    per_round = [round(o / t, 3) for o, t in zip(out["one"], out["two"], strict=True)]
    uneven = {
        f"{key}_vs_fast_alone": round(one / statistics.median(out[key]), 3)
        for key in ("uneven", "uneven_no_endgame")
        if key in out
    }
    return (
        summary
        | {
            "rate_mbit_per_source": rate_mbit,
            "two_vs_one": round(one / two, 3),
            "two_vs_one_per_round": per_round,
            "runs_s": out,
        }
        | ({"slow_mbit": slow_mbit} | uneven if slow_mbit else {})
    )


# ====================================================================== nodes in network namespaces

NS_PROFILE = """
[profile]
name = "bench-peer-copy"
plugins = ["transport-zenoh", "election-bully", "master", "store", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""


def bench_nodes_netns(blob: Path, digest: str, rounds: int, rate_mbit: int, tmp: Path) -> dict[str, Any]:
    """Real nodes: A in one namespace, C in another (each sending at most `rate_mbit`), B here.

    Model X is held by A alone, model Y (the same bytes) by A and C: B copying X is one source,
    B copying Y two; the raw copy goes from A's namespace to this one through the same limit.
    """
    from skulk_store.cards import card_from_mapping
    from skulk_store.store import LocalModelStore, folder_name
    from skulk_testing.netns import Netns
    from skulk_testing.nodes import NodeProcess, free_port

    from tests.security.test_netns_security import NsNode, _token, _zenoh_port

    size = blob.stat().st_size
    one, two = MODEL + "-x", MODEL + "-y"
    profile = tmp / "profile.toml"
    profile.write_text(NS_PROFILE)
    version = f"bench{os.urandom(4).hex()}"
    spaces = [Netns().up() for _ in range(2)]
    started: list[NodeProcess] = []
    raw_proc: subprocess.Popen[bytes] | None = None
    out: dict[str, list[float]] = {"raw": [], "one": [], "two": []}
    try:
        for ns in spaces:
            if rate_mbit:
                _limit(ns, rate_mbit)
        for name, models in (("a", (one, two)), ("c", (two,))):
            for model in models:
                card = card_from_mapping(card_mapping(size, digest) | {"model_id": model}, "bench")
                held = tmp / name / "models" / folder_name(model)
                held.mkdir(parents=True)
                os.link(blob, held / NAME)
                LocalModelStore(tmp / name / "models").install(card, held, NAME, {NAME: digest})
        common = ("--api-host", "0.0.0.0", "--no-default-models", "--no-worker")
        b = NodeProcess(
            profile=str(profile),
            home=tmp / "b" / "home",
            api_port=free_port(),
            args=(*common, "--node-name", "b", "--offline"),
            env={
                "HOME": str(tmp / "owner"),
                "SKULK_NETWORK_VERSION": version,
                "SKULK_JOIN_TOKEN": "",
                "SKULK_MODELS_DIR": str(tmp / "b" / "models"),
            },
        ).start()
        started.append(b)
        b.wait_api()
        token = _token(tmp, "owner")
        for name, ns in (("a", spaces[0]), ("c", spaces[1])):
            node = NsNode(
                profile=str(profile),
                home=tmp / name / "home",
                api_port=free_port(),
                args=(*common, "--node-name", name, "--bootstrap-peers", f"{ns.host_ip}:{_zenoh_port(b)}"),
                env={
                    "HOME": str(tmp / "other"),
                    "SKULK_NETWORK_VERSION": version,
                    "SKULK_JOIN_TOKEN": token,
                    "SKULK_MODELS_DIR": str(tmp / name / "models"),
                },
            )
            node.netns = ns
            started.append(node.start())
        _wait(lambda: len(b.state()["topology"]["nodes"]) == 3, 120)
        for model in (one, two):
            answer = b.post("/models/add-card", json={"card": card_mapping(size, digest) | {"model_id": model}})
            assert answer.status_code == 200, answer.text

        def holders(model: str) -> int:
            return sum(model in r.get("modelsPresent", []) for r in b.state()["nodeResources"].values())

        _wait(lambda: holders(one) == 1 and holders(two) == 2, 60)
        raw_proc = subprocess.Popen(
            spaces[0].command(sys.executable, __file__, "--serve-raw", str(blob), "--host", spaces[0].ns_ip),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert raw_proc.stdout is not None
        raw_port = int(raw_proc.stdout.readline())
        for r in range(rounds):
            out["raw"].append(raw_receive(spaces[0].ns_ip, raw_port, size, tmp / "raw.bin"))
            for key, model, n in (("one", one, 1), ("two", two, 2)):
                out[key].append(_fetch_on(b, model, size, digest, n, tmp / "b" / "models"))
            print(
                f"nodes-netns round {r} ({rate_mbit or 'unlimited'} mbit/s per source): "
                + ", ".join(f"{k} {size / 1e6 / v[-1]:.0f} MB/s" for k, v in out.items()),
                flush=True,
            )
    finally:
        if raw_proc is not None:
            raw_proc.kill()
            raw_proc.wait(10)
        for node in started:
            node.stop()
        for ns in spaces:
            ns.down()
    summary = _summary(size, out["raw"], {"one": out["one"], "two": out["two"]})
    per_round = [round(o / t, 3) for o, t in zip(out["one"], out["two"], strict=True)]
    return summary | {
        "rate_mbit_per_source": rate_mbit,
        "two_vs_one": round(statistics.median(out["one"]) / statistics.median(out["two"]), 3),
        "two_vs_one_per_round": per_round,
        "runs_s": out,
    }


def _limit(ns: Any, rate_mbit: int) -> None:
    """What the namespace sends, at most `rate_mbit` (a token bucket with 10 ms of burst, >= 1 MB)."""
    burst = max(rate_mbit * 1000 // 8 // 100, 1 << 20)
    cmd = f"tc qdisc add dev {ns.ns_if} root tbf rate {rate_mbit}mbit burst {burst} latency 50ms"
    subprocess.run(ns.command(*cmd.split()), check=True, capture_output=True)


def _fetch_on(node: Any, model: str, size: int, digest: str, sources: int, models_dir: Path) -> float:
    """Seconds from asking `node` for `model` until it is installed; checks the bytes and sources."""
    from skulk_store.store import folder_name

    began = time.perf_counter()
    started = node.post(f"/store/models/{model}/download")
    assert started.status_code == 200, started.text
    while (status := node.get(f"/store/models/{model}/download").json()).get("status") != "installed":
        if status.get("status") == "failed":
            raise RuntimeError(f"{status} {node.log()[-2000:]}")
        time.sleep(0.01)
    took = time.perf_counter() - began
    copied = node.get("/store/transfers").json()["copied_from"][model]
    assert len(copied) == sources and sum(copied.values()) == size, copied
    with open(models_dir / folder_name(model) / NAME, "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == digest
    assert httpx.delete(f"{node.url}/store/models/{model}", timeout=30).status_code == 200
    _wait(lambda: model not in node.get("/store/storage").json()["models"], 30)
    return took


# ====================================================================== summary


def _summary(size: int, raw: list[float], copies: dict[str, list[float]]) -> dict[str, Any]:
    mb = size / 1e6
    raw_med = statistics.median(raw)
    out: dict[str, Any] = {"raw_mb_s": round(mb / raw_med, 1)}
    for name, runs in copies.items():
        med = statistics.median(runs)
        out[f"{name}_mb_s"] = round(mb / med, 1)
        out[f"{name}_vs_raw"] = round(raw_med / med, 3)
        out[f"{name}_vs_raw_per_round"] = [round(r / c, 3) for r, c in zip(raw, runs, strict=True)]
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate-mbit", type=int, default=800)
    parser.add_argument("--slow-mbit", type=int, default=0, help="a third, slower member (netns part)")
    parser.add_argument("--skip-nodes", action="store_true")
    parser.add_argument("--skip-netns", action="store_true")
    parser.add_argument("--skip-nodes-netns", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peer_copy.json")
    parser.add_argument("--serve-raw", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_raw:
        return serve_raw(args.serve_raw, args.host)
    keep = Path(tempfile.gettempdir()) / "skulk-bench-peer-copy"
    keep.mkdir(exist_ok=True)
    blob = keep / f"blob-{args.size_mb}m.bin"
    digest = make_blob(blob, args.size_mb << 20)
    result: dict[str, Any] = {"file_bytes": blob.stat().st_size, "rounds": args.rounds}
    result["load_avg_before"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-peer-copy-", dir=keep) as tmp:
        if not args.skip_nodes:
            (Path(tmp) / "nodes").mkdir()
            result["nodes"] = bench_nodes(blob, digest, args.rounds, Path(tmp) / "nodes")
        if not args.skip_netns:
            (Path(tmp) / "netns").mkdir()
            result["netns"] = bench_netns(
                blob, digest, args.rounds, args.rate_mbit, Path(tmp) / "netns", args.slow_mbit
            )
        if not args.skip_nodes_netns:
            (Path(tmp) / "nodes-netns").mkdir()
            result["nodes_netns"] = bench_nodes_netns(
                blob, digest, args.rounds, args.rate_mbit, Path(tmp) / "nodes-netns"
            )
    result["load_avg_after"] = os.getloadavg()
    result["cpu_count"] = os.cpu_count()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                k: {kk: vv for kk, vv in v.items() if kk != "runs_s"} if isinstance(v, dict) else v
                for k, v in result.items()
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
