"""Section 2, serving overhead: the node's API vs the same engine called in-process.

Measured path: this process -> the node's ``/v1/chat/completions`` (SSE) -> kernel -> worker ->
runner subprocess -> ``LlamaServer.chat`` -> llama.cpp's native server.
Baseline: ``LlamaServer(...).chat(...)`` started in this process on the same GGUF with the same
options as the node's runner (the profile's ``[plugins.engine-llamacpp]``: n_threads, n_parallel,
n_ctx, cache_ram_mib), same prompts, same max_tokens, greedy.

Requests alternate node / in-process (the order flips every pair) so a change of load on the shared
machine hits both sides alike; every request has a fresh prompt (llama.cpp keeps a prompt cache),
and each side sees each prompt once. Figures:

* decode ratio: the median over prompts of (node decode tok/s / in-process decode tok/s), long
  answers (a burst of outside load during one request moves one pair, not the median); the
  ratio of the aggregate rates is recorded beside it;
* TTFT overhead: the median over prompts of (node TTFT - in-process TTFT) on short-prompt probes
  (2 tokens), where prompt evaluation is short enough not to drown the serving path's few ms;
  the same difference on the long-prompt pairs is recorded too.
"""

from __future__ import annotations

import time
from typing import Any

from .common import Section, percentile, ratio, summarize
from .harness import Bench
from .streams import FORMATS, StreamResult, decode_rate, fresh_prompt, new_client, short_prompt, stream_once

DECODE_GOAL = 0.95
TTFT_GOAL_MS = 15.0


def _inprocess_engine(bench: Bench) -> tuple[Any, dict[str, Any]]:
    """A LlamaServer started like the node's runner, or raise with the reason it cannot be."""
    from skulk_engine_llamacpp.plugin import LlamaCppConfig
    from skulk_engine_llamacpp.server_backend import LlamaServer

    path = bench.model_file()
    if path is None:
        raise RuntimeError(f"no local model file for {bench.settings.model} under {bench.settings.models_dir}")
    cfg = LlamaCppConfig(**(bench.node_profile.get("config", {}).get("engine-llamacpp") or {}))
    options = {
        "n_parallel": cfg.n_parallel,
        "n_threads": cfg.n_threads,
        "n_ctx": cfg.n_ctx,
        "cache_ram_mib": cfg.cache_ram_mib,
    }
    server = LlamaServer(path, **options).start()
    return server, {"engine": "LlamaServer (xllamacpp) in the bench process", "model_file": str(path), **options}


def inprocess_once(server: Any, prompt: str, max_tokens: int) -> StreamResult:
    from skulk_engine_llamacpp.events import BackendError, Finish, TextDelta

    result = StreamResult()
    texts = []
    t0 = result.started_at = time.perf_counter()
    try:
        for event in server.chat(
            [{"role": "user", "content": prompt}], sampling={"max_tokens": max_tokens, "temperature": 0.0}
        ):
            if isinstance(event, TextDelta):
                if event.text:
                    now = time.perf_counter() - t0
                    if result.ttft_s is None:
                        result.ttft_s = now
                    result.token_times.append(now)
                    texts.append(event.text)
            elif isinstance(event, Finish):
                result.usage_tokens = event.completion_tokens
        result.status = 200
    except BackendError as exc:
        result.error = str(exc)[:500]
    result.end_s = time.perf_counter() - t0
    result.text = "".join(texts)
    result.ok = result.error is None and result.n_tokens > 0
    return result


def _paired(
    client: Any, url: str, model: str, server: Any, max_tokens: int, prompts: list[str]
) -> tuple[list[dict[str, Any]], list[StreamResult], list[StreamResult]]:
    """Each prompt once through the node and once in-process; the order flips every pair."""
    pairs: list[dict[str, Any]] = []
    node_results: list[StreamResult] = []
    base_results: list[StreamResult] = []
    for i, prompt in enumerate(prompts):
        order = ("node", "inprocess") if i % 2 == 0 else ("inprocess", "node")
        got: dict[str, StreamResult] = {}
        for side in order:
            if side == "node":
                got[side] = stream_once(client, url, "chat", model, prompt, max_tokens)
            elif server is not None:
                got[side] = inprocess_once(server, prompt, max_tokens)
        node_results.append(got["node"])
        pair: dict[str, Any] = {"node": got["node"].brief()}
        if "inprocess" in got:
            base_results.append(got["inprocess"])
            pair["inprocess"] = got["inprocess"].brief()
            pair["same_text"] = got["node"].text == got["inprocess"].text
        pairs.append(pair)
    return pairs, node_results, base_results


def _ttft_diffs(pairs: list[dict[str, Any]]) -> list[float]:
    return [
        p["node"]["ttft_ms"] - p["inprocess"]["ttft_ms"]
        for p in pairs
        if p["node"]["ok"] and p.get("inprocess", {}).get("ok")
    ]


