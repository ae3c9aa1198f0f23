"""Speculative decoding's draft counts, from each final chunk's stats, add up per runner.

A unit test of the supervisor's chunk path (a stand-in node records what is sent); the counts
themselves come from llama.cpp's timings (plugins/engine-llamacpp/tests/test_speculative.py runs
the real draft pair).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from skulk_kernel.api import CommandId, GenerationStats, TokenChunk
from skulk_worker.supervisor import RunnerSupervisor, _InFlight


class _Node:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_chunk(self, owner: str, chunk: Any) -> None:
        self.sent.append(chunk)


async def test_draft_counts_add_up_per_runner() -> None:
    node = _Node()
    spec: Any = SimpleNamespace(runner_id="r1", shard=SimpleNamespace(device_rank=0))
    sup = RunnerSupervisor(node=node, spec=spec, engine_name="llamacpp", profile=None, context_limit=4096, config=None)  # type: ignore[arg-type]
    for task_id, (drafted, kept) in {"t1": (10, 7), "t2": (6, 6)}.items():
        sup.in_flight[task_id] = _InFlight(task=SimpleNamespace(owner_node_id="api"))
        plain = TokenChunk(command_id=CommandId(task_id), seq=0, text="a")
        final = TokenChunk(
            command_id=CommandId(task_id),
            seq=1,
            text="",
            finish_reason="stop",
            stats=GenerationStats(draft_tokens=drafted, draft_accepted=kept),
        )
        await sup._on_message(("chunk", task_id, plain))
        await sup._on_message(("chunk", task_id, final))
    assert (sup.drafted, sup.draft_accepted) == (16, 13)
    assert len(node.sent) == 4  # the counts are read on the way, every chunk still goes out
