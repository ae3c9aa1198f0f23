"""apply() and the master's command handling, before and after the [seams] refactor, in one run.

Run: ``python bench/bench_decide.py [--requests N] [--before COMMIT]``; prints JSON.

"After" is this checkout: the pure ``decide(state, command, view)`` plus ``apply()`` of the events
it returns, for the command mix of a busy node (per request: TextGeneration, then FinishTask).
"Before" is the same mix through the landed master's handlers (``Master._cmd_TextGeneration``,
``Master._cmd_TaskFinished``, which decided and indexed in one async function) at COMMIT (default:
the commit before the refactor), checked out into a temporary git worktree and run in a subprocess
with its own kernel, against a node stub whose transport and log do nothing. apply() throughput is
measured in both trees with the same event mix (``bench_apply.make_log``). Ratios are after/before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "b977293"

APPLY_SNIPPET = """
import json, sys, time
sys.path.insert(0, "{root}/bench")
import bench_apply
from skulk_kernel.apply import apply
from skulk_kernel.state import State
log = bench_apply.make_log({events})
t = time.perf_counter(); s = State()
for e in log: s = apply(s, e)
print(json.dumps({{"apply_per_s": len(log) / (time.perf_counter() - t)}}))
"""

BEFORE_MASTER_SNIPPET = """
import asyncio, json, sys, time
sys.path[:0] = ["{root}/kernel/src", "{root}/plugins/master/src"]
from datetime import UTC, datetime
from skulk_kernel import commands as cmd, events as ev
from skulk_kernel.apply import apply
from skulk_kernel.instances import MlxRingInstance, PipelineShardMetadata, RunnerReady, ShardAssignments
from skulk_kernel.state import State
from skulk_kernel.tasks import ChatMessage, TextGenerationParams
from skulk_master.sequencer import Master
from skulk_master.plugin import MasterConfig

class Nothing:
    def append(self, *a): pass
class Hooks:
    def call(self, *a, **k): return []
class Node:
    node_id = "a"; planners = {{}}; hooks = Hooks()
    def reachable_nodes(self): return {{"a"}}
    async def publish(self, *a): pass
    async def send_chunk(self, *a): pass

master = Master(Node(), MasterConfig())
shard = PipelineShardMetadata(model_id="m", device_rank=0, world_size=1, start_layer=0, end_layer=30, n_layers=30,
                              backend="llama_server-cpu")
inst = MlxRingInstance(instance_id="i", engine="llama_server", context_limit=8192,
                       shard_assignments=ShardAssignments(model_id="m", runner_to_shard={{"r": shard}},
                                                          node_to_runner={{"a": "r"}}))
at = datetime(2026, 12, 1, tzinfo=UTC)
for i, e in enumerate([ev.InstanceCreated(instance=inst), ev.RunnerStatusUpdated(runner_id="r", status=RunnerReady())]):
    master.state = apply(master.state, ev.IndexedEvent(idx=i, origin="a", at=at, event=e))
params = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),))
gens = [cmd.TextGeneration(command_id=f"c{{i}}", owner_node_id="a", params=params) for i in range({requests})]
fins = [cmd.TaskFinished(command_id=f"f{{i}}", task_command_id=f"c{{i}}") for i in range({requests})]

async def main():
    t = time.perf_counter()
    for g, f in zip(gens, fins):
        await master._cmd_TextGeneration(g, "a")
        await master._cmd_TaskFinished(f, "a")
    return 2 * len(gens) / (time.perf_counter() - t)
print(json.dumps({{"commands_per_s": asyncio.run(main())}}))
"""


def run_in(tree: Path, snippet: str) -> dict[str, Any]:
    env = {"PYTHONPATH": f"{tree}/kernel/src:{tree}/plugins/master/src", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(snippet)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark in {tree} failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def decide_after(requests: int) -> float:
    sys.path[:0] = [str(ROOT / "kernel" / "src")]
    from skulk_kernel.api import (
        ChatMessage,
        CommandId,
        DecisionView,
        FinishTask,
        IndexedEvent,
        InstanceCreated,
        InstanceId,
        ModelId,
        NodeId,
        PipelineShardMetadata,
        RingInstance,
        RunnerId,
        RunnerReady,
        RunnerStatusUpdated,
        ShardAssignments,
        State,
        TextGeneration,
        TextGenerationParams,
        apply,
        decide,
    )

    at = datetime(2026, 12, 1, tzinfo=UTC)
    shard = PipelineShardMetadata(
        model_id=ModelId("m"),
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=30,
        n_layers=30,
        backend="llama_server-cpu",
    )
    inst = RingInstance(
        instance_id=InstanceId("i"),
        engine="llama_server",
        context_limit=8192,
        shard_assignments=ShardAssignments(
            model_id=ModelId("m"), runner_to_shard={RunnerId("r"): shard}, node_to_runner={NodeId("a"): RunnerId("r")}
        ),
    )
    state = State()

    def index(state: State, events: tuple[Any, ...]) -> State:
        for e in events:
            state = apply(state, IndexedEvent(idx=state.last_event_applied_idx + 1, origin=NodeId("a"), at=at, event=e))
        return state

    state = index(
        state, (InstanceCreated(instance=inst), RunnerStatusUpdated(runner_id=RunnerId("r"), status=RunnerReady()))
    )
    params = TextGenerationParams(model_id=ModelId("m"), messages=(ChatMessage(role="user", content="hi"),))
    gens = [
        TextGeneration(command_id=CommandId(f"c{i}"), owner_node_id=NodeId("a"), params=params) for i in range(requests)
    ]
    fins = [FinishTask(command_id=CommandId(f"f{i}"), task_command_id=CommandId(f"c{i}")) for i in range(requests)]
    t = time.perf_counter()
    for g, f in zip(gens, fins, strict=True):
        view = DecisionView(master_id="a", now=at, reachable=frozenset({"a"}))  # the shell builds one per command
        state = index(state, decide(state, g, view).events)
        state = index(state, decide(state, f, view).events)
    return 2 * requests / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--events", type=int, default=30000)
    parser.add_argument("--before", default=BEFORE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before],
            check=True,
            capture_output=True,
        )
        try:  # interleaved, best of three: the two trees see the same machine
            apply_before = apply_after = master_before = 0.0
            for _ in range(3):
                apply_before = max(
                    apply_before, run_in(before, APPLY_SNIPPET.format(root=before, events=args.events))["apply_per_s"]
                )
                apply_after = max(
                    apply_after, run_in(ROOT, APPLY_SNIPPET.format(root=ROOT, events=args.events))["apply_per_s"]
                )
                master_before = max(
                    master_before,
                    run_in(before, BEFORE_MASTER_SNIPPET.format(root=before, requests=args.requests))["commands_per_s"],
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
    decide_per_s = max(decide_after(args.requests) for _ in range(3))
    print(
        json.dumps(
            {
                "before": args.before,
                "apply_events_per_s": {
                    "before": round(apply_before),
                    "after": round(apply_after),
                    "ratio": round(apply_after / apply_before, 3),
                },
                "command_handling_per_s": {
                    "before_master_handlers": round(master_before),
                    "after_decide_plus_apply": round(decide_per_s),
                    "ratio": round(decide_per_s / master_before, 3),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
