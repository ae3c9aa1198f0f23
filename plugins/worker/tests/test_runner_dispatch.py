"""The runner serves a task by its kind: the session Protocol for that kind, or a clear ErrorChunk."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from skulk_engine_echo.engine import ECHO_MODEL, EchoSession, echo_cards
from skulk_kernel.api import (
    SESSION_PROTOCOLS,
    AudioChunk,
    ChatMessage,
    Chunk,
    CommandId,
    EmbeddingChunk,
    EmbeddingParams,
    ErrorChunk,
    ImageGenerationTask,
    InstanceId,
    MediaParams,
    ModelId,
    NodeId,
    SpeechParams,
    SpeechSynthesisTask,
    TaskId,
    TextEmbeddingTask,
    TextGenerationParams,
    TextGenerationTask,
    TokenChunk,
    TranscriptionTask,
    VideoGenerationTask,
    task_kind,
)
from skulk_testing.conformance import make_runner_spec
from skulk_worker.runner import _SERVE, _Serving, serving_width

SPEC = make_runner_spec(echo_cards()[ECHO_MODEL])
MODEL = ModelId(ECHO_MODEL)


def ids() -> dict[str, Any]:
    return {
        "task_id": TaskId("t1"),
        "command_id": CommandId("c1"),
        "instance_id": InstanceId("i1"),
        "owner_node_id": NodeId("n1"),
    }


def serve(session: object, task: Any, tasks: frozenset[str] = frozenset(SESSION_PROTOCOLS)) -> tuple[str, list[Chunk]]:
    out: queue.Queue[Any] = queue.Queue()
    serving = _Serving(session, SPEC, 4096, 1, out, "fake", tasks)
    serving.cancelled[task.task_id] = threading.Event()
    serving.run_task(task)
    messages = []
    while not out.empty():
        messages.append(out.get())
    chunks = [m[2] for m in messages if m[0] == "chunk"]
    done = [m[2] for m in messages if m[0] == "done"]
    assert len(done) == 1
    return done[0], chunks


class Speaker:
    """Serves SpeechSynthesis only."""

    def synthesize(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        yield AudioChunk(command_id=CommandId(command_id), seq=0, data="", finish_reason="stop")

    def close(self) -> None:
        return None


def test_every_task_kind_has_a_way_to_be_served() -> None:
    assert _SERVE.keys() == SESSION_PROTOCOLS.keys()
    assert task_kind(TextGenerationTask(**ids(), params=text())) == "TextGeneration"


def text() -> TextGenerationParams:
    return TextGenerationParams(model_id=MODEL, messages=(ChatMessage(role="user", content="hello there"),))


def test_a_text_session_generates_and_embeds() -> None:
    session = EchoSession(SPEC, 0.0)
    status, chunks = serve(session, TextGenerationTask(**ids(), params=text()))
    assert status == "Complete" and isinstance(chunks[-1], TokenChunk)
    status, chunks = serve(session, TextEmbeddingTask(**ids(), params=EmbeddingParams(model_id=MODEL, inputs=("a",))))
    assert status == "Complete" and isinstance(chunks[0], EmbeddingChunk)


def test_a_speech_session_synthesizes() -> None:
    status, chunks = serve(Speaker(), SpeechSynthesisTask(**ids(), params=SpeechParams(model_id=MODEL, input="hi")))
    assert status == "Complete" and isinstance(chunks[-1], AudioChunk)


MEDIA = MediaParams(model_id=MODEL, prompt="a cat")


@pytest.mark.parametrize(
    ("session", "task"),
    [
        (Speaker(), TextGenerationTask(**ids(), params=text())),
        (Speaker(), TextEmbeddingTask(**ids(), params=EmbeddingParams(model_id=MODEL, inputs=("a",)))),
        (Speaker(), TranscriptionTask(**ids(), params=SpeechParams(model_id=MODEL))),
        (EchoSession(SPEC, 0.0), SpeechSynthesisTask(**ids(), params=SpeechParams(model_id=MODEL, input="hi"))),
        (EchoSession(SPEC, 0.0), ImageGenerationTask(**ids(), params=MEDIA)),
        (EchoSession(SPEC, 0.0), VideoGenerationTask(**ids(), params=MEDIA)),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_kind_the_session_does_not_serve_is_a_clear_error(session: object, task: Any) -> None:
    status, chunks = serve(session, task)
    assert status == "Failed"
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    error = chunks[0]
    assert error.message == f"engine fake does not serve {task_kind(task)}"
    assert error.code == "unsupported_task" and error.error_type == "invalid_request_error"
    assert "AttributeError" not in error.message


def test_a_kind_the_engine_does_not_declare_is_refused_even_if_the_session_has_the_method() -> None:
    task = TextEmbeddingTask(**ids(), params=EmbeddingParams(model_id=MODEL, inputs=("a",)))
    status, chunks = serve(EchoSession(SPEC, 0.0), task, frozenset({"TextGeneration"}))
    assert status == "Failed" and isinstance(chunks[0], ErrorChunk)
    assert chunks[0].message == "engine fake does not serve TextEmbedding"


def test_a_session_says_its_own_width_else_the_engine_does() -> None:
    class Wide:
        dispatch_width = 8

    class Narrow:
        dispatch_width = 1

    assert serving_width(Wide(), 1) == 8
    assert serving_width(Narrow(), 8) == 1
    assert serving_width(object(), 4) == 4
