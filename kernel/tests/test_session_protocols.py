"""The engine contract per task kind: a session Protocol for every kind a card or an engine can name,
each with only its own methods, and the vision seam."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

from skulk_kernel import api
from skulk_kernel.tasks import tasks_by_name


def test_every_task_kind_has_its_session_protocol() -> None:
    kinds = set(typing.get_args(api.ModelTask))
    assert set(api.SESSION_PROTOCOLS) == kinds
    assert {name.removesuffix("Task") for name in tasks_by_name} == kinds


def test_task_kind_names_the_kind_engines_declare() -> None:
    ids: dict[str, Any] = {"task_id": "t", "command_id": "c", "instance_id": "i", "owner_node_id": "n"}
    text = api.TextGenerationParams(model_id="m", messages=(api.ChatMessage(role="user", content="hi"),))
    media = api.MediaParams(model_id="m", prompt="a fox")
    speech = api.SpeechParams(model_id="m", input="hi")
    tasks = [
        api.TextGenerationTask(**ids, params=text),
        api.TextEmbeddingTask(**ids, params=api.EmbeddingParams(model_id="m", inputs=("a",))),
        api.SpeechSynthesisTask(**ids, params=speech),
        api.TranscriptionTask(**ids, params=speech),
        api.ImageGenerationTask(**ids, params=media),
        api.VideoGenerationTask(**ids, params=media),
        api.TextRerankTask(**ids, params=api.RerankParams(model_id="m", query="q", documents=("a",))),
    ]
    assert [api.task_kind(t) for t in tasks] == list(api.SESSION_PROTOCOLS)


def test_each_protocol_has_only_its_own_methods() -> None:
    def methods(proto: type) -> set[str]:
        return {name for name in vars(proto) if not name.startswith("_")}

    assert methods(api.EngineSession) == {"close"}
    assert {kind: methods(p) for kind, p in api.SESSION_PROTOCOLS.items()} == {
        "TextGeneration": {"generate", "count_tokens"},
        "TextEmbedding": {"embed"},
        "SpeechSynthesis": {"synthesize"},
        "Transcription": {"transcribe"},
        "ImageGeneration": {"generate_image"},
        "VideoGeneration": {"generate_video"},
        "TextRerank": {"rerank"},
    }


class Speaker:
    def synthesize(self, command_id: str, params: Any, cancelled: Any) -> Iterator[Any]:
        yield from ()

    def close(self) -> None:
        return None


class Reader(Speaker):
    takes_images = True


def test_a_session_is_checked_per_kind() -> None:
    session = Speaker()
    assert isinstance(session, api.EngineSession) and isinstance(session, api.SpeechSynthesisSession)
    assert not isinstance(session, api.TextGenerationSession) and not isinstance(session, api.TranscriptionSession)


def test_vision_input_is_an_opt_in_capability() -> None:
    assert not api.takes_images(Speaker())
    assert api.takes_images(Reader())
    off = Reader()
    off.takes_images = False  # a vision model loaded without its projector
    assert isinstance(off, api.VisionInput) and not api.takes_images(off)
