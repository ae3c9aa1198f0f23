"""llama.cpp's OpenMP threads spinning or sleeping at barriers: the engine alone, quiet and beside busy work.

llama.cpp's wheels (xllamacpp) and its RPC build are OpenMP builds: between the many operations of
a token, its threads wait at a barrier, by default spinning a while first. On a box whose cores
other work shares (the other runners of a node, other processes, the test suite), a spinning
thread holds the core its partner needs. ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep instead.
libgomp reads the variable when it loads, so each measurement is its own process.

Per round, one child process per policy (the order flipped each round), each with its own
llama.cpp server (SmolLM2-135M, 16 slots, one thread per stream, the batch threads llama.cpp's
default for this box): aggregate tokens/s of 8 concurrent streams and prompt tokens/s of a fresh
1,400-word prompt, on a quiet box and beside ``--busy`` busy-looping processes. Reports the
medians and PASSIVE / default per condition (median of per-round ratios).

    .venv/bin/python bench/bench_omp.py --rounds 3 --busy 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("default", "PASSIVE")


def child() -> None:
    """One policy's measurement (the environment is set by the parent): prints one JSON line."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_llama import MODEL, level, long_prompt_s  # type: ignore[import-not-found]
    from skulk_engine_llamacpp.models import provision_smollm2
    from skulk_engine_llamacpp.server_backend import LlamaServer

    models_dir = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    with LlamaServer(provision_smollm2(models_dir), n_parallel=16, n_threads=1) as engine:
        url = engine.base_url + "/v1/chat/completions"
        level(url, MODEL, 2, 8)  # warm
        streams = level(url, MODEL, 8, 64)
        seconds, tokens = long_prompt_s(url, 1400)
    print(json.dumps({"streams_tps": streams["aggregate_tps"], "prefill_tps": tokens / seconds}))


def _spin(until: float) -> None:
    x = 0
    while time.monotonic() < until:
        x += 1


def measure(policy: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, timeout=600, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def condition(rounds: int, busy: int) -> dict[str, Any]:
    spinners = [multiprocessing.Process(target=_spin, args=(time.monotonic() + 3600,)) for _ in range(busy)]
    for p in spinners:
        p.start()
    try:
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
        for r in range(rounds):
            for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                runs[policy].append(measure(policy))
                print(f"busy={busy} round {r} {policy}: {json.dumps(runs[policy][-1])}", flush=True)
    finally:
        for p in spinners:
            p.terminate()
            p.join()
    report: dict[str, Any] = {"busy_processes": busy, "rounds": rounds}
    for key in ("streams_tps", "prefill_tps"):
        report[key] = {p: statistics.median(run[key] for run in runs[p]) for p in POLICIES}
        ratios = [b[key] / a[key] for a, b in zip(runs["default"], runs["PASSIVE"], strict=True)]
        report[key]["passive_vs_default_per_round"] = [round(x, 3) for x in ratios]
        report[key]["passive_vs_default"] = statistics.median(ratios)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=3, help="busy-looping processes beside the engine (0: quiet only)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        child()
        return
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "quiet": condition(args.rounds, 0),
    }
    if args.busy:
        report["busy"] = condition(args.rounds, args.busy)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "omp.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
