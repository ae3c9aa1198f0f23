"""llama.cpp RPC (engine ``llama_rpc``): what a split over 2 and 3 ranks costs against one process.

Run: ``python bench/bench_rpc.py [--model qwen|smollm2] [--rounds 3]``; prints a table and writes
bench/results/rpc.json. Needs the RPC build (``skulk-kernel engines install llamacpp-rpc``).

Every configuration runs the same RPC build's ``llama-server`` with the driver's own settings
(:class:`skulk_engine_llamacpp.rpc_engine.RpcLlamaServer`) on the same GGUF, in this run:

* ``single``: one process, no RPC device (the baseline);
* ``2 direct`` / ``3 direct``: ranks' ``ggml-rpc-server`` reached straight over loopback TCP (what
  llama.cpp's own documentation sets up, and what Skulk never exposes);
* ``2 tunnel`` / ``3 tunnel``: the same ranks behind member mutual-TLS tunnels (what a node runs).

Layers split evenly (rank 0 keeps its share on its own CPU). Every configuration is up at once and
the rounds go round-robin over them, the order rotated each round, so drifting load on a shared
machine falls on all alike. Per configuration, medians over the rounds: time to first token of a
~60-token prompt (fresh each time: the server caches prompts), decode tok/s over 64 tokens
(llama.cpp's own ``predicted_per_second``), and each process's resident memory. All
ranks share this host's two cores, so a split's decode also pays for ranks competing for them: on
separate machines each rank has its own cores. The ratios that matter: tunnel against direct (the
cost of keeping RPC inside the cluster) and each split against single (what pooling costs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "qwen": ("Qwen/Qwen2.5-Coder-0.5B-Instruct", 24),
    "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", 30),
}


def model_path(model_id: str) -> Path:
    """The model as the tests provision it ($SKULK_TEST_MODELS_DIR, default /tmp/skulk-test-models)."""
    models = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    folder = models / model_id.replace("/", "--")
    return folder / json.loads((folder / ".skulk" / "installed-card.json").read_text())["main_file"]


def prompt(i: int) -> str:
    return f"Round {i}: " + " ".join(f"item{i}-{k}" for k in range(20)) + ". Summarise the list above in one line."


def one_request(server: Any, i: int) -> tuple[float, float]:
    """(time to first token, decode tok/s) of one fresh prompt with 64 generated tokens."""
    from skulk_engine_llamacpp.events import Finish, TextDelta

    started = time.perf_counter()
    first, tps = 0.0, 0.0
    for event in server.chat(
        [{"role": "user", "content": prompt(i)}],
        sampling={"temperature": 0, "max_tokens": 64, "ignore_eos": True},
    ):
        if isinstance(event, TextDelta) and event.text and not first:
            first = time.perf_counter() - started
        if isinstance(event, Finish):
            tps = float((event.timings or {}).get("predicted_per_second") or 0)
    return first, tps


class Config:
    """One configuration's processes, kept up for the whole run (rounds are interleaved)."""

    def __init__(self, build: Any, path: Path, n_layers: int, width: int, tunnel: bool) -> None:
        from skulk_engine_llamacpp.rpc_engine import RpcLlamaServer, _wait_port, free_loopback_port
        from skulk_engine_llamacpp.rpc_tunnel import MemberTls, Tunnels

        self.ranks: list[subprocess.Popen[bytes]] = []
        self.tunnels = Tunnels(MemberTls.of_this_node()) if tunnel else None
        self.samples: list[tuple[float, float]] = []
        endpoints = []
        split = [n_layers // width] * (width - 1)
        for _ in range(width - 1):
            port = free_loopback_port()
            proc = subprocess.Popen(
                [str(build.rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.ranks.append(proc)
            _wait_port(port, proc, 30, "ggml-rpc-server")
            if self.tunnels is not None:
                exposed = self.tunnels.expose("127.0.0.1:0", port)
                endpoints.append(f"127.0.0.1:{self.tunnels.reach(f'127.0.0.1:{exposed}')}")
            else:
                endpoints.append(f"127.0.0.1:{port}")
        self.server = RpcLlamaServer(build, endpoints, sum(split), split, model_path=path, n_parallel=1, n_ctx=2048)
        started = time.perf_counter()
        self.server.start()
        self.load_s = time.perf_counter() - started

    def rss_mib(self) -> list[int]:
        assert self.server.process is not None
        procs = [self.server.process, *self.ranks]
        return [psutil.Process(p.pid).memory_info().rss // 2**20 for p in procs]

    def close(self) -> None:
        from skulk_engine_llamacpp.rpc_engine import _stop

        self.server.close()
        for proc in self.ranks:
            _stop(proc)
        if self.tunnels is not None:
            self.tunnels.close()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rpc.json"))
    args = parser.parse_args()
    from skulk_engine_llamacpp.rpc_build import find_build

    build = find_build()
    if build is None:
        print("no RPC build: run `skulk-kernel engines install llamacpp-rpc`", file=sys.stderr)
        return 2
    model_id, n_layers = MODELS[args.model]
    path = model_path(model_id)
    configs = [("single", 1, False), ("2 direct", 2, False), ("2 tunnel", 2, True), ("3 direct", 3, False)]
    configs.append(("3 tunnel", 3, True))
    up: dict[str, Config] = {}
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name, width, tunnel in configs:
            up[name] = Config(build, path, n_layers, width, tunnel)
        for k, config in enumerate(up.values()):
            one_request(config.server, 10_000 + k)  # warm-up
        # rounds interleaved, the order rotated each round: a shared machine's load drifts across all alike
        names = list(up)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                up[name].samples.append(one_request(up[name].server, int(time.time() * 1000) + r))
        for name, config in up.items():
            rows[name] = {
                "ttft_s": round(median([t for t, _ in config.samples]), 3),
                "decode_tps": round(median([d for _, d in config.samples]), 2),
                "load_s": round(config.load_s, 2),
                "rss_mib": config.rss_mib(),
            }
    finally:
        for config in up.values():
            config.close()
    base = rows["single"]
    for name, row in rows.items():
        row["decode_vs_single"] = round(row["decode_tps"] / base["decode_tps"], 3) if base["decode_tps"] else None
        row["ttft_vs_single"] = round(row["ttft_s"] / base["ttft_s"], 3) if base["ttft_s"] else None
        direct = rows.get(name.replace("tunnel", "direct"))
        if "tunnel" in name and direct:
            row["decode_vs_direct"] = round(row["decode_tps"] / direct["decode_tps"], 3)
            row["ttft_vs_direct"] = round(row["ttft_s"] / direct["ttft_s"], 3)
    report = {"model": model_id, "build": build.describe(), "rounds": args.rounds, "configs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{model_id} on {build.describe()}")
    print("| config | decode tok/s | vs single | TTFT s | vs single | tunnel/direct decode | RSS MiB per process |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['decode_tps']:.1f} | {row['decode_vs_single']} | {row['ttft_s']:.3f} | "
            f"{row['ttft_vs_single']} | {row.get('decode_vs_direct', '')} | {row['rss_mib']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
