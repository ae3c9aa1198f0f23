"""MLX engine benchmark: multi-rank placements and llama.cpp, as ratios measured in one run.

    .venv/bin/python bench/bench_mlx.py [--tokens 32] [--prompts 3] [--qwen] [--out bench/results]

Every configuration runs the same fresh prompts greedily through the engine's own load() and
generate() in spawned rank processes on 127.0.0.1 (what runners do), and reports rank 0's
decode tok/s and time to first token (medians over the prompts):

* SmolLM2-135M (bf16 MLX folder): 1 rank vs 2- and 3-rank pipelines and a 3-way tensor split,
  each with and without pinning ranks to cores (SmolLM2's 9 heads / 3 KV heads cannot split 2-way);
* with --qwen, Qwen2.5-Coder-0.5B: 1 rank vs a 2-way tensor split, pinned and not;
* MLX single rank vs llama.cpp (xllamacpp's server, 1 thread) on the same SmolLM2 weights (Q4_1 GGUF).

Aggregate throughput at 1 and 4 streams on one single-rank instance (continuous batching) is
bench_mlx_batch.py's.
Models come from the same provisioners as the tests ($SKULK_TEST_MODELS_DIR, default
<tmp>/skulk-test-models).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FRESH = (
    "Describe a walk through a quiet forest in autumn.",
    "Explain how a bicycle works.",
    "Write a letter to a friend about your new garden.",
    "What makes a good cup of tea?",
    "Tell me about the moon.",
)


def models_dir() -> Path:
    return Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")


def mlx_folder(name: str, provision: Any) -> Path:
    folder = models_dir() / "mlx" / name
    if not (folder / ".complete").is_file():
        staging = folder.with_name(name + ".staging")
        provision(staging, None, cache_dir=models_dir() / ".cache" / "wheels")
        staging.rename(folder)
        (folder / ".complete").write_text("ok\n")
    return folder / "config.json"


def run_mlx(
    path: Path, card: Any, world: int, mode: str, pin: bool, prompts: tuple[str, ...], tokens: int
) -> dict[str, Any]:
    from skulk_engine_mlx.localranks import run_ranks

    started = time.perf_counter()
    reports = run_ranks(
        path, card, world, mode, prompts=prompts, max_tokens=tokens, timeout_s=900, options={"pin_ranks": pin}
    )
    errors = [r.error for r in reports if r.error]
    if errors:
        return {"error": errors[0]}
    head = reports[0]
    return {
        "decode_tps": statistics.median(head.decode_tps),
        "ttft_ms": statistics.median(head.ttft_ms),
        "rss_mib": [round(r.rss_after_load / 2**20) for r in reports],
        "tokens": head.tokens,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def run_llamacpp(prompts: tuple[str, ...], tokens: int) -> dict[str, Any]:
    from skulk_engine_llamacpp.engine import LlamaServerEngine
    from skulk_engine_llamacpp.models import provision_smollm2
    from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams
    from skulk_store.store import bundled_cards
    from skulk_testing.conformance import make_runner_spec

    card = bundled_cards()["HuggingFaceTB/SmolLM2-135M-Instruct"]
    gguf = provision_smollm2(models_dir())
    session = LlamaServerEngine().load(
        make_runner_spec(card, gguf, options={"n_threads": 1, "n_parallel": 1}), lambda d, t: None
    )
    tps, ttft = [], []
    try:
        for prompt in prompts:
            params = TextGenerationParams(
                model_id=card.model_id,
                messages=(ChatMessage(role="user", content=prompt),),
                sampling=SamplingParams(temperature=0.0, max_tokens=tokens),
            )
            final = list(session.generate("b", params, lambda: False))[-1]
            assert final.stats is not None
            tps.append(final.stats.generation_tps)
            ttft.append(final.stats.ttft_ms)
    finally:
        session.close()
    return {"decode_tps": statistics.median(tps), "ttft_ms": statistics.median(ttft)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--qwen", action="store_true", help="also 2-way tensor on Qwen2.5-Coder-0.5B (slow on CPU)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()

    from skulk_engine_mlx.models import provision_qwen05_mlx, provision_smollm2_mlx
    from skulk_kernel.api import ModelCard
    from skulk_store.store import bundled_cards

    prompts = FRESH[: args.prompts]
    smol = bundled_cards()["HuggingFaceTB/SmolLM2-135M-Instruct-MLX"]
    smol_path = mlx_folder("smollm2", provision_smollm2_mlx)
    results: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, Path, Any, int, str, bool]] = [("smollm2 1 rank", smol_path, smol, 1, "Pipeline", False)]
    for pin in (True, False):
        tag = "pinned" if pin else "unpinned"
        plan += [
            (f"smollm2 2-rank pipeline {tag}", smol_path, smol, 2, "Pipeline", pin),
            (f"smollm2 3-rank pipeline {tag}", smol_path, smol, 3, "Pipeline", pin),
            (f"smollm2 3-way tensor {tag}", smol_path, smol, 3, "Tensor", pin),
        ]
    if args.qwen:
        qwen = ModelCard(
            model_id="Qwen/Qwen2.5-Coder-0.5B-Instruct-MLX",
            n_layers=24,
            hidden_size=896,
            num_key_value_heads=2,
            supports_tensor=True,
            context_length=32768,
        )
        qwen_path = mlx_folder("qwen05", provision_qwen05_mlx)
        plan += [("qwen0.5b 1 rank", qwen_path, qwen, 1, "Pipeline", False)]
        plan += [
            (f"qwen0.5b 2-way tensor {'pinned' if p else 'unpinned'}", qwen_path, qwen, 2, "Tensor", p)
            for p in (True, False)
        ]
    for name, path, card, world, mode, pin in plan:
        print(f"running {name} ...", flush=True)
        results[name] = run_mlx(path, card, world, mode, pin, prompts, args.tokens)
    print("running llama.cpp (llama_server, 1 thread) ...", flush=True)
    try:
        results["smollm2 llama.cpp Q4_1"] = run_llamacpp(prompts, args.tokens)
    except Exception as exc:
        results["smollm2 llama.cpp Q4_1"] = {"error": f"{type(exc).__name__}: {exc}"}

    def ratio(name: str, base: str) -> dict[str, Any]:
        a, b = results.get(name, {}), results.get(base, {})
        if "decode_tps" not in a or "decode_tps" not in b:
            return {"vs": base, "error": a.get("error") or b.get("error")}
        same = a.get("tokens") == b.get("tokens") if "tokens" in a and "tokens" in b else None
        return {
            "vs": base,
            "decode": round(a["decode_tps"] / b["decode_tps"], 3),
            "ttft": round(a["ttft_ms"] / b["ttft_ms"], 3),
            "same_tokens": same,
        }

    ratios = {
        name: ratio(name, "qwen0.5b 1 rank" if name.startswith("qwen") else "smollm2 1 rank")
        for name in results
        if name not in ("smollm2 1 rank", "qwen0.5b 1 rank")
    }
    ratios["smollm2 llama.cpp Q4_1"] = ratio("smollm2 1 rank", "smollm2 llama.cpp Q4_1")
    ratios["smollm2 llama.cpp Q4_1"]["note"] = "MLX single rank relative to llama.cpp"
    print(f"\n{'configuration':40} {'decode tok/s':>12} {'TTFT ms':>9} {'decode x':>9} {'TTFT x':>7} same")
    for name, r in results.items():
        q = ratios.get(name, {})
        if "error" in r:
            print(f"{name:40} error: {r['error']}")
            continue
        print(
            f"{name:40} {r['decode_tps']:12.2f} {r['ttft_ms']:9.0f} {q.get('decode', ''):>9} {q.get('ttft', ''):>7} "
            f"{q.get('same_tokens', '')}"
        )
    llama = ratios["smollm2 llama.cpp Q4_1"]
    print(f"MLX 1 rank / llama.cpp decode: {llama.get('decode')}x, TTFT: {llama.get('ttft')}x")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "tokens": args.tokens,
        "prompts": len(prompts),
        "results": {k: {f: v for f, v in r.items() if f != "tokens"} for k, r in results.items()},
        "ratios": ratios,
    }
    path = args.out / f"mlx-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"report: {path}")


if __name__ == "__main__":
    sys.exit(main())
