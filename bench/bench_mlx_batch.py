"""MLX continuous batching: aggregate decode tok/s at 4 streams against 1 stream, in one run.

    .venv/bin/python bench/bench_mlx_batch.py [--tokens 48] [--streams 4] [--rounds 2] [--out bench/results]

One single-rank session of SmolLM2-135M (the engine's own load(), in this process, as a runner
holds it) answers the same fresh prompts greedily: first one request at a time, then ``streams``
requests sent together (they step in one batch, see engine-mlx's batcher.py). Aggregate tok/s is
completion tokens over wall time; the ratio is the batched figure over the single one. Each round
also measures mlx-lm alone (``BatchGenerator`` with the prompts at once against ``stream_generate``
one at a time): the library's own ratio on this machine, the ceiling for the session's. Rounds
alternate the two so a change in the machine's load hits both; the machine's load average is
reported with them (on a few shared cores the ratio moves with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mlx import FRESH, mlx_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def one(session: Any, prompt: str, tokens: int) -> int:
    from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams

    params = TextGenerationParams(
        model_id="HuggingFaceTB/SmolLM2-135M-Instruct-MLX",
        messages=(ChatMessage(role="user", content=prompt),),
        sampling=SamplingParams(temperature=0.0, max_tokens=tokens),
    )
    chunks = list(session.generate("bench", params, lambda: False))
    return int(chunks[-1].usage.completion_tokens)


def serial(session: Any, prompts: list[str], tokens: int) -> float:
    started = time.perf_counter()
    produced = sum(one(session, p, tokens) for p in prompts)
    return produced / (time.perf_counter() - started)


def together(session: Any, prompts: list[str], tokens: int) -> float:
    counts = [0] * len(prompts)

    def run(i: int) -> None:
        counts[i] = one(session, prompts[i], tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def library_alone(folder: Path, prompts: list[str], tokens: int) -> float:
    """mlx-lm with no session: `BatchGenerator` with every prompt at once over `stream_generate` one at
    a time (greedy): the library's own ratio on this machine, the ceiling for the session's."""
    from mlx_lm import load, stream_generate
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = load(str(folder))
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
    greedy = make_sampler(temp=0.0)
    started, produced = time.perf_counter(), 0
    for prompt in ids:
        produced += sum(1 for _ in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=greedy))
    one_at_a_time = produced / (time.perf_counter() - started)
    generator = BatchGenerator(model, max_tokens=tokens, completion_batch_size=8, prefill_batch_size=8)
    started, produced, finished = time.perf_counter(), 0, 0
    generator.insert(ids, max_tokens=[tokens] * len(ids))
    while finished < len(ids):
        _, responses = generator.next()
        produced += len(responses)
        finished += sum(1 for r in responses if r.finish_reason is not None)
    generator.close()
    return produced / (time.perf_counter() - started) / one_at_a_time


def matmul_rows(dtypes: tuple[str, ...] = ("bfloat16", "float32", "float16"), reps: int = 100) -> dict[str, float]:
    """What a batch can gain on this machine's MLX backend, below any model: the time of one of
    SmolLM2's MLP matmuls (576 -> 1536) for 4 rows over 1 row, per dtype. Where a decode step is
    bound by reading the weights (Apple silicon's GPU) 4 rows cost about what 1 does and a batch of
    4 approaches 4x; where the backend's matmul is compute-bound, 4 rows cost up to 4x and batching
    gains little. Returns dtype -> time(4 rows) / time(1 row)."""
    import mlx.core as mx

    out = {}
    for name in dtypes:
        dtype = getattr(mx, name)
        weight = mx.random.normal((1536, 576)).astype(dtype)
        took = []
        for rows in (1, 4):
            x = mx.random.normal((rows, 576)).astype(dtype)
            mx.eval(weight, x)
            for _ in range(5):
                mx.eval(x @ weight.T)
            started = time.perf_counter()
            for _ in range(reps):
                mx.eval(x @ weight.T)
            took.append((time.perf_counter() - started) / reps)
        out[name] = round(took[1] / took[0], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "engine-mlx" / "tests"))
    from conftest import SMOLLM2_CARD
    from skulk_engine_mlx.engine import MlxEngine
    from skulk_engine_mlx.models import provision_smollm2_mlx
    from skulk_testing.conformance import make_runner_spec

    path = mlx_folder("smollm2", provision_smollm2_mlx)
    session = MlxEngine().load(make_runner_spec(SMOLLM2_CARD, path.parent), lambda d, t: None)
    prompts = [FRESH[i % len(FRESH)] for i in range(args.streams)]
    one(session, "warm up", 4)
    single: list[float] = []
    batched: list[float] = []
    library: list[float] = []
    loads: list[float] = []
    try:
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            single.append(serial(session, prompts, args.tokens))
            batched.append(together(session, prompts, args.tokens))
            library.append(library_alone(path.parent, prompts, args.tokens))
        widest = session.batcher.widest if session.batcher is not None else 1
    finally:
        session.close()
    result = {
        "bench": "mlx_batch",
        "model": SMOLLM2_CARD.model_id,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "streams": args.streams,
        "tokens": args.tokens,
        "single_tps": [round(v, 2) for v in single],
        "batched_tps": [round(v, 2) for v in batched],
        "ratios": [round(b / s, 2) for b, s in zip(batched, single, strict=True)],
        "ratio_median": round(statistics.median(b / s for b, s in zip(batched, single, strict=True)), 2),
        "library_alone_ratios": [round(v, 2) for v in library],
        "session_vs_library": round(
            statistics.median(b / s for b, s in zip(batched, single, strict=True)) / statistics.median(library), 2
        ),
        "widest_batch": widest,
        "matmul_4_rows_vs_1": matmul_rows(),
        "load_average_1m": [round(v, 2) for v in loads],
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mlx_batch.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
