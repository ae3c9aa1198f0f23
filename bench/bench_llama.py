"""llama.cpp serving under load: a Skulk node vs llama.cpp's server alone, measured in one run.

    python bench/bench_llama.py [--levels 1,4,16] [--max-tokens 64] [--burst] [--no-spec] [--profile] [--out DIR]
                                [--node-env KEY=VALUE ...]

* Throughput: N concurrent streams (fresh prompts: no prompt-cache hits) through the node's
  /v1/chat/completions (profile cpu-llamacpp, SmolLM2-135M Q4_1, 16 slots, 1 decode thread) against
  the same GGUF on a ``LlamaServer`` started here with the same settings (the engine alone), each
  level alternated node / engine, the order flipped each round. Reported: aggregate completion
  tokens/s, node / engine (of the medians, and the median of the per-round ratios, which cancels the
  box's drift) and node at N / node at 1.
* Time to first token at 4 streams against 1 (median over the streams, through the node).
* The node's own cost (first, and alone with --profile): CPU-milliseconds its Python spends per
  generated token at 1 and 4 streams (the node process and its runners' Python, llama.cpp's threads
  in the runner apart; on a 2-core box every one is taken from llama.cpp), and what it adds to one
  stream's time to first token (node minus engine alone, alternated, median of --ttft-rounds).
* Constrained vs plain: one stream with a ``json_schema`` response format vs none (decode tok/s).
* Speculative vs plain (engine alone): Qwen2.5-Coder-1.5B greedy, with and without the 0.5B as
  draft, as shipped (Q4_K_M) and requantized batch-exact (Q4_1); decode tok/s ratio, the
  acceptance rate and whether the greedy text is identical (skipped with --no-spec or if not
  provisioned).
* Long-prompt prefill (first, and alone with --prefill): a fresh prompt of about 1,500 tokens
  through the node, which evaluates a prompt over 256 tokens in timed steps a cancel can stop
  between, against the engine alone evaluating it in one request (llama.cpp's default 512-token
  micro-batch on both): prompt tokens/s, alternated, median of --prefill-rounds.
* Prefill with batch-exact 32-token micro-batches against llama.cpp's default 512 (engine alone).
* --burst: 32 streams of 256 tokens through the node (all must finish; the heavy version of
  tests/serving/test_llama_burst.py).

Everything is a ratio against a baseline measured in the same run; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing" / "src"))
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WORDS = "rivers volcanoes bees glass bridges comets tea maps owls salt clocks ice ships roads stars moss".split()
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3},
    },
    "required": ["name", "facts"],
}
_counter = iter(range(10**9))


def fresh_prompt() -> str:
    i = next(_counter)
    return f"({uuid.uuid4().hex[:6]}) Tell me about {WORDS[i % len(WORDS)]} and {WORDS[(i * 7 + 3) % len(WORDS)]}."


def twin_prompts() -> tuple[str, str]:
    """Two prompts that differ only in a six-digit nonce (one token per digit in these models'
    vocabularies): the same prefill work on both sides, neither found in the other's prompt cache."""
    i, nonces = next(_counter), random.sample(range(10**5, 10**6), 2)
    words = f"Tell me about {WORDS[i % len(WORDS)]} and {WORDS[(i * 7 + 3) % len(WORDS)]}."
    return f"({nonces[0]}) {words}", f"({nonces[1]}) {words}"


