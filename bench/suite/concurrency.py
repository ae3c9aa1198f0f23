"""Section 3, concurrency: aggregate tok/s and TTFT at 1..16 concurrent streams, per backend.

The serving node runs the model on the backend its profile's placement chose (``llama_server-cpu``
for cpu-llamacpp: llama.cpp's native server, parallel slots). Every other backend the node reports
and the model's card allows (``llama_cpp-cpu``: llama-cpp-python, one request at a time) is measured
on the same node and the same model: the planner's own placement is requested
(``GET /instance/placement``) with the backend rewritten and sent as ``POST /instance``; once it is
ready the previous instance is deleted, so exactly one instance serves each measurement.

At level L, L streams start together (a barrier), each with a fresh prompt; aggregate tok/s is the
batch's tokens over the batch's wall time. Levels below ``min_requests`` repeat the batch so every
level has at least that many requests. The *knee* is the smallest level whose aggregate throughput
is within 10% of the best level's: beyond it more streams only queue (TTFT grows).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from . import nodes
from .common import Section, log, ratio, summarize
from .harness import Bench
from .streams import StreamResult, fresh_prompt, new_client, stream_once

KNEE_SHARE = 0.90


def knee(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest concurrency whose aggregate throughput is within 10% of the peak: past it, more
    streams buy (almost) no throughput, only queueing (TTFT)."""
    points = [(p["concurrency"], p["aggregate_tok_s"], p["ttft_ms"]["p90"]) for p in levels if p["aggregate_tok_s"]]
    if not points:
        return {"concurrency": None, "reached": False}
    peak_level, peak, _ = max(points, key=lambda x: x[1])
    level, thr, ttft_p90 = next(x for x in points if x[1] >= KNEE_SHARE * peak)
    return {
        "concurrency": level,
        "aggregate_tok_s": thr,
        "ttft_ms_p90": ttft_p90,
        "peak_concurrency": peak_level,
        "peak_aggregate_tok_s": peak,
        "reached": level < points[-1][0],
        "definition": f"smallest concurrency with aggregate tok/s >= {KNEE_SHARE:.0%} of the peak",
    }


def batch(url: str, model: str, level: int, max_tokens: int, seed: int) -> tuple[list[StreamResult], float]:
    client = new_client(max_connections=max(8, level * 2))
    barrier = threading.Barrier(level)
    results: list[StreamResult | None] = [None] * level

    def one(i: int) -> None:
        prompt = fresh_prompt(seed + i)
        barrier.wait()
        results[i] = stream_once(client, url, "chat", model, prompt, max_tokens)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(level)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        client.close()
    done = [r for r in results if r is not None]
    start = min(r.started_at for r in done)
    end = max(r.started_at + (r.end_s or 0.0) for r in done)
    return done, end - start


def measure_backend(bench: Bench, backend: str) -> dict[str, Any]:
    s = bench.settings
    node = bench.node
    assert node is not None
    with new_client() as client:
        warm = stream_once(client, node.url, "chat", s.model, fresh_prompt(7), 8)
    out: dict[str, Any] = {"backend": backend, "warmup_ok": warm.ok, "levels": []}
    if not warm.ok or not warm.n_tokens:  # e.g. an engine for another task (test_video) took the text model
        out["error"] = f"the warm-up request produced no tokens on {backend}: {warm.error or 'empty answer'}"[:500]
        return out
    seed = 10_000
    for level in s.concurrency_levels:
        rounds = max(1, math.ceil(s.concurrency_min_requests / level))
        results: list[StreamResult] = []
        tokens = 0
        wall = 0.0
        for _ in range(rounds):
            got, took = batch(node.url, s.model, level, s.concurrency_max_tokens, seed)
            seed += level
            results += got
            tokens += sum(r.n_tokens for r in got if r.ok)
            wall += took
        ok = [r for r in results if r.ok]
        agg = tokens / wall if wall else None
        point: dict[str, Any] = {
            "concurrency": level,
            "requests": len(results),
            "rounds": rounds,
            "errors": len(results) - len(ok),
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "aggregate_tok_s": None if agg is None else round(agg, 2),
            "ttft_ms": summarize([r.ttft_s * 1000 for r in ok if r.ttft_s is not None], 1),
            "per_stream_decode_tok_s": summarize([r.decode_tok_s for r in ok if r.decode_tok_s], 2),
            "backends_seen": sorted({r.backend for r in ok if r.backend}),
            "first_errors": [r.error for r in results if not r.ok][:3],
        }
        log(
            f"   {backend} x{level}: {point['aggregate_tok_s']} tok/s, TTFT p50 {point['ttft_ms']['p50']} ms, "
            f"p90 {point['ttft_ms']['p90']} ms"
        )
        out["levels"].append(point)
    base = out["levels"][0]["aggregate_tok_s"] if out["levels"] else None
    for point in out["levels"]:
        point["scaling_vs_1"] = ratio(point["aggregate_tok_s"], base)
    out["knee"] = knee(out["levels"])
    return out


