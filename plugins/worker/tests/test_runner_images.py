"""Images on a chat task: the runner refuses them (a 400) to a session that does not take images
(VisionInput), and hands them to one that does; a vision session whose images never come fails the
task instead of answering from the text alone."""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Any

from skulk_engine_echo.engine import ECHO_MODEL, ECHO_VISION_MODEL, EchoSession, echo_cards
from skulk_kernel.api import (
    SESSION_PROTOCOLS,
    ChatMessage,
    Chunk,
    CommandId,
    ErrorChunk,
    InstanceId,
    ModelId,
    NodeId,
    TaskId,
    TextGenerationParams,
    TextGenerationTask,
    takes_images,
)
from skulk_testing.conformance import make_runner_spec
from skulk_worker.runner import _Serving

IMAGE = b"\x89PNG not really, the runner does not decode"
REF = f"sha256:{hashlib.sha256(IMAGE).hexdigest()}:{len(IMAGE)}"


def task(model: str) -> TextGenerationTask:
    params = TextGenerationParams(
        model_id=ModelId(model), messages=(ChatMessage(role="user", content="what is it", images=(REF,)),)
    )
    return TextGenerationTask(
        task_id=TaskId("t1"),
        command_id=CommandId("c1"),
        instance_id=InstanceId("i1"),
        owner_node_id=NodeId("n1"),
        params=params,
    )


def serve(session: Any, t: TextGenerationTask) -> tuple[str, list[Chunk]]:
    out: queue.Queue[Any] = queue.Queue()
    serving = _Serving(session, session.spec, 4096, 1, out, "echo", frozenset(SESSION_PROTOCOLS))
    serving.cancelled[t.task_id] = threading.Event()
    serving.run_task(t)
    messages = []
    while not out.empty():
        messages.append(out.get())
    return next(m[2] for m in messages if m[0] == "done"), [m[2] for m in messages if m[0] == "chunk"]


def test_a_text_session_is_refused_images_with_a_400() -> None:
    session = EchoSession(make_runner_spec(echo_cards()[ECHO_MODEL]), 0.0)
    assert not takes_images(session)
    status, (chunk,) = serve(session, task(ECHO_MODEL))
    assert status == "Failed" and isinstance(chunk, ErrorChunk) and chunk.code == "invalid_request"
    assert f"model {ECHO_MODEL} does not accept images" in chunk.message


def test_a_vision_session_reads_the_spooled_images(tmp_path: Any, monkeypatch: Any) -> None:
    from skulk_api_control import vision_wire
    from skulk_api_control.uploads import _write_atomically

    monkeypatch.setenv("SKULK_VISION_SPOOL", str(tmp_path))
    session = EchoSession(make_runner_spec(echo_cards(vision_model=True)[ECHO_VISION_MODEL]), 0.0)
    assert takes_images(session)
    t = task(ECHO_VISION_MODEL)
    t = t.model_copy(update={"instance_id": InstanceId(session.spec.instance_id)})
    done, _ = vision_wire.IMAGES.spool_paths(session.spec.instance_id, "c1")
    _write_atomically(done, vision_wire.bundle([IMAGE]))  # what the node's receiver writes once verified
    status, chunks = serve(session, t)
    text = "".join(getattr(c, "text", "") for c in chunks)
    assert status == "Complete" and text == f"image {hashlib.sha256(IMAGE).hexdigest()} {len(IMAGE)} what is it"
    # the images never come (a wrong digest noted by the receiver): the task fails, no text-only answer
    _, error = vision_wire.IMAGES.spool_paths(session.spec.instance_id, "c1")
    _write_atomically(error, b"the images' SHA-256 is wrong")
    status, chunks = serve(session, t)
    assert status == "Failed" and isinstance(chunks[-1], ErrorChunk) and "SHA-256" in chunks[-1].message
    assert not [c for c in chunks if getattr(c, "text", "")]
