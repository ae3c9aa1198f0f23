"""The turn loop's stream plumbing with the model's steps replaced (no node process, no engine):
what a step sends that shows nothing still reaches the client's stream, so a slow step on a busy
node is not abandoned by the API node's idle timeout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_kernel.api import (
    ChatMessage,
    Chunk,
    CommandId,
    NodeId,
    PrefillProgressChunk,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
)
from skulk_steward import harness
from skulk_steward.config import StewardConfig


class Node:
    """What run_turn reads of a node: its id, its open streams, the steward instance, send_chunk."""

    node_id = NodeId("n1")

    def __init__(self) -> None:
        self.sent: list[Chunk] = []
        self.streams = SimpleNamespace(open_ids=lambda: {"outer"})
        model = SimpleNamespace(shard_assignments=SimpleNamespace(model_id="qwen"))
        self.state = SimpleNamespace(instances={"i1": model})

    async def send_chunk(self, node_id: str, chunk: Chunk) -> None:
        self.sent.append(chunk)


class Step:
    def __init__(self, chunks: list[Chunk]) -> None:
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[Chunk]:
        for chunk in self._chunks:
            yield chunk

    async def cancel(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_steps_keep_alives_reach_the_clients_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import skulk_api_control.dispatch as dispatch

    async def start(node: Any, step: TextGeneration, observe: bool) -> Step:
        cid = step.command_id
        return Step(
            [
                PrefillProgressChunk(command_id=cid, seq=0, processed=256, total=900),  # a long prompt read
                TokenChunk(command_id=cid, seq=1, text=""),  # a tool call being written
                TokenChunk(command_id=cid, seq=2, text="Two nodes."),
                TokenChunk(command_id=cid, seq=3, text="", finish_reason="stop"),
            ]
        )

    monkeypatch.setattr(dispatch, "start", start)
    node = Node()
    question = TextGenerationParams(model_id="skulk/steward", messages=(ChatMessage(role="user", content="How many?"),))
    command = TextGeneration(command_id=CommandId("outer"), owner_node_id=node.node_id, params=question)
    await harness.run_turn(node, command, "i1", StewardConfig())  # type: ignore[arg-type]

    sent = [c for c in node.sent if not (isinstance(c, TokenChunk) and c.reasoning)]  # the tool step's reasoning
    assert [type(c).__name__ for c in sent] == ["PrefillProgressChunk", "TokenChunk", "TokenChunk", "TokenChunk"]
    progress, alive, answer, final = sent
    assert isinstance(progress, PrefillProgressChunk) and (progress.processed, progress.total) == (256, 900)
    assert isinstance(alive, TokenChunk) and alive.text == "" and alive.finish_reason is None
    assert isinstance(answer, TokenChunk) and answer.text == "Two nodes."
    assert isinstance(final, TokenChunk) and final.finish_reason == "stop"
    assert [c.seq for c in node.sent] == list(range(len(node.sent)))  # one numbering for the client's stream
    assert all(c.command_id == "outer" for c in node.sent)
