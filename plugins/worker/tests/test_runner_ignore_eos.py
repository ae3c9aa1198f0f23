"""`ignore_eos`: honoured by a session that says it can (EosControl), refused with a 400 by the runner
otherwise, never silently ignored (a benchmark asking for 64 tokens got 18-35)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from skulk_engine_echo.engine import ECHO_MODEL, EchoSession, echo_cards
from skulk_kernel.api import (
    SESSION_PROTOCOLS,
    ChatMessage,
    Chunk,
    CommandId,
    ErrorChunk,
    InstanceId,
    ModelId,
    NodeId,
    SamplingParams,
    TaskId,
    TextGenerationParams,
    TextGenerationTask,
    TokenChunk,
    ignores_eos,
)
from skulk_testing.conformance import make_runner_spec
from skulk_worker.runner import _Serving

SPEC = make_runner_spec(echo_cards()[ECHO_MODEL])


def task(ignore_eos: bool, max_tokens: int = 64) -> TextGenerationTask:
    params = TextGenerationParams(
        model_id=ModelId(ECHO_MODEL),
        messages=(ChatMessage(role="user", content="one two three"),),
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
    )
    return TextGenerationTask(
        task_id=TaskId("t1"),
        command_id=CommandId("c1"),
        instance_id=InstanceId("i1"),
        owner_node_id=NodeId("n1"),
        params=params,
    )


def serve(session: object, t: TextGenerationTask) -> tuple[str, list[Chunk]]:
    out: queue.Queue[Any] = queue.Queue()
    serving = _Serving(session, SPEC, 4096, 1, out, "fake", frozenset(SESSION_PROTOCOLS))
    serving.cancelled[t.task_id] = threading.Event()
    serving.run_task(t)
    messages = []
    while not out.empty():
        messages.append(out.get())
    done = [m[2] for m in messages if m[0] == "done"]
    return done[0], [m[2] for m in messages if m[0] == "chunk"]


class PlainSession:
    """A text session that stops at its end-of-text token whatever the request says."""

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        yield TokenChunk(command_id=CommandId(command_id), seq=0, text="hi", finish_reason="stop")

    def count_tokens(self, params: TextGenerationParams) -> int:
        return 3

    def close(self) -> None:
        return None


def test_a_session_without_eos_control_is_refused_with_a_400() -> None:
    assert not ignores_eos(PlainSession())
    status, chunks = serve(PlainSession(), task(ignore_eos=True))
    assert status == "Failed"
    (chunk,) = chunks
    assert isinstance(chunk, ErrorChunk) and chunk.code == "invalid_request"  # the API answers 400
    assert "ignore_eos" in chunk.message and "fake" in chunk.message
    assert serve(PlainSession(), task(ignore_eos=False))[0] == "Complete"  # without it: served


def test_the_echo_engine_generates_exactly_max_tokens() -> None:
    session = EchoSession(SPEC, token_delay_s=0.0)
    assert ignores_eos(session)
    status, chunks = serve(session, task(ignore_eos=True, max_tokens=64))
    assert status == "Complete"
    final = chunks[-1]
    assert isinstance(final, TokenChunk) and final.finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == 64
    assert sum(1 for c in chunks if isinstance(c, TokenChunk) and c.text) == 64
    plain = serve(session, task(ignore_eos=False, max_tokens=64))[1][-1]
    assert isinstance(plain, TokenChunk) and plain.usage is not None and plain.usage.completion_tokens == 3
