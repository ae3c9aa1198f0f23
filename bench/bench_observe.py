"""Tracing on against tracing off, measured in one run: what recording spans costs a request.

    .venv/bin/python bench/bench_observe.py [--pairs 12] [--max-tokens 64] [--engine llamacpp|echo]

Two real nodes over Zenoh on this host, both with the observe plugin: an API node and a worker node
that holds the instance (pinned with `excluded_nodes`), so every request crosses the control plane
to the master and the data plane back, and a traced request records spans on both nodes (API,
master, runner queue, prefill, one span per 16 decoded tokens, first/last data-plane hops).

Default engine: llama.cpp on SmolLM2-135M-Instruct Q4_1 (1 thread), provisioned in
$SKULK_TEST_MODELS_DIR like the tests. `--engine echo` uses the deterministic echo engine with a 5 ms
token delay: a fast engine, where per-token overhead would show the most.

Requests come in pairs, one traced and one not, the order flipping every pair so a change of load
on the shared machine hits both alike; every prompt is fresh (llama.cpp keeps a prompt cache).
Each long request is followed by a short-prompt probe (2 tokens out) on the same side, for TTFT:
prompt evaluation of the long prompts would drown the serving path's milliseconds. Reported: the
ratio of the median decode tok/s (on / off; goal >= 0.97), the probes' TTFT medians, their ratio
and difference (and the long prompts' TTFT beside them), and the spans a traced request recorded.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from skulk_testing.nodes import NodeProcess, start_node  # noqa: E402
from suite.streams import fresh_prompt, short_prompt, stream_once  # noqa: E402

CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ECHO_MODEL = "skulk/echo"
GOAL = 0.97

PROFILE = """
[profile]
name = "bench-observe"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "{engine}", "store",
           "api-control", "api-openai", "observe"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = true

{engine_table}
"""


def _master_agreed(nodes: list[NodeProcess]) -> bool:
    views = [n.get("/v1/diagnostics/node", timeout=3).json()["runtime"]["masterNodeId"] for n in nodes]
    return len(set(views)) == 1 and views[0] is not None


def cluster(tmp: Path, engine: str, models_dir: Path) -> tuple[NodeProcess, NodeProcess, str]:
    table = "[plugins.engine-llamacpp]\nn_threads = 1" if engine == "llamacpp" else "[plugins.engine-echo]\n"
    table += "\ntoken_delay_s = 0.005" if engine == "echo" else ""
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE.format(engine=f"engine-{engine}", engine_table=table))
    env = {"SKULK_NETWORK_VERSION": f"bo{uuid.uuid4().hex[:10]}", "SKULK_MODELS_DIR": str(models_dir)}
    nodes = [start_node(str(profile), "--node-name", f"b{i}", home=tmp / f"n{i}", env=env) for i in range(2)]
    for n in nodes:
        n.wait_api(90)
    api, worker = nodes
    api.wait_until(lambda: _master_agreed(nodes), 90, "a master")
    model = CHAT_MODEL if engine == "llamacpp" else ECHO_MODEL
    api_id = api.get("/node_id").json()
    api.wait_until(
        lambda: api.post("/place_instance", json={"model_id": model, "excluded_nodes": [api_id]}).status_code == 200,
        60,
        "placement",
    )
    api.wait_ready(model, 300)
    return api, worker, model


def set_tracing(node: NodeProcess, on: bool) -> None:
    response = httpx.put(node.url + "/v1/tracing", json={"enabled": on}, timeout=15)
    response.raise_for_status()


def trace_of(node: NodeProcess) -> dict[str, Any] | None:
    ids = node.get("/v1/traces").json()["traceIds"]
    if not ids:
        return None
    return node.get(f"/v1/traces/{ids[-1]}").json()


def run(args: argparse.Namespace) -> dict[str, Any]:
    models_dir = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    tmp = Path(tempfile.mkdtemp(prefix="skulk-bench-observe-"))
    api, worker, model = cluster(tmp, args.engine, models_dir)
    try:
        client = httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0))
        for i in range(2):  # warm-up, untimed
            stream_once(client, api.url, "chat", model, fresh_prompt(i), args.max_tokens)
        results: dict[bool, list[Any]] = {True: [], False: []}
        probes: dict[bool, list[Any]] = {True: [], False: []}
        tracing = None
        for i in range(args.pairs):
            for on in (True, False) if i % 2 == 0 else (False, True):
                if tracing is not on:
                    set_tracing(api, on)
                    tracing = on
                prompt = fresh_prompt(100 + 2 * i + int(on)) if args.engine == "llamacpp" else _echo_prompt(args)
                got = stream_once(client, api.url, "chat", model, prompt, args.max_tokens)
                probe_prompt = short_prompt(i) if args.engine == "llamacpp" else "a b"
                probe = stream_once(client, api.url, "chat", model, probe_prompt, 2)
                if not (got.ok and probe.ok):
                    raise RuntimeError(f"request failed: {got.error or probe.error}")
                results[on].append(got)
                probes[on].append(probe)
        set_tracing(api, True)
        stream_once(client, api.url, "chat", model, fresh_prompt(999), args.max_tokens)
        time.sleep(1.0)
        trace = trace_of(api)
    finally:
        api.stop()
        worker.stop()

    def med(values: list[float | None]) -> float:
        return statistics.median(v for v in values if v is not None)

    decode = {on: med([r.decode_tok_s for r in rs]) for on, rs in results.items()}
    ttft = {on: med([r.ttft_s for r in rs]) * 1000 for on, rs in probes.items()}
    ttft_long = {on: med([r.ttft_s for r in rs]) * 1000 for on, rs in results.items()}
    spans = trace["spans"] if trace else []
    ratio = decode[True] / decode[False]
    return {
        "what": "tracing on vs off through a remote API node (2 nodes, Zenoh)",
        "engine": args.engine,
        "model": model,
        "pairs": args.pairs,
        "max_tokens": args.max_tokens,
        "decode_tok_s_median": {"tracing_on": round(decode[True], 2), "tracing_off": round(decode[False], 2)},
        "decode_ratio_on_vs_off": round(ratio, 4),
        "goal": f">= {GOAL}",
        "meets_goal": ratio >= GOAL,
        "ttft_ms_median": {"tracing_on": round(ttft[True], 2), "tracing_off": round(ttft[False], 2)},
        "ttft_ratio_on_vs_off": round(ttft[True] / ttft[False], 4),
        "ttft_added_ms": round(ttft[True] - ttft[False], 2),
        "ttft_long_prompt_ms_median": {
            "tracing_on": round(ttft_long[True], 2),
            "tracing_off": round(ttft_long[False], 2),
        },
        "spans_per_traced_request": len(spans),
        "span_names": sorted({s["name"] for s in spans}),
        "nodes_in_trace": len({s["node_id"] for s in spans}),
        "load_average": list(os.getloadavg()),
    }


def _echo_prompt(args: argparse.Namespace) -> str:
    return " ".join(f"w{i}" for i in range(args.max_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--engine", choices=("llamacpp", "echo"), default="llamacpp")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
