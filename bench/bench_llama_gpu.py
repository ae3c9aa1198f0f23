"""SmolLM2 decode rate on llama.cpp's GPU build (all layers offloaded) against its CPU build.

    python bench/bench_llama_gpu.py measure --label cpu  [--backend llama_server-cpu]  --out DIR
    skulk-kernel engines install llamacpp-cuda            # replaces the CPU build in this environment
    python bench/bench_llama_gpu.py measure --label cuda --backend llama_server-cuda --out DIR
    python bench/bench_llama_gpu.py report DIR            # DIR/llama-gpu.json: the ratio

One ``measure`` per build, each in its own interpreter (both builds are the package ``xllamacpp``:
one is installed at a time, so the CPU build is measured before the GPU build replaces it; see
``bench/gpu_check.sh``). ``measure`` loads the SmolLM2 GGUF through the runner's own path
(``LlamaServerEngine.load`` with a RunnerSpec placed on ``--backend``, as the worker's runner does),
so the offload plan is the engine's: it records the build detected from the package, the tags the
engine advertises on this node's hardware facts, the plan (layers offloaded, why), the GPU memory
the load took (ggml's device list before and after), and the best of ``--rounds`` greedy decodes of
``--max-tokens`` tokens (llama.cpp's own ``predicted_per_second``). A GPU label fails loudly unless
the build is a GPU build, the engine advertises that tag and every layer went to the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing" / "src"))
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Write a long story about a lighthouse keeper who collects maps, rivers and comets."


def _facts() -> dict[str, Any]:
    """This node's facts as a node builds them: the engine's builds, then the hardware plugin's probe."""
    from skulk_engine_llamacpp.engine import probe_builds

    facts: dict[str, Any] = {"engine_builds": probe_builds()}
    try:
        from skulk_hardware.derive import derive_backends
        from skulk_hardware.detect import probe_hardware
    except ImportError:
        return facts
    hw = probe_hardware(dict(facts["engine_builds"]))
    facts.update(gpus=[g.model_dump(mode="json") for g in hw.gpus], hardware=hw.model_dump(mode="json"))
    facts["derived_backends"] = derive_backends(hw)
    return facts


def _gpu_used() -> int:
    import xllamacpp as xlc

    kinds = xlc.ggml_backend_dev_type
    gpu = (kinds.GGML_BACKEND_DEVICE_TYPE_GPU, kinds.GGML_BACKEND_DEVICE_TYPE_IGPU)
    return sum(int(d["memory_total"]) - int(d["memory_free"]) for d in xlc.get_device_info() if d["type"] in gpu)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from skulk_engine_llamacpp.engine import LlamaServerEngine
    from skulk_engine_llamacpp.models import provision_smollm2
    from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams
    from skulk_store.cards import card_from_gguf
    from skulk_testing.conformance import make_runner_spec

    engine = LlamaServerEngine()
    facts = _facts()
    build = engine.build()
    tags = engine.backend_tags(facts)
    gpu = args.backend.rpartition("-")[2] != "cpu"
    if gpu and args.backend not in tags:
        raise SystemExit(
            f"FAIL: the engine does not advertise {args.backend} here: build {build!r}, tags {tags}, "
            f"GPUs {[g.get('model') for g in facts.get('gpus', [])]}"
        )
    path = provision_smollm2(Path(args.models_dir))
    card = card_from_gguf(path, MODEL)
    options = {"n_threads": args.threads, "n_threads_batch": args.threads, "n_parallel": 1, "n_ctx": 2048}
    spec = make_runner_spec(card, path, backend=args.backend, options=options)
    before = _gpu_used()
    started = time.perf_counter()
    session = engine.load(spec, lambda done, total: None)
    load_s = time.perf_counter() - started
    took = _gpu_used() - before
    plan = session.offload
    try:
        if gpu and (plan is None or not plan.full):
            raise SystemExit(f"FAIL: not every layer went to the GPU: {plan.summary() if plan else 'no offload plan'}")
        params = TextGenerationParams(
            model_id=MODEL,
            messages=(ChatMessage(role="user", content=PROMPT),),
            sampling=SamplingParams(max_tokens=args.max_tokens, temperature=0.0),
        )
        rates = []
        for i in range(args.rounds + 1):  # the first is a warm-up (CUDA JIT, caches)
            final = list(session.generate(f"bench-{i}", params, lambda: False))[-1]
            stats = final.stats
            if i and stats is not None:
                rates.append({"tokens": stats.generation_tokens, "decode_tps": stats.generation_tps})
    finally:
        session.close()
    best = max(r["decode_tps"] for r in rates)
    report = {
        "label": args.label,
        "backend": args.backend,
        "session_tag": session.tag,
        "build": build,
        "engine_builds": facts.get("engine_builds"),
        "advertised": tags,
        "derived_backends": facts.get("derived_backends"),
        "gpus": [
            {k: g.get(k) for k in ("model", "vram_total_bytes", "vram_free_bytes")} for g in facts.get("gpus", [])
        ],
        "offload": {"layers": plan.layers, "total": plan.total, "reason": plan.reason} if plan else None,
        "gpu_bytes_taken_by_load": took,
        "load_s": round(load_s, 2),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "rounds": rates,
        "decode_tps": round(best, 1),
        "host": platform.node(),
        "load_avg": os.getloadavg(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"llama-{args.label}.json").write_text(json.dumps(report, indent=2))
    print(f"{args.label}: {report['decode_tps']} tok/s decode on {session.tag} ({report['offload'] or 'no offload'})")
    return report


def report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    cpu = json.loads((out / "llama-cpu.json").read_text())
    gpus = [
        json.loads(p.read_text()) for p in sorted(out.glob("llama-*.json")) if p.stem not in ("llama-cpu", "llama-gpu")
    ]
    if not gpus:
        raise SystemExit(f"FAIL: no GPU measurement in {out}")
    summary = {
        "model": MODEL,
        "cpu_decode_tps": cpu["decode_tps"],
        "gpu": [
            {
                "label": g["label"],
                "backend": g["session_tag"],
                "offload": g["offload"],
                "decode_tps": g["decode_tps"],
                "ratio_vs_cpu_build": round(g["decode_tps"] / cpu["decode_tps"], 2),
            }
            for g in gpus
        ],
    }
    (out / "llama-gpu.json").write_text(json.dumps(summary, indent=2))
    for g in summary["gpu"]:
        ratio = g["ratio_vs_cpu_build"]
        print(f"{g['backend']}: {g['decode_tps']} tok/s vs the cpu build's {cpu['decode_tps']} tok/s = {ratio}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--label", required=True, help="cpu, cuda, rocm, vulkan: names the result file")
    m.add_argument("--backend", default="llama_server-cpu", help="the tag the placement chose")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--max-tokens", type=int, default=256)
    m.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    m.add_argument(
        "--models-dir", default=os.environ.get("SKULK_TEST_MODELS_DIR") or f"{tempfile.gettempdir()}/skulk-test-models"
    )
    m.add_argument("--out", default=str(ROOT / "bench" / "results"))
    r = sub.add_parser("report")
    r.add_argument("out", nargs="?", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    measure(args) if args.cmd == "measure" else report(args)


if __name__ == "__main__":
    main()
