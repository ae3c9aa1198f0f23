"""Node start-up: `skulk-kernel run --no-default-models` to its first `/node_id` answer, this tree
against another commit (by default the last one before [suite]'s start-up work), alternated.

Run: ``python bench/bench_startup.py [--runs 5] [--baseline REF] [--out bench/results/startup.json]``;
prints JSON. For each start: wall seconds from spawn to the first 200 of ``/node_id`` and the CPU
seconds (user + system) the node process had used by then. The baseline runs the other commit's
sources from a ``git worktree`` (its ``src`` folders first on PYTHONPATH, the same installed
packages), so both trees share one venv, one machine and one moment; the figures that count are
the medians and their ratio (this tree / baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "7e6ed8a"  # main before [suite]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _src_path(tree: Path) -> str:
    return os.pathsep.join(str(p) for p in [tree / "kernel" / "src", *sorted(tree.glob("plugins/*/src"))])


def one_start(tree: Path, label: str, timeout_s: float = 30.0) -> dict[str, Any]:
    port, home = _free_port(), tempfile.mkdtemp(prefix=f"skulk-start-{label}-")
    env = {
        **os.environ,
        "PYTHONPATH": _src_path(tree),
        "SKULK_HOME": home,
        "SKULK_NETWORK_VERSION": f"bench-start-{os.getpid()}-{port}",  # a cluster of its own
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "skulk_kernel.cli", "run", "--no-default-models", "--api-port", str(port)]
    cmd += ["--api-host", "127.0.0.1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/node_id", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the node exited with {proc.returncode}")
            time.sleep(0.01)
        else:
            raise TimeoutError(f"{label}: no /node_id within {timeout_s} s")
        wall = time.perf_counter() - t0
        cpu = psutil.Process(proc.pid).cpu_times()
        return {"wall_s": round(wall, 3), "cpu_s": round(cpu.user + cpu.system, 3)}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(15)


def _worktree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="skulk-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True, capture_output=True
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="a commit to compare with")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = _worktree(args.baseline)
    samples: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    try:
        one_start(ROOT, "warm-up")  # the first start of each tree pays the page cache and .pyc files
        one_start(base, "warm-up")
        for _ in range(args.runs):
            samples["this"].append(one_start(ROOT, "this"))
            samples["baseline"].append(one_start(base, "baseline"))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    med = {k: {m: statistics.median(s[m] for s in v) for m in ("wall_s", "cpu_s")} for k, v in samples.items()}
    report = {
        "what": "skulk-kernel run --no-default-models -> first 200 of /node_id (default profile)",
        "baseline": args.baseline,
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "samples": samples,
        "median": med,
        "ratio_this_over_baseline": {m: round(med["this"][m] / med["baseline"][m], 3) for m in ("wall_s", "cpu_s")},
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