def _side(results: list[StreamResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    rate = decode_rate(ok)
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "decode_tok_s": None if rate is None else round(rate, 2),
        "decode_tok_s_per_request": summarize([r.decode_tok_s for r in ok if r.decode_tok_s]),
        "ttft_ms": summarize([r.ttft_s * 1000 for r in ok if r.ttft_s is not None], 2),
        "tokens": summarize([r.n_tokens for r in ok], 1),
        "first_errors": [r.error for r in results if not r.ok][:3],
    }


def run(section: Section, bench: Bench) -> None:
    s = bench.settings
    node = bench.serving_node()
    section.context = {
        "model": bench.model_info,
        "profile": bench.node_profile,
        "node_backend": _node_backend(bench),
        "max_tokens": s.serving_max_tokens,
        "sampling": "greedy (temperature 0), fresh prompt per request",
        "node_ready_after_s": round(bench.node_start_s or 0, 2),
    }
    client = new_client()
    model = s.model

    server, baseline_info = None, None
    skip_reason = None
    if s.skip_inprocess:
        skip_reason = "skipped: --skip-inprocess"
    elif _node_backend(bench) != "llama_server-cpu":
        skip_reason = f"skipped: the in-process baseline is the llama_server engine; node uses {_node_backend(bench)}"
    else:
        try:
            server, baseline_info = _inprocess_engine(bench)
        except Exception as exc:
            skip_reason = f"skipped: in-process engine unavailable: {type(exc).__name__}: {exc}"
    section.context["baseline"] = baseline_info or skip_reason

    try:
        # warm-up: one request each way (connections, first-request allocations); not recorded
        stream_once(client, node.url, "chat", model, fresh_prompt(99), 8)
        if server is not None:
            inprocess_once(server, fresh_prompt(98), 8)

        # 1) decode: long answers, fresh prompts, alternating sides
        pairs, node_results, base_results = _paired(
            client, node.url, model, server, s.serving_max_tokens, [fresh_prompt(i) for i in range(s.serving_pairs)]
        )
        # 2) TTFT probes: a short fresh prompt and 2 tokens, so prompt evaluation (hundreds of ms here,
        #    and noisy on a shared box) does not drown the few ms the serving path adds
        probes, probe_node, probe_base = _paired(
            client, node.url, model, server, 2, [short_prompt(i) for i in range(s.ttft_probes)]
        )

        node_side = _side(node_results)
        section.results["chat_completions"] = node_side
        section.results["pairs"] = pairs
        section.results["ttft_probe"] = {"node": _side(probe_node), "pairs": probes}
        section.row("node decode (/v1/chat/completions)", node_side["decode_tok_s"], "tok/s")
        section.row("node TTFT p50 (long prompt)", node_side["ttft_ms"]["p50"], "ms")
        if server is not None:
            base_side = _side(base_results)
            section.results["inprocess"] = base_side
            section.results["ttft_probe"]["inprocess"] = _side(probe_base)
            per_request = [
                n.decode_tok_s / b.decode_tok_s
                for n, b in zip(node_results, base_results, strict=True)
                if n.decode_tok_s and b.decode_tok_s
            ]
            paired = percentile(per_request, 50)
            decode_ratio = None if paired is None else round(paired, 4)
            section.results["decode_ratio_per_request"] = summarize(per_request, 4)
            section.results["decode_ratio_aggregate"] = ratio(node_side["decode_tok_s"], base_side["decode_tok_s"])
            section.results["same_text_fraction"] = round(
                sum(1 for p in pairs if p.get("same_text")) / max(1, len(pairs)), 3
            )
            long_diffs = _ttft_diffs(pairs)
            diffs = _ttft_diffs(probes)
            overhead = percentile(diffs, 50)
            section.results["ttft_overhead_ms_long_prompt"] = summarize(long_diffs, 2)
            section.results["ttft_overhead_ms"] = summarize(diffs, 2)
            section.results["ttft_overhead_ms_p50"] = None if overhead is None else round(overhead, 2)
            ttft_ratio = percentile(
                [
                    p["node"]["ttft_ms"] / p["inprocess"]["ttft_ms"]
                    for p in probes
                    if p["node"]["ok"] and p.get("inprocess", {}).get("ok")
                ],
                50,
            )
            section.add_ratio(
                "decode_tok_s_node_vs_inprocess",
                decode_ratio,
                "in-process LlamaServer.chat decode tok/s (same prompt, paired)",
                goal=f">= {DECODE_GOAL}",
                met=decode_ratio is not None and decode_ratio >= DECODE_GOAL,
                note=f"median of {len(per_request)} paired ratios; aggregate "
                f"{section.results['decode_ratio_aggregate']}",
            )
            section.add_ratio(
                "ttft_node_vs_inprocess",
                None if ttft_ratio is None else round(ttft_ratio, 4),
                "in-process TTFT (short-prompt probes, paired)",
                goal=f"overhead < {TTFT_GOAL_MS} ms",
                met=overhead is not None and overhead < TTFT_GOAL_MS,
                note=f"absolute overhead p50 {section.results['ttft_overhead_ms_p50']} ms over {len(diffs)} probes",
            )
            section.results["goals"] = {
                "decode_ratio": {
                    "goal": f">= {DECODE_GOAL}",
                    "value": decode_ratio,
                    "met": decode_ratio is not None and decode_ratio >= DECODE_GOAL,
                },
                "ttft_overhead_ms": {
                    "goal": f"< {TTFT_GOAL_MS}",
                    "value": section.results["ttft_overhead_ms_p50"],
                    "met": overhead is not None and overhead < TTFT_GOAL_MS,
                },
            }
            section.row("in-process decode (LlamaServer.chat)", base_side["decode_tok_s"], "tok/s")
            section.row(
                "decode tok/s node / in-process (paired p50)",
                decode_ratio,
                "x",
                ratio=decode_ratio,
                goal=f">= {DECODE_GOAL}",
            )
            section.row(
                "TTFT overhead p50 (probe, node - in-process)",
                section.results["ttft_overhead_ms_p50"],
                "ms",
                baseline=section.results["ttft_probe"]["inprocess"]["ttft_ms"]["p50"],
                ratio=section.ratios["ttft_node_vs_inprocess"]["value"],
                goal=f"< {TTFT_GOAL_MS} ms",
            )
            long_p50 = section.results["ttft_overhead_ms_long_prompt"]["p50"]
            section.row("TTFT overhead p50 (long prompt)", long_p50, "ms", baseline=base_side["ttft_ms"]["p50"])
        else:
            section.results["inprocess"] = None
            section.add_ratio(
                "decode_tok_s_node_vs_inprocess",
                None,
                "in-process LlamaServer.chat decode tok/s",
                goal=f">= {DECODE_GOAL}",
                note=skip_reason,
            )
            section.add_ratio("ttft_node_vs_inprocess", None, "in-process TTFT (short-prompt probes)", note=skip_reason)
            section.results["ttft_overhead_ms_p50"] = None
            section.row("node TTFT p50 (probe)", section.results["ttft_probe"]["node"]["ttft_ms"]["p50"], "ms")

        _formats(section, bench, client)
    finally:
        client.close()
        if server is not None:
            server.close()


def _node_backend(bench: Bench) -> str | None:
    from .nodes import instance_backend, instances_of

    assert bench.node is not None
    insts = instances_of(bench.node, bench.settings.model)
    return instance_backend(next(iter(insts.values()))) if insts else None


def _formats(section: Section, bench: Bench, client: Any) -> None:
    """Per-format decode tok/s and TTFT relative to /v1/chat/completions, round-robin, fresh prompts."""
    s = bench.settings
    node = bench.node
    assert node is not None
    available, missing = [], {}
    for fmt in FORMATS:
        probe = stream_once(client, node.url, fmt, s.model, fresh_prompt(0), 2, timeout=120)
        if probe.ok:
            available.append(fmt)
        else:
            missing[fmt] = f"HTTP {probe.status}: {(probe.error or '')[:160]}"
    per: dict[str, list[StreamResult]] = {fmt: [] for fmt in available}
    for r in range(s.format_rounds):
        order = available[r % len(available) :] + available[: r % len(available)]
        for k, fmt in enumerate(order):
            per[fmt].append(
                stream_once(
                    client, node.url, fmt, s.model, fresh_prompt(1000 + r * 10 + k, topic_index=r), s.serving_max_tokens
                )
            )
    out: dict[str, Any] = {"routes": {f: FORMATS[f] for f in available}, "unavailable": missing, "formats": {}}
    chat_rate = decode_rate([x for x in per.get("chat", []) if x.ok])
    chat_ttft = percentile([x.ttft_s * 1000 for x in per.get("chat", []) if x.ok and x.ttft_s], 50)
    for fmt, results in per.items():
        side = _side(results)
        side["decode_vs_chat"] = ratio(side["decode_tok_s"], None if chat_rate is None else round(chat_rate, 2))
        side["ttft_p50_minus_chat_ms"] = (
            None
            if chat_ttft is None or side["ttft_ms"]["p50"] is None
            else round(side["ttft_ms"]["p50"] - chat_ttft, 2)
        )
        out["formats"][fmt] = side
        if fmt != "chat":
            section.add_ratio(
                f"decode_tok_s_{fmt}_vs_chat",
                side["decode_vs_chat"],
                "/v1/chat/completions decode tok/s (same run, round-robin)",
            )
            section.row(f"decode {FORMATS[fmt]} / chat", side["decode_vs_chat"], "x", ratio=side["decode_vs_chat"])
    for fmt in FORMATS:
        if fmt != "chat" and fmt not in per:
            section.add_ratio(
                f"decode_tok_s_{fmt}_vs_chat",
                None,
                "/v1/chat/completions decode tok/s",
                note=f"skipped: {missing.get(fmt, 'adapter not installed')}",
            )
    section.results["formats"] = out
