"""Authentication on against off, measured in one run: what [secure] costs frames, the transport and the API.

    .venv/bin/python bench/bench_auth.py [--frames 4000] [--rounds 400] [--requests 40] [--skip-api]

1. frames     build + check one 1 KB frame: plain (sender header only), sealed (HMAC-SHA256, counter,
              replay window) and signed (sealed plus the sender's Ed25519 signature and CA binding);
              blocks interleaved, medians of per-block means.
2. transport  two real Zenoh sessions per mode in this process (plain: `secure = false`; sealed: TLS
              and MAC, `sign_control = false`; signed: the default), a COMMANDS publish answered on
              LOCAL_EVENTS: round-trip median and p99, the modes taking turns round by round; then
              one-way control-plane messages/s for each mode.
3. api        two 2-node clusters over Zenoh with the echo engine (5 ms per token) on the worker node,
              so each chat request crosses the control plane to the master and the data plane back:
              ON (secure transport, signed frames, the API node requires a key from loopback too, the
              requests carry an inference key) and OFF (`secure = false`, no key). Requests alternate
              between the clusters: GET /v1/models requests/s (the key check alone), a 1-token chat
              (the control-plane round trip through the API) and a 64-token stream (decode tok/s).

Prints one JSON object; every figure is a ratio against the other mode measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "plugins" / "transport-zenoh" / "tests"))

MODES = ("plain", "sealed", "signed")
KEY = "skulk/bench/control/commands"


def _codecs() -> dict[str, tuple[Any, Any]]:
    """mode -> (build(payload) -> frame, check(frame) -> payload)."""
    from skulk_transport_zenoh import frames
    from skulk_transport_zenoh.sealed import Opener, Sealer
    from skulk_transport_zenoh.secret import ClusterSecret
    from skulk_transport_zenoh.signing import NodeSigner, Verifier

    cluster = ClusterSecret(os.urandom(32), "bench")
    mac = cluster.key("mac")
    header = frames.sender_header("bench-node")
    sealer, opener = Sealer(mac, "bench-node"), Opener(mac)
    session = os.urandom(8)
    signed = Sealer(mac, "bench-node", session, NodeSigner(cluster, "bench", "bench-node", session))
    verifier = Opener(mac, verifier=Verifier(cluster, "bench"), needs_signature=lambda k: True)
    return {
        "plain": (lambda p: frames.encode(header, p), lambda f: frames.decode(f)[1]),
        "sealed": (lambda p: sealer.seal(KEY, p), lambda f: opener.open(KEY, f)[1]),
        "signed": (lambda p: signed.seal(KEY, p, True), lambda f: verifier.open(KEY, f)[1]),
    }


def bench_frames(n: int) -> dict[str, Any]:
    codecs = _codecs()
    payload = os.urandom(1024)
    per_block: dict[str, list[float]] = {m: [] for m in MODES}
    block = max(n // 20, 50)
    for i in range(20):
        for mode in MODES if i % 2 == 0 else reversed(MODES):
            build, check = codecs[mode]
            started = time.perf_counter()
            for _ in range(block):
                assert check(build(payload)) == payload
            per_block[mode].append((time.perf_counter() - started) / block * 1e6)
    us = {m: statistics.median(v) for m, v in per_block.items()}
    sizes = {m: len(codecs[m][0](payload)) - len(payload) for m in MODES}
    return {
        "us_per_frame_build_and_check": {m: round(v, 2) for m, v in us.items()},
        "ratio_vs_plain": {m: round(us[m] / us["plain"], 2) for m in MODES},
        "signed_vs_sealed": round(us["signed"] / us["sealed"], 2),
        "bytes_added_per_frame": sizes,
    }


async def _pair(mode: str, version: str, token: str) -> tuple[Any, Any]:
    from skulk_kernel.node import NodeOptions
    from skulk_transport_zenoh.transport import ZenohTransport
    from zenoh_helpers import loopback_config, wait_until

    overrides = {"secure": mode != "plain", "sign_control": mode == "signed"}
    options = {"plane": "control", "options": NodeOptions(extra={"join_token": token})}
    a = ZenohTransport(loopback_config(version, **overrides))
    await a.start(f"{mode}-a", options)
    b = ZenohTransport(loopback_config(version, connect=a.listen_locators, **overrides))
    await b.start(f"{mode}-b", options)
    await wait_until(lambda: f"{mode}-b" in a.peers and f"{mode}-a" in b.peers, 20, f"the {mode} pair")
    return a, b


async def bench_transport(rounds: int, seconds: float) -> dict[str, Any]:
    from skulk_kernel.api import Topic
    from skulk_transport_zenoh.secret import encode_token

    token = encode_token(os.urandom(32))
    loop = asyncio.get_running_loop()
    pairs: dict[str, tuple[Any, Any]] = {}
    answers: dict[str, asyncio.Queue[bytes]] = {}
    counted: dict[str, int] = {}
    try:
        for mode in MODES:
            a, b = pairs[mode] = await _pair(mode, f"ba{uuid.uuid4().hex[:8]}-{mode}", token)
            answers[mode] = asyncio.Queue()
            counted[mode] = 0

            def echo(sender: str, payload: bytes, _b: Any = b) -> None:
                if payload.startswith(b"rt"):
                    loop.call_soon_threadsafe(lambda: loop.create_task(_b.publish(Topic.LOCAL_EVENTS, payload)))

            def count(sender: str, payload: bytes, _m: str = mode) -> None:
                counted[_m] += 1

            b.subscribe(Topic.COMMANDS, echo)
            b.subscribe(Topic.GLOBAL_EVENTS, count)
            a.subscribe(
                Topic.LOCAL_EVENTS,
                lambda s, p, _q=answers[mode], _a=a: s != _a.node_id and loop.call_soon_threadsafe(_q.put_nowait, p),
            )
        await asyncio.sleep(0.5)
        rtt: dict[str, list[float]] = {m: [] for m in MODES}
        body = b"rt" + os.urandom(1022)
        for i in range(rounds + 20):
            for mode in MODES if i % 2 == 0 else reversed(MODES):
                started = time.perf_counter()
                await pairs[mode][0].publish(Topic.COMMANDS, body)
                await asyncio.wait_for(answers[mode].get(), 10)
                if i >= 20:  # warm-up rounds untimed
                    rtt[mode].append((time.perf_counter() - started) * 1000)
        rate: dict[str, float] = {}
        payload = os.urandom(1024)
        for mode in MODES:
            a = pairs[mode][0]
            before, started, sent = counted[mode], time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                for _ in range(100):
                    await a.publish(Topic.GLOBAL_EVENTS, payload)
                sent += 100
            deadline = time.monotonic() + 30
            while counted[mode] - before < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            rate[mode] = (counted[mode] - before) / (time.perf_counter() - started)
    finally:
        for a, b in pairs.values():
            await b.stop()
            await a.stop()

    def p(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    med = {m: statistics.median(v) for m, v in rtt.items()}
    return {
        "round_trip_ms_median": {m: round(v, 3) for m, v in med.items()},
        "round_trip_ms_p99": {m: round(p(v, 0.99), 3) for m, v in rtt.items()},
        "round_trip_ratio_vs_plain": {m: round(med[m] / med["plain"], 3) for m in MODES},
        "control_msgs_per_s_one_way": {m: round(v) for m, v in rate.items()},
        "throughput_ratio_vs_plain": {m: round(rate[m] / rate["plain"], 3) for m in MODES},
        "rounds": rounds,
    }


PROFILE = """
[profile]
name = "bench-auth"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai", "api-anthropic", "api-ollama"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-echo]
token_delay_s = 0.005

