"""Benchmark skulk_master.eventlog against raw msgpack into/out of a BytesIO.

Run: ``python bench/bench_eventlog.py [--records N] [--repeats R] [--dir PATH]``; prints JSON.
Also the kernel section of the suite (``python bench/run.py``), through :func:`run`.

The baseline is the floor any msgpack-based log pays (encode + buffer write,
then decode); the ratios show what framing, file I/O, fsync, rotation and
validation cost on top.  Best-of-R timings, to damp noise from a shared host.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel" / "src"))

import msgpack
from skulk_master.eventlog import EventLog


def make_records(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """Tagged-event dicts shaped like the kernel's: task lifecycle plus frequent runner status."""
    rng = random.Random(seed)
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(64)]
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.3:
            out.append(
                {
                    "TaskCreated": {
                        "taskId": str(uuid.UUID(int=rng.getrandbits(128))),
                        "commandId": rng.choice(ids),
                        "instanceId": rng.choice(ids),
                        "task": {
                            "kind": "ChatCompletion",
                            "model": "mlx-community/Llama-3.2-3B-Instruct-4bit",
                            "params": {
                                "maxTokens": rng.randint(16, 4096),
                                "temperature": 0.7,
                                "stream": True,
                            },
                            "messages": [{"role": "user", "content": "hello " * rng.randint(1, 20)}],
                        },
                    }
                }
            )
        elif kind < 0.8:
            out.append(
                {
                    "RunnerStatusUpdated": {
                        "runnerId": rng.choice(ids),
                        "status": {
                            "RunnerRunning": {
                                "tokensPerSecond": rng.random() * 100,
                                "activeTasks": rng.randint(0, 8),
                                "memoryBytes": rng.getrandbits(34),
                            }
                        },
                    }
                }
            )
        else:
            out.append({"TaskStatusUpdated": {"taskId": rng.choice(ids), "status": "Complete", "at": 1.7e9 + i}})
    return out


def best(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(records: int = 200_000, repeats: int = 3, parent: Path | None = None) -> dict[str, Any]:
    """The benchmark as a function (the suite's kernel section calls it); returns the JSON result."""
    n = records
    records_list = make_records(n)

    # Baseline: raw packb into a BytesIO, then unpackb back out (lengths kept aside for framing).
    lengths: list[int] = []
    sink = io.BytesIO()

    def base_write() -> None:
        nonlocal sink
        sink = io.BytesIO()
        lengths.clear()
        for rec in records_list:
            data = msgpack.packb([len(lengths), rec])
            lengths.append(len(data))
            sink.write(data)

    def base_read() -> None:
        src = io.BytesIO(sink.getvalue())
        for ln in lengths:
            msgpack.unpackb(src.read(ln))

    base_w, base_r = best(base_write, repeats), best(base_read, repeats)
    result: dict[str, Any] = {
        "records": n,
        "repeats": repeats,
        "payload_bytes": sum(lengths),
        "baseline": {"append_rec_s": round(n / base_w), "replay_rec_s": round(n / base_r)},
        "eventlog": {},
    }

    configs = {
        "default(fsync_every=1000,rotate=64MiB)": {},
        "no_fsync(fsync_every=0)": {"fsync_every": 0},
        "rotating(rotate=4MiB)": {"rotate_bytes": 4 << 20},
    }
    parent = parent or Path(tempfile.gettempdir())
    for name, kw in configs.items():
        root = Path(tempfile.mkdtemp(prefix="skulk-eventlog-bench-", dir=parent))
        try:
            counter = iter(range(1 << 30))

            def write(kw: dict[str, Any] = kw, root: Path = root, counter: Any = counter) -> None:
                d = root / f"run{next(counter)}"
                with EventLog(d, **kw) as log:
                    for i, rec in enumerate(records_list):
                        log.append(i, rec)
                    assert log.mode == "persisting", log.degraded_reason

            w = best(write, repeats)
            last = root / f"run{next(counter) - 1}"
            t0 = time.perf_counter()
            log = EventLog(last, **kw)
            open_s = time.perf_counter() - t0
            assert log.last_idx == n - 1

            def replay(log: EventLog = log) -> None:
                count = sum(1 for _ in log.replay())
                assert count == n, count

            r = best(replay, repeats)
            log.close()
            on_disk = sum(p.stat().st_size for p in last.iterdir())
            result["eventlog"][name] = {
                "append_rec_s": round(n / w),
                "replay_rec_s": round(n / r),
                "append_vs_baseline": round(base_w / w, 3),
                "replay_vs_baseline": round(base_r / r, 3),
                "open_ms": round(open_s * 1000, 1),
                "archives": log.status().archives,
                "bytes_on_disk": on_disk,
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="parent directory for the log (default: system temp)")
    args = ap.parse_args()
    print(json.dumps(run(args.records, args.repeats, Path(args.dir) if args.dir else None), indent=2))


if __name__ == "__main__":
    main()
