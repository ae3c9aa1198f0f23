"""A text completion reaches only a session that serves completions (`CompletionInput`); others get a 400."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from skulk_engine_echo.engine import ECHO_MODEL, EchoSession, echo_cards
from skulk_kernel.api import (
    ChatMessage,
    Chunk,
    CommandId,
    CompletionParams,
    ErrorChunk,
    InstanceId,
    ModelId,
    NodeId,
    PromptChunk,
    TaskId,
    TextGenerationParams,
    TextGenerationTask,
    TokenChunk,
    Usage,
)
from skulk_testing.conformance import make_runner_spec
from skulk_worker.runner import _Serving

SPEC = make_runner_spec(echo_cards()[ECHO_MODEL])


class ChatOnly:
    """A text session with no `serves_completions`: it must never see a completion."""

    def count_tokens(self, params: TextGenerationParams) -> int:
        return 1

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        assert params.completion is None, "a completion reached a session that does not serve them"
        yield TokenChunk(command_id=CommandId(command_id), seq=0, text="", finish_reason="stop", usage=Usage())

    def close(self) -> None:
        return None


def task(completion: CompletionParams | None) -> TextGenerationTask:
    params = TextGenerationParams(
        model_id=ModelId(ECHO_MODEL),
        messages=(ChatMessage(role="user", content="a b"),),
        raw_prompt="a b",
        completion=completion,
    )
    return TextGenerationTask(
        task_id=TaskId("t1"), command_id=CommandId("c1"), instance_id=InstanceId("i1"), owner_node_id=NodeId("n1"),
        params=params,
    )  # fmt: skip


def serve(session: object, t: TextGenerationTask) -> tuple[str, list[Chunk]]:
    out: queue.Queue[Any] = queue.Queue()
    serving = _Serving(session, SPEC, 4096, 1, out, "fake", frozenset({"TextGeneration"}))
    serving.cancelled[t.task_id] = threading.Event()
    serving.run_task(t)
    messages = [out.get() for _ in range(out.qsize())]
    done = [m[2] for m in messages if m[0] == "done"]
    return done[0], [m[2] for m in messages if m[0] == "chunk"]


def test_a_session_without_completions_answers_a_400_naming_model_and_engine() -> None:
    status, chunks = serve(ChatOnly(), task(CompletionParams(echo=True)))
    assert status == "Failed" and len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert chunks[0].code == "invalid_request" and chunks[0].error_type == "invalid_request_error"
    assert chunks[0].message == f"model {ECHO_MODEL} does not support text completions on engine fake"
    assert serve(ChatOnly(), task(None))[0] == "Complete"  # chat turns are untouched


def test_a_session_that_serves_completions_gets_them() -> None:
    status, chunks = serve(EchoSession(SPEC, 0.0), task(CompletionParams(echo=True, generate=False)))
    assert status == "Complete" and isinstance(chunks[0], PromptChunk) and chunks[0].text == "a b"
    assert chunks[-1].finish_reason == "length"
