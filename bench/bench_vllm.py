"""vLLM through a Skulk node vs vLLM's own server, measured in one run against the same server.

    python bench/bench_vllm.py [--flavor cpu|cuda] [--rounds 6] [--max-tokens 64] [--out bench/results]

A node (profile cuda-vllm) places the SmolLM2 safetensors model on engine-vllm; the engine starts
a vLLM OpenAI server. We then stream the same kind of request alternately (a) through the node's
/v1/chat/completions and (b) straight at that vLLM server (found from the engine's pid file), with
a fresh prompt every time (no prefix-cache hits), and report the medians: decode tok/s ratio
(node / direct) and time to first token (node - direct, and the ratio). Same server, same model,
same run: the ratio is the node's overhead and nothing else.

The vLLM venv and the converted model are created once and cached (see engine-vllm's README).
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

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["rivers", "volcanoes", "bees", "glass", "bridges", "comets", "tea", "maps", "owls", "salt", "clocks", "ice"]


def stream_once(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = last = None
    pieces = 0
    tokens = 0
    with httpx.stream("POST", url, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    pieces += 1
    assert first is not None and last is not None, "no tokens streamed"
    tokens = tokens or pieces
    return {
        "ttft_ms": (first - started) * 1000,
        "decode_tps": max(tokens - 1, 1) / max(last - first, 1e-9),
        "tokens": tokens,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavor", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)

    from skulk_engine_vllm.managed import PidRecord
    from skulk_engine_vllm.models import SMOLLM2_ID, VllmModelStore
    from skulk_engine_vllm.venv import detect_flavor, ensure_vllm_venv, installed_info
    from skulk_testing.nodes import start_node

    flavor = args.flavor or detect_flavor()
    t0 = time.monotonic()
    ensure_vllm_venv(flavor, lambda m: print(f"[venv {time.monotonic() - t0:5.0f}s] {m}", flush=True))
    models_dir = Path(os.environ.get("SKULK_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    VllmModelStore(lambda: models_dir, lambda: flavor).ensure_local(SMOLLM2_ID)

    node = start_node("cuda-vllm", env={"SKULK_MODELS_DIR": str(models_dir), "SKULK_OFFLINE": "1"})
    try:
        node.wait_api(120).wait_ready(SMOLLM2_ID, timeout=1800)
        (record_file,) = list((node.home / "engine-vllm").glob("*.pid.json"))
        record = PidRecord.model_validate_json(record_file.read_text())
        through_node = node.url + "/v1/chat/completions"
        direct = f"http://127.0.0.1:{record.port}/v1/chat/completions"
        stream_once(direct, SMOLLM2_ID, "Warm up: say hi.", 8)
        stream_once(through_node, SMOLLM2_ID, "Warm up: say hello.", 8)
        rows: dict[str, list[dict[str, float]]] = {"node": [], "direct": []}
        for i in range(args.rounds):
            order = ("node", "direct") if i % 2 == 0 else ("direct", "node")
            for which in order:
                topic = TOPICS[(2 * i + (which == "node")) % len(TOPICS)]
                prompt = f"Round {i}: write a long, detailed paragraph about {topic}."
                url = through_node if which == "node" else direct
                rows[which].append(stream_once(url, SMOLLM2_ID, prompt, args.max_tokens))
                print(which, {k: round(v, 2) for k, v in rows[which][-1].items()}, flush=True)
    finally:
        node.stop(timeout=60)

    def med(which: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[which])

    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
        "flavor": flavor,
        "vllm": installed_info(flavor),
        "model": SMOLLM2_ID,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "direct_decode_tps_p50": round(med("direct", "decode_tps"), 2),
        "node_decode_tps_p50": round(med("node", "decode_tps"), 2),
        "decode_ratio_node_over_direct": round(med("node", "decode_tps") / med("direct", "decode_tps"), 3),
        "direct_ttft_ms_p50": round(med("direct", "ttft_ms"), 1),
        "node_ttft_ms_p50": round(med("node", "ttft_ms"), 1),
        "ttft_added_ms_p50": round(med("node", "ttft_ms") - med("direct", "ttft_ms"), 1),
        "ttft_ratio_node_over_direct": round(med("node", "ttft_ms") / med("direct", "ttft_ms"), 3),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"vllm-{flavor}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
