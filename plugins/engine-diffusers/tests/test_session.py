"""The engine's session on a real (tiny, random) diffusers pipeline in process: the chunk rules,
a progress chunk per step, determinism by seed, and cancellation between steps."""

from __future__ import annotations

import sys

import pytest
from skulk_kernel.api import (
    EmbeddingSession,
    EngineSession,
    ErrorChunk,
    ImageGenerationSession,
    MediaChunk,
    MediaParams,
    ModelId,
    ProgressChunk,
    TextGenerationSession,
    VideoGenerationSession,
    is_terminal,
)
from skulk_testing.conformance import make_runner_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory):
    from skulk_engine_diffusers.environment import ensure_diffusers_env

    where = ensure_diffusers_env()
    if where is not None and str(where) not in sys.path:
        sys.path.append(str(where))
    from skulk_engine_diffusers.cards import card_for_folder
    from skulk_engine_diffusers.engine import DiffusersEngine
    from skulk_engine_diffusers.tiny import build_tiny_pipeline

    folder = build_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "tiny-sd")
    spec = make_runner_spec(card_for_folder(folder), folder, backend="diffusers-cpu", options={"threads": 1})
    loaded = DiffusersEngine().load(spec, lambda done, total: None)
    yield loaded
    loaded.close()


def params(seed: int, **options) -> MediaParams:
    return MediaParams(model_id=ModelId("tiny-sd"), prompt="a fox", size="64x64", seed=seed, options=options)


def test_chunk_rules_progress_per_step_and_determinism(session) -> None:
    chunks = list(session.generate_image("c1", params(3, steps=5), lambda: False))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [is_terminal(c) for c in chunks].count(True) == 1 and is_terminal(chunks[-1])
    progress = [c for c in chunks if isinstance(c, ProgressChunk)]
    assert [p.done for p in progress] == [1, 2, 3, 4, 5] and {p.total for p in progress} == {5}
    media = [c for c in chunks if isinstance(c, MediaChunk)]
    assert media and media[-1].sha256 and media[-1].finish_reason == "stop"
    again = [c for c in session.generate_image("c2", params(3, steps=5), lambda: False) if isinstance(c, MediaChunk)]
    assert [m.data for m in again] == [m.data for m in media]
    other = [c for c in session.generate_image("c3", params(4, steps=5), lambda: False) if isinstance(c, MediaChunk)]
    assert [m.data for m in other] != [m.data for m in media]


def test_cancel_stops_between_steps(session) -> None:
    seen: list[object] = []
    chunks = []
    for chunk in session.generate_image("c4", params(1, steps=100), lambda: len(seen) >= 2):
        chunks.append(chunk)
        if isinstance(chunk, ProgressChunk):
            seen.append(chunk)
    assert chunks[-1].finish_reason == "cancelled"
    assert len([c for c in chunks if isinstance(c, ProgressChunk) and c.finish_reason is None]) < 10
    assert not any(isinstance(c, MediaChunk) for c in chunks)


def test_bad_size_and_format_are_caller_errors(session) -> None:
    (chunk,) = list(session.generate_image("c5", params(1).model_copy(update={"size": "63x64"}), lambda: False))
    assert (
        isinstance(chunk, ErrorChunk) and chunk.code == "invalid_size" and chunk.error_type == "invalid_request_error"
    )
    (chunk,) = list(session.generate_image("c6", params(1, output_format="bmp"), lambda: False))
    assert isinstance(chunk, ErrorChunk) and chunk.code == "invalid_request"


def test_the_session_serves_images_only(session) -> None:
    assert isinstance(session, EngineSession) and isinstance(session, ImageGenerationSession)
    for other in (TextGenerationSession, EmbeddingSession, VideoGenerationSession):  # the runner refuses these
        assert not isinstance(session, other)
