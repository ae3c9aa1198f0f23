"""The ComfyUI engine against a loopback server that speaks ComfyUI's protocol (a real subprocess).

The engine is loaded as a runner loads it (`ComfyEngine.load`), which starts the server through
`server_command` in its own process group; each test renders through `generate_video` and checks
what the server received and what came back. Acceptance 2 of issue 19: the job's graph is bound
(the server validates it and records it), progress is reported, cancel interrupts, and a crash of
the server process fails the render with the reason.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest
from skulk_api_media.video_section import VideoSection, resolve
from skulk_kernel.api import ErrorChunk, MediaChunk, MediaParams, ModelId, ProgressChunk
from skulk_testing.conformance import make_runner_spec
from skulk_video_comfyui.cards import comfy_weightless_card
from skulk_video_comfyui.engines import ComfyEngine, ComfySession

SERVER = Path(__file__).with_name("comfy_protocol_server.py")


def options(tmp: Path, *extra: str) -> dict[str, Any]:
    command = [sys.executable, str(SERVER), "--port", "{port}", "--output-dir", "{output_dir}"]
    command += ["--input-dir", "{input_dir}", "--record", str(tmp / "record"), *extra]
    return {"server_command": command, "start_timeout_s": 30.0, "render_timeout_s": 60.0}


def params(seconds: float = 1.0, size: str = "160x96", seed: int = 5) -> MediaParams:
    card = comfy_weightless_card()
    section = VideoSection.model_validate(card.sections["video"])
    resolved = resolve(section, size=size, seconds=seconds, steps=None, has_image=False)
    model = ModelId(card.model_id)
    return MediaParams(
        model_id=model, prompt="a fox", size=size, seconds=seconds, seed=seed, options=resolved.options()
    )


@pytest.fixture
def session_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[ComfySession] = []

    def make(*extra: str, card: Any = None) -> ComfySession:
        spec = make_runner_spec(card or comfy_weightless_card(), options=options(tmp_path, *extra))
        session = ComfyEngine().load(spec, lambda done, total: None)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()


def collect(chunks: Iterator[Any], limit_s: float = 60.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + limit_s
    for chunk in chunks:
        out.append(chunk)
        assert time.monotonic() < deadline, "the render did not end in time"
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_graph_is_bound_progress_rises_and_the_mp4_has_the_asked_frames(session_factory: Any, tmp_path: Path) -> None:
    session = session_factory()
    pid = session.server.process.pid
    request = params(seconds=1.5, size="256x144", seed=0x123456)
    chunks = collect(session.generate_video("cmd-1", request, lambda: False))

    assert [c.seq for c in chunks] == list(range(len(chunks)))
    steps = [c.done for c in chunks if isinstance(c, ProgressChunk) and c.stage.startswith("node")]
    assert steps == [1, 2, 3, 4, 5], steps
    pieces = [c for c in chunks if isinstance(c, MediaChunk)]
    assert pieces and pieces[-1].finish_reason == "stop" and chunks[-1] is pieces[-1]
    data = b"".join(base64.b64decode(p.data) for p in pieces)
    assert hashlib.sha256(data).hexdigest() == pieces[-1].sha256

    (recorded,) = [json.loads(p.read_text()) for p in (tmp_path / "record").glob("*.json")]
    graph = recorded["prompt"]
    frames = request.options["frames"]
    assert graph["1"]["inputs"] == {"width": 256, "height": 144, "batch_size": frames, "color": 0x123456}
    assert graph["3"]["inputs"]["fps"] == 8 and graph["4"]["inputs"]["filename_prefix"].startswith("skulk/")
    assert recorded["client_id"] and recorded["prompt_id"]

    with av.open(io.BytesIO(data)) as container:
        decoded = list(container.decode(video=0))
    assert len(decoded) == frames == 12
    assert (decoded[0].width, decoded[0].height) == (256, 144)

    session.close()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "closing the session must take the server's process group down"


def test_cancel_interrupts_the_running_prompt(session_factory: Any) -> None:
    session = session_factory("--steps", "40", "--step-seconds", "0.25")  # a 10 s render
    flag = threading.Event()
    started = time.monotonic()
    chunks: list[Any] = []
    for chunk in session.generate_video("cmd-2", params(), flag.is_set):
        chunks.append(chunk)
        if isinstance(chunk, ProgressChunk) and chunk.done == 2 and chunk.stage.startswith("node"):
            flag.set()
    elapsed = time.monotonic() - started
    assert chunks[-1].finish_reason == "cancelled"
    assert not any(isinstance(c, MediaChunk) for c in chunks)
    assert elapsed < 5.0, f"cancel took {elapsed:.1f}s: the prompt was not interrupted"
    assert session.server.alive()  # an interrupt stops the render, not the server
    import httpx

    assert httpx.get(f"{session.server.url}/system_stats", trust_env=False).status_code == 200


def test_a_crash_of_the_server_fails_the_render_with_the_reason(session_factory: Any) -> None:
    session = session_factory("--crash-at-step", "2")
    chunks = collect(session.generate_video("cmd-4", params(), lambda: False))
    last = chunks[-1]
    assert isinstance(last, ErrorChunk), last
    assert last.code == "engine_crashed"
    assert "exited with code 17" in last.message and "crashing on demand at step 2" in last.message
    assert any(isinstance(c, ProgressChunk) and c.done == 1 and c.stage.startswith("node") for c in chunks)


def test_a_graph_the_server_refuses_fails_with_its_node_errors(session_factory: Any) -> None:
    card = comfy_weightless_card()
    video = dict(card.sections["video"])
    video.pop("workflow_file")
    video["workflow"] = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}"}},
        "2": {"class_type": "NoSuchNode", "inputs": {"image": ["1", 0]}},
    }
    session = session_factory(card=card.model_copy(update={"sections": {"video": video}}))
    last = collect(session.generate_video("cmd-5", params(), lambda: False))[-1]
    assert isinstance(last, ErrorChunk) and last.code == "engine_failed"
    assert "refused the workflow" in last.message and "NoSuchNode" in last.message
    assert "batch_size" in last.message  # EmptyImage's missing input is named too
    assert session.server.alive()


def test_a_placeholder_the_request_cannot_fill_is_refused_before_sending(session_factory: Any, tmp_path: Path) -> None:
    card = comfy_weightless_card()
    video = dict(card.sections["video"])
    video.pop("workflow_file")
    video["workflow"] = {"1": {"class_type": "LoadImage", "inputs": {"image": "{{image}}"}}}
    session = session_factory(card=card.model_copy(update={"sections": {"video": video}}))
    last = collect(session.generate_video("cmd-6", params(), lambda: False))[-1]
    assert isinstance(last, ErrorChunk) and last.code == "bad_workflow" and "image" in last.message
    assert not (tmp_path / "record").exists()  # nothing reached the server


def test_a_quiet_server_still_yields_progress_so_the_stream_is_not_abandoned(
    session_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import skulk_video_comfyui.engines as engines

    monkeypatch.setattr(engines, "HEARTBEAT_S", 0.3)
    session = session_factory("--steps", "2", "--step-seconds", "1.0")  # a second of silence per step
    chunks = collect(session.generate_video("cmd-7", params(), lambda: False))
    assert any(isinstance(c, ProgressChunk) and c.stage.endswith("(working)") for c in chunks)
    assert isinstance(chunks[-1], MediaChunk) and chunks[-1].finish_reason == "stop"