def stream_once(
    url: str, model: str, max_tokens: int, extra: dict[str, Any] | None = None, prompt: str | None = None
) -> dict[str, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt or fresh_prompt()}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    started = time.perf_counter()
    first = last = None
    tokens = 0
    with httpx.stream("POST", url, json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            if event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
    end = time.perf_counter()
    first = first or end
    return {
        "ttft_s": first - started,
        "tokens": tokens,
        "decode_tps": max(tokens - 1, 0) / max((last or end) - first, 1e-9),
        "end": end,
        "start": started,
    }


def level(
    url: str,
    model: str,
    n: int,
    max_tokens: int,
    extra: dict[str, Any] | None = None,
    prompts: list[str] | None = None,
) -> dict[str, float]:
    """`n` streams at once (fresh prompts, or `prompts`)."""
    with ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        runs = list(
            pool.map(lambda i: stream_once(url, model, max_tokens, extra, prompts[i] if prompts else None), range(n))
        )
        wall = time.perf_counter() - t0
    return {
        "aggregate_tps": sum(r["tokens"] for r in runs) / wall,
        "ttft_p50_s": statistics.median(r["ttft_s"] for r in runs),
        "decode_tps_p50": statistics.median(r["decode_tps"] for r in runs),
        "tokens": sum(r["tokens"] for r in runs),
    }


def python_cpu_s(node_pid: int) -> tuple[float, dict[int, float]]:
    """CPU-seconds so far of the node's Python work: the node process, plus its runner processes
    less their long-lived non-main threads (llama.cpp's server runs inside the runner: its threads
    live from load to exit, while the runner's Python work is its main thread and a thread per task).
    Returns the total and the long-lived threads' times, for a difference with a later call."""
    import psutil

    root = psutil.Process(node_pid)
    total, threads = sum(root.cpu_times()[:2]), {}
    for runner in root.children():
        try:
            total += sum(runner.cpu_times()[:2])
            threads.update({t.id: t.user_time + t.system_time for t in runner.threads() if t.id != runner.pid})
        except psutil.Error:
            pass
    return total, threads


def node_cpu_per_ktok(node_pid: int, url: str, streams: int, max_tokens: int, rounds: int) -> dict[str, float]:
    """CPU-milliseconds the node's Python spends per generated token at `streams` concurrent
    streams (= CPU-seconds per 1,000 tokens): taken from llama.cpp's cores on a small box. psutil
    times before and after, so other load on the box does not count."""
    total0, threads0 = python_cpu_s(node_pid)
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        tokens += int(level(url, MODEL, streams, max_tokens)["tokens"])
    wall = time.perf_counter() - t0
    total1, threads1 = python_cpu_s(node_pid)
    engine = sum(t - threads0[i] for i, t in threads1.items() if i in threads0)
    python = total1 - total0 - engine
    return {
        "python_cpu_ms_per_token": 1000 * python / max(tokens, 1),
        "engine_cpu_ms_per_token": 1000 * engine / max(tokens, 1),
        "tokens": tokens,
        "wall_s": wall,
    }


def node_added_ttft(node_url: str, engine_url: str, rounds: int) -> dict[str, float]:
    """What the node adds to one stream's time to first token: node minus engine alone, alternated
    (the order flipped each round), median of `rounds` pairs; each pair's prompts are twins (the
    same length, so their prefill is the same work: fresh prompts of different lengths put tens of
    milliseconds of prefill into the difference)."""
    node, engine = [], []
    for r in range(rounds):
        ours, theirs = twin_prompts()
        pair = [(node, node_url, ours), (engine, engine_url, theirs)]
        for times, url, prompt in pair if r % 2 == 0 else pair[::-1]:
            times.append(stream_once(url, MODEL, 4, prompt=prompt)["ttft_s"])
    return {
        "node_ttft_ms": 1000 * statistics.median(node),
        "engine_ttft_ms": 1000 * statistics.median(engine),
        "added_ms": 1000 * statistics.median(n - e for n, e in zip(node, engine, strict=True)),
        "rounds": rounds,
    }


def long_prompt_s(url: str, words: int) -> tuple[float, int]:
    """(seconds, prompt tokens) of one request with a fresh long prompt and a single output token."""
    topic = " ".join(WORDS[(next(_counter) + i) % len(WORDS)] for i in range(words))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"({uuid.uuid4().hex}) Make one sentence of: {topic}"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.perf_counter()
    r = httpx.post(url, json=body, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - started, int(r.json()["usage"]["prompt_tokens"])


def long_prompt_prefill(node_url: str, engine_url: str, rounds: int, words: int = 1400) -> dict[str, Any]:
    """Prompt tokens/s of a fresh long prompt through the node (stepped prefill) against the engine
    alone (one request), alternated, the order flipped each round; median of the per-round ratios."""
    node, engine, tokens = [], [], 0
    for r in range(rounds):
        pair = [(node, node_url), (engine, engine_url)]
        for runs, url in pair if r % 2 == 0 else pair[::-1]:
            seconds, tokens = long_prompt_s(url, words)
            runs.append(tokens / seconds)
    return {
        "prompt_tokens": tokens,
        "node_prefill_tps": statistics.median(node),
        "engine_prefill_tps": statistics.median(engine),
        "node_vs_engine_per_round": [round(n / e, 3) for n, e in zip(node, engine, strict=True)],
        "node_vs_engine_median_of_rounds": statistics.median(n / e for n, e in zip(node, engine, strict=True)),
    }


def best(results: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in results)


def speculative(models_dir: Path, max_tokens: int) -> dict[str, Any] | None:
    """Speculative vs plain greedy decode of the Qwen pair, as shipped (Q4_K_M) and batch-exact (Q4_1)."""
    from skulk_engine_llamacpp.events import Finish, TextDelta
    from skulk_engine_llamacpp.models import ProvisionError, provision_qwen05, provision_qwen15, requantize
    from skulk_engine_llamacpp.server_backend import LlamaServer

    try:
        shipped = provision_qwen15(models_dir), provision_qwen05(models_dir)
        exact = requantize(shipped[0]), requantize(shipped[1])
    except ProvisionError as exc:
        print(f"speculative skipped: {exc}", flush=True)
        return None
    ask = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
    report: dict[str, Any] = {}
    for quant, (target, draft) in (("q4_k_m", shipped), ("q4_1", exact)):
        out: dict[str, Any] = {}
        for name, d in (("plain", None), ("speculative", draft)):
            # one core each: 2-thread batches collapse on a busy 2-core box
            one_core: dict[str, Any] = {"n_parallel": 1, "n_threads": 1, "n_threads_batch": 1}
            with LlamaServer(target, n_ctx=2048, draft_model_path=d, draft_max=4, **one_core) as srv:
                events = list(srv.chat(ask, sampling={"max_tokens": max_tokens, "temperature": 0}))
                fin = events[-1]
                assert isinstance(fin, Finish)
                text = "".join(e.text for e in events if isinstance(e, TextDelta))
                out[name] = {"decode_tps": fin.timings.get("predicted_per_second"), "text": text}
                out[name].update(srv.speculative_stats())
        drafted = out["speculative"]["drafted"]
        out["acceptance"] = out["speculative"]["accepted"] / drafted if drafted else None
        out["ratio"] = out["speculative"]["decode_tps"] / out["plain"]["decode_tps"]
        out["identical_text"] = out["speculative"].pop("text") == out["plain"].pop("text")
        report[quant] = out
    return report


def micro_batches(model: Path) -> dict[str, Any]:
    """Prefill speed with batch-exact 32-token micro-batches against llama.cpp's 512 (engine alone)."""
    from skulk_engine_llamacpp.events import Finish
    from skulk_engine_llamacpp.server_backend import LlamaServer

    out: dict[str, Any] = {}
    for ub in (512, 32, 512, 32):  # alternated: the box's load drifts
        with LlamaServer(model, n_parallel=1, n_threads=1, n_ctx=4096, n_ubatch=ub) as srv:
            prompt = f"Summarize this ({ub}, {time.time()}): " + "The quick brown fox jumps over the lazy dog. " * 120
            fin = list(srv.chat([{"role": "user", "content": prompt}], sampling={"max_tokens": 1}))[-1]
            assert isinstance(fin, Finish)
            out.setdefault(f"prefill_tps_ubatch{ub}", []).append(float(fin.timings.get("prompt_per_second") or 0))
    med = {k: statistics.median(v) for k, v in out.items()}
    return {**med, "ratio_32_vs_512": med["prefill_tps_ubatch32"] / med["prefill_tps_ubatch512"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--burst", action="store_true")
    ap.add_argument("--no-spec", action="store_true")
    ap.add_argument("--profile", action="store_true", help="only the node's CPU per 1,000 tokens and added TTFT")
    ap.add_argument("--ttft-rounds", type=int, default=20)
    ap.add_argument("--prefill", action="store_true", help="only the long-prompt prefill, node against engine")
    ap.add_argument("--prefill-rounds", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument(
        "--node-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the node's environment only (its runners inherit it), e.g. OMP_WAIT_POLICY=PASSIVE",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the node on a timeout
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT / "plugins" / "engine-llamacpp" / "src"))
    from skulk_engine_llamacpp.models import provision_smollm2
    from skulk_engine_llamacpp.server_backend import LlamaServer
    from skulk_testing.nodes import start_node

    models_dir = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
    gguf = provision_smollm2(models_dir)
    levels = [int(x) for x in args.levels.split(",")]
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_avg_start": os.getloadavg(),
        "max_tokens": args.max_tokens,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every section, so a run cut short still leaves what it measured
        report["load_avg_now"] = os.getloadavg()
        (out / "llama.json").write_text(json.dumps(report, indent=2) + "\n")

    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"bench-llama-{uuid.uuid4().hex[:8]}"}
    env.update(kv.split("=", 1) for kv in args.node_env)
    report["node_env"] = args.node_env
    node = start_node("cpu-llamacpp", home=Path(tempfile.mkdtemp(prefix="bench-llama-")), env=env)
    try:
        node.wait_api(timeout=120).wait_ready(MODEL, timeout=600)
        node_url = node.url + "/v1/chat/completions"
        with LlamaServer(gguf, n_parallel=16, n_threads=1) as engine:
            engine_url = engine.base_url + "/v1/chat/completions"
            stream_once(node_url, MODEL, 8), stream_once(engine_url, MODEL, 8)  # warm both
            report["long_prompt_prefill"] = long_prompt_prefill(node_url, engine_url, args.prefill_rounds)
            print("long-prompt prefill", json.dumps(report["long_prompt_prefill"]), flush=True)
            save()
            if args.prefill:
                return
            report["node_cpu"] = {
                str(n): node_cpu_per_ktok(node.pid(), node_url, n, args.max_tokens, max(2, 16 // n)) for n in (1, 4)
            }
            report["node_added_ttft"] = node_added_ttft(node_url, engine_url, args.ttft_rounds)
            print("node cpu", json.dumps(report["node_cpu"]), "\nttft", json.dumps(report["node_added_ttft"]))
            save()
            if args.profile:
                return
            rows = {}
            for n in levels:
                node_runs, engine_runs = [], []
                for r in range(args.rounds):  # the order flips each round: neither side always goes first
                    twins = [twin_prompts() for _ in range(n)]  # the same prefill work on both sides
                    ours, theirs = [t[0] for t in twins], [t[1] for t in twins]
                    pair = [(node_runs, node_url, ours), (engine_runs, engine_url, theirs)]
                    for runs, url, prompts in pair if r % 2 == 0 else pair[::-1]:
                        runs.append(level(url, MODEL, n, args.max_tokens, prompts=prompts))
                pairs = [a["aggregate_tps"] / b["aggregate_tps"] for a, b in zip(node_runs, engine_runs, strict=True)]
                rows[n] = {
                    "node_tps": best(node_runs, "aggregate_tps"),
                    "engine_tps": best(engine_runs, "aggregate_tps"),
                    "node_ttft_p50_s": best(node_runs, "ttft_p50_s"),
                    "engine_ttft_p50_s": best(engine_runs, "ttft_p50_s"),
                    # each round's node against the engine run beside it: the box's drift cancels
                    "node_vs_engine_per_round": [round(x, 3) for x in pairs],
                    "node_vs_engine_median_of_rounds": statistics.median(pairs),
                }
                rows[n]["node_vs_engine"] = rows[n]["node_tps"] / rows[n]["engine_tps"]
                print(n, json.dumps(rows[n]), flush=True)
                report["levels"] = rows
                save()
        base = rows[levels[0]]
        for n in levels:
            rows[n]["node_vs_node_1"] = rows[n]["node_tps"] / base["node_tps"]
        report["levels"] = rows
        if 4 in rows:
            report["ttft_4_vs_1"] = rows[4]["node_ttft_p50_s"] / base["node_ttft_p50_s"]
        fmt = {"type": "json_schema", "json_schema": {"name": "topic", "schema": SCHEMA}}
        plain = [stream_once(node_url, MODEL, args.max_tokens) for _ in range(3)]
        constrained = [stream_once(node_url, MODEL, args.max_tokens, {"response_format": fmt}) for _ in range(3)]
        report["constrained_vs_plain"] = best(constrained, "decode_tps") / best(plain, "decode_tps")
        print("constrained/plain", report["constrained_vs_plain"], flush=True)
        save()
        if args.burst:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(32) as pool:
                runs = list(pool.map(lambda _: stream_once(node_url, MODEL, 256), range(32)))
            report["burst_32x256"] = {
                "completed": len(runs),
                "wall_s": time.perf_counter() - t0,
                "tokens": sum(r["tokens"] for r in runs),
            }
            print("burst", report["burst_32x256"], flush=True)
            save()
    finally:
        node.stop()
    report["micro_batches"] = micro_batches(gguf)
    print("micro-batches", report["micro_batches"], flush=True)
    if not args.no_spec:
        report["speculative"] = speculative(models_dir, args.max_tokens)
        print("speculative", report["speculative"], flush=True)
    save()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
