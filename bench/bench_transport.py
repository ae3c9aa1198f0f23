"""Control plane on libp2p against control plane on Zenoh, measured in one run.

    .venv/bin/python bench/bench_transport.py [--round-trips 300] [--burst 3000]

For each transport: a hub transport in this process and one peer process (each plugin's own test
peer, which echoes COMMANDS back on LOCAL_EVENTS), connected over loopback by explicit addresses.

* round trip: one 100-byte COMMANDS message out, its echo back, one at a time: p50 and p99;
* messages/s: `--burst` messages published back to back, counted as their echoes come back
  (each message crosses the network twice);
* failover: kill -9 of the peer to the hub's PeerEvent(left), and SIGSTOP to PeerEvent(left)
  (the frozen-peer lease, 3 s on both).

Prints one JSON object; numbers are what this machine gave, shared with whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "plugins/transport-zenoh/tests"), str(ROOT / "plugins/transport-libp2p/tests")]

from skulk_kernel.api import PeerEvent, Topic  # noqa: E402


def _version() -> str:
    return f"bench{os.getpid()}-{secrets.token_hex(3)}"


async def _hub(kind: str, version: str) -> Any:
    if kind == "zenoh":
        from skulk_transport_zenoh.config import ZenohConfig
        from skulk_transport_zenoh.transport import ZenohTransport

        hub: Any = ZenohTransport(
            ZenohConfig(listen=["tcp/127.0.0.1:0"], network_version=version, multicast_scouting=False, lease_s=3.0)
        )
    else:
        from skulk_transport_libp2p.config import Libp2pConfig
        from skulk_transport_libp2p.transport import Libp2pTransport

        hub = Libp2pTransport(
            Libp2pConfig(listen=["/ip4/127.0.0.1/tcp/0"], network_version=version, mdns=False, lease_s=3.0)
        )
    await hub.start("hub", {"plane": "control"})
    return hub


def _peer(kind: str, version: str, hub: Any) -> subprocess.Popen[bytes]:
    if kind == "zenoh":
        script = ROOT / "plugins/transport-zenoh/tests/zenoh_peer.py"
        args = ["--node", "peer", "--version", version, "--lease", "3"]
        args += [a for loc in hub.listen_locators for a in ("--connect", loc)]
    else:
        script = ROOT / "plugins/transport-libp2p/tests/libp2p_peer.py"
        args = ["--node", "peer", "--version", version, "--bootstrap", hub.listen[0]]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def _until(check: Any, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError
        await asyncio.sleep(0.001)
    return time.monotonic() - started


async def measure(kind: str, round_trips: int, burst: int) -> dict[str, Any]:
    version = _version()
    hub = await _hub(kind, version)
    echoes: list[bytes] = []
    lock = threading.Lock()

    def on_echo(sender: str, payload: bytes) -> None:
        if sender == "peer":
            with lock:
                echoes.append(payload)

    hub.subscribe(Topic.LOCAL_EVENTS, on_echo)
    left: list[float] = []
    hub.on_peer(lambda e: left.append(time.monotonic()) if e == PeerEvent("peer", False) else None)
    proc = _peer(kind, version, hub)
    try:
        await _until(lambda: "peer" in hub.peers, 30)
        await asyncio.sleep(2.0)  # subscriptions and the gossipsub mesh settle
        # warm up until an echo comes back
        for _ in range(100):
            await hub.publish(Topic.COMMANDS, b"warm")
            try:
                await _until(lambda: bool(echoes), 0.5)
                break
            except TimeoutError:
                continue
        await asyncio.sleep(0.5)
        rtts = []
        for i in range(round_trips):
            with lock:
                echoes.clear()
            payload = b"rtt-%06d-" % i + b"x" * 89
            t0 = time.perf_counter()
            await hub.publish(Topic.COMMANDS, payload)
            await _until(lambda: bool(echoes), 5)
            rtts.append(time.perf_counter() - t0)
        with lock:
            echoes.clear()
        t0 = time.perf_counter()
        for i in range(burst):
            await hub.publish(Topic.COMMANDS, b"burst-%06d-" % i + b"x" * 87)
        await _until(lambda: len(echoes) >= burst, 120)
        burst_s = time.perf_counter() - t0
        in_order = echoes[:burst] == [b"burst-%06d-" % i + b"x" * 87 for i in range(burst)]
        killed = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        await _until(lambda: bool(left), 10)
        kill_s = left[0] - killed
        # SIGSTOP: a second peer, frozen
        left.clear()
        proc.wait(5)
        proc = _peer(kind, version, hub)
        await _until(lambda: "peer" in hub.peers, 30)
        frozen = time.monotonic()
        os.killpg(proc.pid, signal.SIGSTOP)
        await _until(lambda: bool(left), 15)
        stop_s = left[0] - frozen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        await hub.stop()
    rtts.sort()
    return {
        "rtt_p50_ms": round(statistics.median(rtts) * 1000, 2),
        "rtt_p99_ms": round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1000, 2),
        "msgs_per_s": round(burst / burst_s),
        "burst_in_order": in_order,
        "kill9_detect_ms": round(kill_s * 1000),
        "sigstop_detect_ms": round(stop_s * 1000),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--round-trips", type=int, default=300)
    parser.add_argument("--burst", type=int, default=3000)
    args = parser.parse_args()
    results = {kind: await measure(kind, args.round_trips, args.burst) for kind in ("zenoh", "libp2p")}
    z, p = results["zenoh"], results["libp2p"]
    results["libp2p_vs_zenoh"] = {
        "rtt_p50": round(p["rtt_p50_ms"] / z["rtt_p50_ms"], 1),
        "msgs_per_s": round(p["msgs_per_s"] / z["msgs_per_s"], 2),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
