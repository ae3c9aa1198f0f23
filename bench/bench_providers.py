"""[providers] capability call round trip (unary) against the same HTTP path without the provider layer.

    .venv/bin/python bench/bench_providers.py [--rounds 200] [--out bench/results/providers.json]

Installs `examples/extensions/echo-provider` with pip (uninstalled afterwards unless it was already
there), starts two nodes A and B (Zenoh, the echo provider loaded on B only), and times, round by
round interleaved, over one keep-alive HTTP connection to A:

* **baseline**: `GET /node_id`, a plain route: the HTTP round trip with no provider layer, on A
  and on B;
* **local**: `POST /v1/capabilities/call` on B for B's own `echo.unary` (schema checks both ways,
  the frames through the transport's same-node short cut, the lifecycle), against B's baseline;
* **remote**: `POST /v1/capabilities/call` on A for B's `echo.unary` (the frames on the provider
  data-plane topic over Zenoh, both ways), against A's baseline.

Ratios are call / baseline medians on the same node, measured in this run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skulk_testing.nodes import start_node  # noqa: E402

ECHO = ROOT / "examples" / "extensions" / "echo-provider"
PROFILE = """
[profile]
name = "bench-providers-{role}"
plugins = ["transport-zenoh", "election-bully", "master", "api-control", "providers"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.providers]
extensions = {extensions}
"""


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "providers.json"))
    args = parser.parse_args()
    had = pip("show", "skulk-echo-provider").returncode == 0
    if not had:
        isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
        done = pip("install", "--no-deps", "--no-input", *isolation, str(ECHO))
        assert done.returncode == 0, done.stderr
    tmp = Path(tempfile.mkdtemp(prefix="bench-providers-"))
    env = {"SKULK_NETWORK_VERSION": f"bench-providers-{uuid.uuid4().hex[:8]}"}
    nodes = []
    try:
        for role, extensions in (("a", "[]"), ("b", '["echo"]')):
            profile = tmp / f"{role}.toml"
            profile.write_text(PROFILE.format(role=role, extensions=extensions))
            nodes.append(start_node(str(profile), "--node-name", role, home=tmp / role, env=env))
        a, b = nodes
        a.wait_api(90)
        b.wait_api(90)
        b_id = str(b.get("/node_id").json())

        def descriptor() -> dict[str, Any] | None:
            caps = a.get("/v1/capabilities").json()["data"]
            return next((c for c in caps if c["node_id"] == b_id and c["id"] == "echo.unary"), None)

        a.wait_until(lambda: descriptor() is not None, 60, "A to discover B's echo.unary")
        cap = descriptor()
        assert cap is not None
        body = {"node_id": b_id, "capability": cap["ref"], "revision": cap["revision"], "input": {"text": "x" * 64}}
        samples: dict[str, list[float]] = {k: [] for k in ("a_baseline", "b_baseline", "local_call", "remote_call")}
        with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
            steps = {
                "a_baseline": lambda: ca.get("/node_id"),
                "b_baseline": lambda: cb.get("/node_id"),
                "local_call": lambda: cb.post("/v1/capabilities/call", json=body),
                "remote_call": lambda: ca.post("/v1/capabilities/call", json=body),
            }
            for step in steps.values():  # warm up every path once
                for _ in range(5):
                    assert step().status_code == 200
            for _ in range(args.rounds):
                for name, step in steps.items():
                    started = time.perf_counter()
                    response = step()
                    samples[name].append(time.perf_counter() - started)
                    assert response.status_code == 200, response.text
        result: dict[str, Any] = {name: summary(values) for name, values in samples.items()}
        result["ratios"] = {
            "local_call_vs_baseline": round(result["local_call"]["median_ms"] / result["b_baseline"]["median_ms"], 2),
            "remote_call_vs_baseline": round(result["remote_call"]["median_ms"] / result["a_baseline"]["median_ms"], 2),
        }
        result["rounds"] = args.rounds
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    finally:
        for node in nodes:
            node.stop()
        if not had:
            pip("uninstall", "-y", "skulk-echo-provider")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
