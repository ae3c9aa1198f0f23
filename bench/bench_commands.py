"""Control round trip: `node.submit(command) -> Outcome` against the send-and-wait it replaced, in one run.

Run: ``python bench/bench_commands.py [--rounds 300]``; prints JSON. One real node (kernel + master
plugin, in this process, the kernel's local transport) toggles tracing `rounds` times each way,
interleaved: "outcome" awaits `node.submit` (the master's answer, then this node's State holding
the event); "send_and_wait" publishes the command and waits for State to show the change, which is
what the control routes did before [answers]. Both end at the same point (State applied here), so
the ratio is the cost of the outcome message and its bookkeeping. p50/p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from skulk_kernel.api import CommandId, SetTracingEnabled, new_id
from skulk_testing.nodes import in_process_node


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(rounds: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {"outcome": [], "send_and_wait": []}
    with tempfile.TemporaryDirectory() as home:
        async with in_process_node(["master"], home=Path(home)) as node:
            await node.wait_for(lambda s: True, 5)
            enabled = node.state.tracing_enabled
            for _ in range(rounds):
                for way in ("outcome", "send_and_wait"):
                    enabled = not enabled
                    command = SetTracingEnabled(command_id=CommandId(new_id()), enabled=enabled)
                    started = time.perf_counter()
                    if way == "outcome":
                        outcome = await node.submit(command)
                        assert outcome.ok, outcome
                    else:
                        await node.post(command)
                        await node.wait_for(lambda s, want=enabled: s.tracing_enabled == want, 10)
                    timings[way].append((time.perf_counter() - started) * 1000)
    report: dict[str, Any] = {"rounds": rounds}
    for way, values in timings.items():
        report[way] = {
            "p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(_pct(values, 0.99), 3),
            "mean_ms": round(statistics.fmean(values), 3),
        }
    report["ratio_p50"] = round(report["outcome"]["p50_ms"] / report["send_and_wait"]["p50_ms"], 2)
    report["ratio_p99"] = round(report["outcome"]["p99_ms"] / report["send_and_wait"]["p99_ms"], 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.rounds)), indent=2))


if __name__ == "__main__":
    main()
