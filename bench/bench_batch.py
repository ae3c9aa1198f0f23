"""The Batch API against the same requests sent interactively, as ratios measured in one run.

    .venv/bin/python bench/bench_batch.py [--out bench/results/batch.json] [--lines 120] [--rounds 2]

Real node processes: an API node that is the master (no worker) and two worker nodes with one
SmolLM2 replica each (llama.cpp, 1 thread), every node with the batch plugin, loopback only.
Each round, in alternating order, with fresh prompts (llama.cpp's prompt cache):

* batch: upload a JSONL file of `--lines` chat requests, create the batch, poll until completed
  (through the openai SDK); the time from upload to completed.
* interactive: the same number of the same kind of requests sent to the API node by `--concurrency`
  client threads (4: the batch's own window on two idle replicas, 2 per replica).

Then the priority check: the latency of single interactive requests on idle replicas, and while a
batch runs (the batch steps down to `busy_in_flight` lines per model while users are served).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
from skulk_batch.config import BatchConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.batch.conftest import make_batch_fabric  # noqa: E402
from tests.conftest import CHAT_MODEL, MODELS_DIR  # noqa: E402
from tests.resume.conftest import Fabric  # noqa: E402

MAX_TOKENS = 16


def body(tag: str, i: int) -> dict[str, Any]:
    return {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": f"[{tag}] Write one short sentence about the number {i}."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }


def run_batch(fabric: Fabric, n: int, tag: str) -> tuple[float, int]:
    client = openai.OpenAI(base_url=fabric.api.url + "/v1", api_key="unused", max_retries=2, timeout=60)
    lines = "".join(
        json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(tag, i)})
        + "\n"
        for i in range(n)
    ).encode()
    t0 = time.monotonic()
    uploaded = client.files.create(file=(f"{tag}.jsonl", io.BytesIO(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    while True:
        got = client.batches.retrieve(batch.id)
        if got.status in ("completed", "failed", "cancelled", "expired"):
            break
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    assert got.status == "completed" and got.request_counts and got.request_counts.completed == n, got
    assert got.output_file_id is not None
    out = [json.loads(x) for x in client.files.content(got.output_file_id).text.splitlines()]
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)
    return elapsed, tokens


def run_interactive(fabric: Fabric, n: int, tag: str, concurrency: int) -> tuple[float, int]:
    todo = list(range(n))
    lock = threading.Lock()
    tokens: list[int] = []

    def worker() -> None:
        with httpx.Client(timeout=300) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                got = client.post(fabric.api.url + "/v1/chat/completions", json=body(tag, i))
                got.raise_for_status()
                tokens.append(got.json()["usage"]["completion_tokens"])

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, sum(tokens)


def latencies(fabric: Fabric, tag: str, count: int) -> list[float]:
    found = []
    with httpx.Client(timeout=300) as client:
        for i in range(count):
            t0 = time.monotonic()
            client.post(fabric.api.url + "/v1/chat/completions", json=body(tag, i)).raise_for_status()
            found.append(time.monotonic() - t0)
            time.sleep(0.2)
    return found


def priority(fabric: Fabric, lines: int, count: int) -> dict[str, Any]:
    idle = latencies(fabric, f"idle-{uuid.uuid4().hex[:6]}", count)
    background = threading.Thread(target=run_batch, args=(fabric, lines, f"bg-{uuid.uuid4().hex[:6]}"))
    background.start()
    time.sleep(3)  # the batch is running on both replicas
    busy = latencies(fabric, f"busy-{uuid.uuid4().hex[:6]}", count)
    background.join()
    return {
        "idle_p50_s": round(statistics.median(idle), 3),
        "during_batch_p50_s": round(statistics.median(busy), 3),
        "ratio": round(statistics.median(busy) / statistics.median(idle), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/batch.json")
    parser.add_argument("--lines", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--probes", type=int, default=8, help="single requests for the priority check")
    parser.add_argument("--busy-in-flight", type=int, default=None, help="[plugins.batch] busy_in_flight (default 1)")
    args = parser.parse_args()
    extra = f"busy_in_flight = {args.busy_in_flight}\n" if args.busy_in_flight is not None else ""
    fabric = make_batch_fabric(Path(tempfile.mkdtemp(prefix="bench-batch-")), MODELS_DIR, extra)
    rows: list[dict[str, Any]] = []
    try:
        fabric.replicas(2)
        run_interactive(fabric, 8, "warm", args.concurrency)
        for r in range(args.rounds):
            order = ("batch", "interactive") if r % 2 == 0 else ("interactive", "batch")
            for kind in order:
                tag = f"{kind}-{r}-{uuid.uuid4().hex[:6]}"
                if kind == "batch":
                    elapsed, tokens = run_batch(fabric, args.lines, tag)
                else:
                    elapsed, tokens = run_interactive(fabric, args.lines, tag, args.concurrency)
                rows.append(
                    {
                        "round": r,
                        "kind": kind,
                        "s": round(elapsed, 2),
                        "req_per_s": round(args.lines / elapsed, 2),
                        "tok_per_s": round(tokens / elapsed, 1),
                    }
                )
                print(rows[-1], flush=True)
        prio = priority(fabric, args.lines, args.probes)
        print(prio, flush=True)
    finally:
        fabric.cluster.stop()
    rate = {
        k: statistics.mean([r["req_per_s"] for r in rows if r["kind"] == k] or [float("nan")])
        for k in ("batch", "interactive")
    }
    result = {
        "lines": args.lines,
        "max_tokens": MAX_TOKENS,
        "replicas": 2,
        "interactive_concurrency": args.concurrency,
        "rounds": rows,
        "batch_req_per_s": round(rate["batch"], 2),
        "interactive_req_per_s": round(rate["interactive"], 2),
        "batch_over_interactive": round(rate["batch"] / rate["interactive"], 2),
        "priority": prio,
        "busy_in_flight": BatchConfig().busy_in_flight if args.busy_in_flight is None else args.busy_in_flight,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
