"""apply() throughput on a realistic event mix, against msgpack decode of the same events.

Run: ``python bench/bench_apply.py [--events N]``; prints JSON. Also the kernel section of the
suite (``python bench/run.py``), through :func:`run`.

The mix is what a busy single-instance node logs: per request TaskCreated, TaskAcknowledged,
RunnerStatusUpdated(Running/Ready), TaskStatusUpdated(Complete) and TaskDeleted, plus occasional
instance churn. The baseline is decoding the same events from msgpack into plain dicts, the
cheapest thing a follower could do with an event; the ratio says what typed validation plus pure
apply() cost on top of it. A third figure times apply() alone on pre-validated events.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel" / "src"))

import msgpack
from skulk_kernel import events as ev
from skulk_kernel.apply import apply
from skulk_kernel.instances import PipelineShardMetadata, RingInstance, RunnerReady, RunnerRunning, ShardAssignments
from skulk_kernel.state import State
from skulk_kernel.tasks import ChatMessage, SamplingParams, TextGenerationParams, TextGenerationTask


def make_log(n: int) -> list[ev.IndexedEvent]:
    at = datetime(2026, 11, 29, tzinfo=UTC)
    node = "node-a"
    out: list[ev.IndexedEvent] = []

    def add(event: Any) -> None:
        out.append(ev.IndexedEvent(idx=len(out), origin=node, at=at, event=event))

    def instance(i: int) -> RingInstance:
        shard = PipelineShardMetadata(
            model_id="m",
            device_rank=0,
            world_size=1,
            start_layer=0,
            end_layer=30,
            n_layers=30,
            backend="llama_server-cpu",
        )
        return RingInstance(
            instance_id=f"inst-{i}",
            engine="llama_server",
            context_limit=8192,
            shard_assignments=ShardAssignments(
                model_id="m", runner_to_shard={f"r-{i}": shard}, node_to_runner={node: f"r-{i}"}
            ),
        )

    params = TextGenerationParams(
        model_id="m",
        messages=(
            ChatMessage(role="system", content="You are a helpful assistant."),
            ChatMessage(role="user", content="Write a haiku about distributed inference."),
        ),
        sampling=SamplingParams(temperature=0.7, max_tokens=128),
    )
    add(ev.InstanceCreated(instance=instance(0)))
    add(ev.RunnerStatusUpdated(runner_id="r-0", status=RunnerReady()))
    req = 0
    while len(out) < n:
        if req % 500 == 499:  # instance churn
            add(ev.InstanceCreated(instance=instance(req)))
            add(ev.InstanceDeleted(instance_id=f"inst-{req}"))
        tid = f"task-{req}"
        add(
            ev.TaskCreated(
                task=TextGenerationTask(
                    task_id=tid, command_id=tid, instance_id="inst-0", owner_node_id=node, params=params
                )
            )
        )
        add(ev.TaskAcknowledged(task_id=tid))
        add(ev.RunnerStatusUpdated(runner_id="r-0", status=RunnerRunning()))
        add(ev.TaskStatusUpdated(task_id=tid, status="Complete"))
        add(ev.TaskDeleted(task_id=tid))
        add(ev.RunnerStatusUpdated(runner_id="r-0", status=RunnerReady()))
        req += 1
    return out[:n]


def run(events: int = 30_000) -> dict[str, Any]:
    """The benchmark as a function (the suite's kernel section calls it); returns the JSON result."""
    log = make_log(events)
    packed = [msgpack.packb(e.wire()) for e in log]

    t = time.perf_counter()
    for blob in packed:
        msgpack.unpackb(blob)
    baseline = time.perf_counter() - t

    t = time.perf_counter()
    state = State()
    for blob in packed:
        state = apply(state, ev.IndexedEvent.model_validate(msgpack.unpackb(blob)))
    full = time.perf_counter() - t

    t = time.perf_counter()
    state2 = State()
    for indexed in log:
        state2 = apply(state2, indexed)
    apply_only = time.perf_counter() - t
    assert state.state_hash() == state2.state_hash()

    n = len(log)
    return {
        "events": n,
        "baseline_msgpack_decode_per_s": round(n / baseline),
        "decode_validate_apply_per_s": round(n / full),
        "apply_only_per_s": round(n / apply_only),
        "ratio_decode_validate_apply_vs_baseline": round(baseline / full, 4),
        "ratio_apply_only_vs_baseline": round(baseline / apply_only, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=30_000)
    args = parser.parse_args()
    print(json.dumps(run(args.events), indent=2))


if __name__ == "__main__":
    main()