[plugins.transport-zenoh]
multicast_scouting = false
secure = {secure}

[plugins.api-control]
loopback_needs_key = {needs_key}
"""


def _cluster(tmp: Path, on: bool, started: list[Any]) -> tuple[Any, Any, str | None]:
    from skulk_testing.nodes import start_node

    name = "on" if on else "off"
    env = {"SKULK_NETWORK_VERSION": f"bauth{uuid.uuid4().hex[:8]}", "HOME": str(tmp / f"{name}-user")}
    profiles = {}
    for role, needs_key in (("api", on), ("worker", False)):
        path = profiles[role] = tmp / f"{name}-{role}.toml"
        path.write_text(PROFILE.format(secure=str(on).lower(), needs_key=str(needs_key).lower()))
    worker = start_node(str(profiles["worker"]), "--node-name", f"{name}-w", home=tmp / f"{name}-w", env=env)
    started.append(worker)
    worker.wait_api(120)
    port = worker.get("/v1/diagnostics/node").json()["transports"]["control"]["listen"][0].rsplit(":", 1)[1]
    api = start_node(
        str(profiles["api"]),
        "--node-name",
        f"{name}-a",
        "--no-worker",
        "--bootstrap-peers",
        f"127.0.0.1:{port}",
        home=tmp / f"{name}-a",
        env=env,
    )
    started.append(api)
    if on:  # its /node_id needs a key too: wait for the cluster through the worker, then with the key
        worker.wait_until(lambda: len(worker.state().get("topology", {}).get("nodes", {})) >= 2, 120, "the API node")
    else:
        api.wait_api(120)

    worker.wait_until(
        lambda: (
            worker.post("/place_instance", json={"model_id": "skulk/echo", "excluded_nodes": []}).status_code == 200
        ),
        60,
        "placement",
    )
    worker.wait_ready("skulk/echo", 120)
    key = None
    if on:
        key = worker.post("/v1/keys", json={"name": "bench", "scope": "inference"}).json()["key"]
    return api, worker, key


def bench_api(requests: int) -> dict[str, Any]:
    import httpx
    from suite.streams import stream_once

    tmp = Path(tempfile.mkdtemp(prefix="skulk-bench-auth-"))
    started: list[Any] = []
    try:
        on_api, _, key = _cluster(tmp, True, started)
        off_api, _, _ = _cluster(tmp, False, started)
        auth = {"authorization": f"Bearer {key}"}
        on_api.wait_until(
            lambda: on_api.get("/v1/models", headers=auth).status_code == 200, 60, "the key on the API node"
        )
        headers = {True: {"authorization": f"Bearer {key}"}, False: {}}
        clients = {on: httpx.Client(timeout=60, headers=headers[on]) for on in (True, False)}
        apis = {True: on_api, False: off_api}
        assert httpx.get(on_api.url + "/v1/models", timeout=10).status_code == 401  # the key is really needed
        models_ms: dict[bool, list[float]] = {True: [], False: []}
        rtt_ms: dict[bool, list[float]] = {True: [], False: []}
        decode: dict[bool, list[float]] = {True: [], False: []}
        prompt = " ".join(f"w{i}" for i in range(64))
        for i in range(requests + 3):
            for on in (True, False) if i % 2 == 0 else (False, True):
                url, client = apis[on].url, clients[on]
                t0 = time.perf_counter()
                for _ in range(10):
                    client.get(url + "/v1/models").raise_for_status()
                t1 = time.perf_counter()
                short = client.post(
                    url + "/v1/chat/completions",
                    json={"model": "skulk/echo", "messages": [{"role": "user", "content": "a"}], "max_tokens": 1},
                )
                t2 = time.perf_counter()
                short.raise_for_status()
                got = stream_once(client, url, "chat", "skulk/echo", prompt, 64)
                if not got.ok:
                    raise RuntimeError(f"stream failed: {got.error}")
                if i >= 3:
                    models_ms[on].append((t1 - t0) / 10 * 1000)
                    rtt_ms[on].append((t2 - t1) * 1000)
                    if got.decode_tok_s:
                        decode[on].append(got.decode_tok_s)
    finally:
        for node in started:
            node.stop()
    med = {
        name: {on: statistics.median(v[on]) for on in (True, False)}
        for name, v in (("models", models_ms), ("rtt", rtt_ms), ("decode", decode))
    }
    return {
        "models_requests_per_s": {
            "auth_on": round(1000 / med["models"][True]),
            "auth_off": round(1000 / med["models"][False]),
        },
        "models_latency_ms_median": {
            "auth_on": round(med["models"][True], 3),
            "auth_off": round(med["models"][False], 3),
        },
        "models_latency_ratio_on_vs_off": round(med["models"][True] / med["models"][False], 3),
        "control_round_trip_ms_median": {
            "auth_on": round(med["rtt"][True], 2),
            "auth_off": round(med["rtt"][False], 2),
        },
        "control_round_trip_ratio_on_vs_off": round(med["rtt"][True] / med["rtt"][False], 3),
        "decode_tok_s_median": {"auth_on": round(med["decode"][True], 1), "auth_off": round(med["decode"][False], 1)},
        "decode_ratio_on_vs_off": round(med["decode"][True] / med["decode"][False], 3),
        "requests_per_side": requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--skip-api", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = {"what": "[secure] authentication on vs off, one run"}
    report["frames"] = bench_frames(args.frames)
    report["transport"] = asyncio.run(bench_transport(args.rounds, args.seconds))
    if not args.skip_api:
        report["api"] = bench_api(args.requests)
    report["load_average"] = list(os.getloadavg())
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
