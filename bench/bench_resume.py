"""Resume after a node's death, replicas and prefix affinity, as ratios measured in one run.

    .venv/bin/python bench/bench_resume.py [--out bench/results/resume.json] [--kills 4]

Real node processes (an API node that is the master, SmolLM2 replicas on worker nodes, llama.cpp,
1 thread), loopback only:

* resume gap: a greedy 200-token stream, kill -9 of the serving node after 50 tokens; the gap is
  the longest pause the client sees around the kill (p50/p99 over `--kills`). Its baseline, in the
  same run, is the cold time to first token of the same continuation prompt (prompt + the
  streamed prefix) on an instance that never saw it: the prefill a resume cannot avoid. The ratio
  is what the failover itself adds. Also: how many resumed answers equal the uninterrupted one.
* aggregate decode tokens/s of 8 concurrent streams with two replicas against one.
* prompt-cache hit rate of multi-turn conversations run concurrently (turns routed to the
  instance that served their earlier turns, from the API node's router), with prefix affinity on
  and off (a second cluster), and the follow-up turns' time to first token in each.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import CHAT_MODEL, MODELS_DIR  # noqa: E402
from tests.resume.conftest import Fabric, make_fabric  # noqa: E402
from tests.resume.test_resume import KILL_AFTER, STORY, TOKENS, chat_deltas, gap_after, streamed  # noqa: E402


def first_token_s(fabric: Fabric, messages: list[dict[str, str]], max_tokens: int = 1) -> float:
    body = {"model": CHAT_MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0, "messages": messages}
    t0 = time.monotonic()
    with httpx.stream("POST", fabric.api.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if chat_deltas(line):
                return time.monotonic() - t0
    return time.monotonic() - t0


def resume_gaps(fabric: Fabric, kills: int) -> dict[str, Any]:
    gaps, colds, identical = [], [], 0
    fabric.replicas(2)
    uninterrupted, *_ = streamed(fabric, "chat", None)
    for _ in range(kills):
        fabric.replicas(2)
        text, times, killed, _ = streamed(fabric, "chat", KILL_AFTER)
        identical += text == uninterrupted
        assert killed is not None
        gaps.append(gap_after(times, killed))
        prefix = text[: fabric.resumes()["lastPrefixChars"]]
        # the same continuation prompt, cold: a nonce in front so no instance has any of it cached
        nonce = uuid.uuid4().hex[:6]
        cold = [{"role": "user", "content": f"[{nonce}] {STORY}"}, {"role": "assistant", "content": prefix}]
        colds.append(first_token_s(fabric, cold))
    q = statistics.quantiles(gaps, n=100, method="inclusive") if len(gaps) > 1 else gaps * 99
    return {
        "gaps_s": [round(g, 3) for g in gaps],
        "gap_p50_s": round(statistics.median(gaps), 3),
        "gap_p99_s": round(q[98], 3),
        "cold_prefill_ttft_p50_s": round(statistics.median(colds), 3),
        "gap_over_cold_prefill": round(statistics.median(gaps) / statistics.median(colds), 2),
        "identical_to_uninterrupted": f"{identical}/{kills}",
    }


def aggregate_tps(fabric: Fabric, streams: int = 8, tokens: int = 64) -> float:
    got: list[int] = []

    def one(i: int) -> None:
        body = {
            "model": CHAT_MODEL,
            "stream": True,
            "max_tokens": tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:6]}] Tell me fact {i} about foxes."}],
        }
        n = 0
        with httpx.stream("POST", fabric.api.url + "/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                n += bool(chat_deltas(line))
        got.append(n)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got) / (time.monotonic() - t0)


def conversations(fabric: Fabric, n: int = 6, turns: int = 3) -> dict[str, Any]:
    """`n` conversations at once, `turns` turns each; follow-up turns' TTFT and the router's hit rate."""
    before = fabric.api.get("/v1/diagnostics/node").json()["routing"]
    follow_ttft: list[float] = []

    def talk(i: int) -> None:
        messages = [{"role": "user", "content": f"[{uuid.uuid4().hex[:6]}] Tell me about animal number {i}. " * 8}]
        for turn in range(turns):
            body = {"model": CHAT_MODEL, "max_tokens": 24, "temperature": 0, "messages": messages}
            if turn:
                follow_ttft.append(first_token_s(fabric, messages))
            answer = fabric.api.post("/v1/chat/completions", json=body, timeout=300).json()
            messages = [
                *messages,
                {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"And what about its habitat, part {turn}?"},
            ]

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = fabric.api.get("/v1/diagnostics/node").json()["routing"]
    known = after["prefixKnown"] - before["prefixKnown"]
    hits = after["affinityHits"] - before["affinityHits"]
    return {
        "turns_with_a_cached_prefix": known,
        "hit_rate": round(hits / known, 3) if known else None,
        "follow_up_ttft_p50_s": round(statistics.median(follow_ttft), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "bench/results/resume.json"))
    parser.add_argument("--kills", type=int, default=4)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    result: dict[str, Any] = {"model": CHAT_MODEL, "tokens": TOKENS, "kill_after": KILL_AFTER}
    fabric = make_fabric(tmp / "on", MODELS_DIR)
    try:
        result["resume"] = resume_gaps(fabric, args.kills)
        print(json.dumps(result["resume"]), flush=True)
        fabric.replicas(2)
        two = aggregate_tps(fabric)
        fabric.replicas(1)
        one = aggregate_tps(fabric)
        result["aggregate_tps"] = {"two_replicas": round(two, 1), "one": round(one, 1), "ratio": round(two / one, 2)}
        print(json.dumps(result["aggregate_tps"]), flush=True)
        fabric.replicas(2)
        result["affinity_on"] = conversations(fabric)
        print(json.dumps(result["affinity_on"]), flush=True)
    finally:
        fabric.cluster.stop()
    fabric = make_fabric(tmp / "off", MODELS_DIR, affinity=False)
    try:
        fabric.replicas(2)
        result["affinity_off"] = conversations(fabric)
        print(json.dumps(result["affinity_off"]), flush=True)
    finally:
        fabric.cluster.stop()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