def run(section: Section, bench: Bench) -> None:
    s = bench.settings
    node = bench.serving_node()
    started_on = nodes.instance_backend(next(iter(nodes.instances_of(node, s.model).values())))
    allowed = _card_backends(s.model)
    others = [b for b in nodes.node_backends(node) if b != started_on and (allowed is None or b in allowed)]
    section.context = {
        "model": bench.model_info,
        "levels": s.concurrency_levels,
        "max_tokens": s.concurrency_max_tokens,
        "min_requests_per_level": s.concurrency_min_requests,
        "started_backend": started_on,
        "other_backends": others,
        "how": "same node and model; other backends via the planner's placement with the backend "
        "rewritten (POST /instance), the previous instance deleted",
        "engine_options": (bench.node_profile.get("config") or {}).get("engine-llamacpp"),
    }
    backends: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for backend in [started_on, *others]:
        try:
            if backend != started_on:
                t0 = time.perf_counter()
                nodes.move_to_backend(node, s.model, backend)
                log(f"   moved {s.model} to {backend} in {time.perf_counter() - t0:.1f} s")
            measured = measure_backend(bench, backend)
        except Exception as exc:
            measured = {"backend": backend, "error": f"{type(exc).__name__}: {exc}"[:500], "levels": []}
        if backend != started_on and not measured.get("warmup_ok", True):
            # a backend of an engine for another task (the dev profile's test_video): not a text backend
            skipped[backend] = measured.get("error", "warm-up failed")
            log(f"   skipped {backend}: {skipped[backend]}")
            continue
        backends[backend] = measured
    others = [b for b in others if b not in skipped]
    section.context["skipped_backends"] = skipped
    section.results["backends"] = backends
    primary = backends.get(started_on, {})
    for backend, data in backends.items():
        k = data.get("knee") or {}
        section.row(
            f"{backend} knee (>= 90% of peak tok/s)",
            k.get("concurrency"),
            "streams",
            goal=None if k.get("reached", False) else "not reached",
        )
        for point in data.get("levels", []):
            section.row(
                f"{backend} x{point['concurrency']} aggregate",
                point["aggregate_tok_s"],
                "tok/s",
                ratio=point.get("scaling_vs_1"),
            )
            section.row(
                f"{backend} x{point['concurrency']} TTFT p50/p90",
                f"{point['ttft_ms']['p50']}/{point['ttft_ms']['p90']}",
                "ms",
            )
        top = data.get("levels", [])[-1:] or [{}]
        unmeasured = data.get("error") or (None if top[0].get("scaling_vs_1") is not None else "no tokens at 1 stream")
        section.add_ratio(
            f"{backend}_scaling_at_{top[0].get('concurrency')}_vs_1",
            top[0].get("scaling_vs_1"),
            f"{backend} aggregate tok/s at concurrency 1",
            note=unmeasured,
        )
    for backend in others:
        data = backends.get(backend, {})
        by_level = {p["concurrency"]: p["aggregate_tok_s"] for p in data.get("levels", [])}
        for point in primary.get("levels", []):
            level = point["concurrency"]
            section.add_ratio(
                f"{backend}_vs_{started_on}_at_{level}",
                ratio(by_level.get(level), point["aggregate_tok_s"]),
                f"{started_on} aggregate tok/s at concurrency {level}",
            )


def _card_backends(model_id: str) -> list[str] | None:
    try:
        from skulk_store.store import bundled_cards
    except ImportError:
        return None
    card = bundled_cards().get(model_id)
    return list(card.compatible_backends) if card is not None and card.compatible_backends else None
