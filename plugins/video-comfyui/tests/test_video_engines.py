"""The test video engine in process, the workflow binding, and the plugin's conformance."""

from __future__ import annotations

import base64
import io
import threading

import av
import pytest
from skulk_api_media.video_section import VideoSection, resolve
from skulk_kernel.api import MediaChunk, MediaParams, ModelId, ProgressChunk, RunnerSpec
from skulk_testing.conformance import EngineConformance, PluginConformance, make_runner_spec
from skulk_video_comfyui.cards import TEST_VIDEO
from skulk_video_comfyui.cards import test_video_card as bundled_card
from skulk_video_comfyui.engines import TestVideoEngine as VideoEngine
from skulk_video_comfyui.workflow import WorkflowError, bind


class TestVideoComfyPlugin(PluginConformance):
    plugin_name = "video-comfyui"
    hook_owners = ("api-control", "hardware")  # plugin_fits is hardware's hook (hardware needs api-control)


class TestVideoEngineConformance(EngineConformance):
    """A video-only engine: its session implements VideoGenerationSession and nothing of text."""

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> VideoEngine:
        return VideoEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls) -> RunnerSpec:
        return make_runner_spec(bundled_card())


def request(seed: int, seconds: float = 1.0, steps: int | None = None) -> MediaParams:
    section = VideoSection.model_validate(bundled_card().sections["video"])
    resolved = resolve(section, size="160x96", seconds=seconds, steps=steps, has_image=False)
    return MediaParams(model_id=ModelId(TEST_VIDEO), prompt="a fox", seed=seed, options=resolved.options())


@pytest.fixture(scope="module")
def session() -> object:
    return VideoEngine().load(make_runner_spec(bundled_card()), lambda done, total: None)


def render(session: object, params: MediaParams) -> tuple[list[object], bytes]:
    chunks = list(session.generate_video("c1", params, lambda: False))  # type: ignore[attr-defined]
    data = b"".join(base64.b64decode(c.data) for c in chunks if isinstance(c, MediaChunk))
    return chunks, data


def test_same_seed_same_bytes_and_the_asked_frames(session: object) -> None:
    chunks, first = render(session, request(3))
    assert [c.seq for c in chunks] == list(range(len(chunks)))  # type: ignore[attr-defined]
    done = [c.done for c in chunks if isinstance(c, ProgressChunk)]
    assert done == sorted(done) and len(done) >= 4
    assert render(session, request(3))[1] == first
    assert render(session, request(4))[1] != first
    with av.open(io.BytesIO(first)) as container:
        frames = list(container.decode(video=0))
        assert container.streams.audio, "the clip carries its tone"
    assert len(frames) == 13 and (frames[0].width, frames[0].height) == (160, 96)  # 12 fps, 4k+1 grid


def test_cancel_between_steps_ends_the_render_with_nothing_made(session: object) -> None:
    flag = threading.Event()
    chunks = []
    for chunk in session.generate_video("c2", request(3, steps=50), flag.is_set):  # type: ignore[attr-defined]
        chunks.append(chunk)
        if isinstance(chunk, ProgressChunk) and chunk.done >= 3:
            flag.set()
    assert chunks[-1].finish_reason == "cancelled"
    assert not any(isinstance(c, MediaChunk) for c in chunks)


def test_bind_replaces_whole_values_typed_and_refuses_what_it_cannot_fill() -> None:
    template = {"1": {"class_type": "X", "inputs": {"w": "{{width}}", "name": "skulk/{{prefix}}.mp4", "k": [1, 0]}}}
    graph = bind(template, {"width": 160, "prefix": "abc"})
    assert graph["1"]["inputs"] == {"w": 160, "name": "skulk/abc.mp4", "k": [1, 0]}
    assert template["1"]["inputs"]["w"] == "{{width}}"  # the card's template is untouched
    with pytest.raises(WorkflowError, match="prefix"):
        bind(template, {"width": 160})
    with pytest.raises(WorkflowError, match="class_type"):
        bind({"1": {"inputs": {}}}, {})
