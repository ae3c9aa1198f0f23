"""Issue [vision] acceptance 3: mlx-vlm on engine-mlx. A tiny random Qwen2-VL (tiny_vlm.py) loads through
mlx-vlm's model classes from a card the store wrote (capability `vision`), serves one image request
and one text request, and a request whose image the preprocessor cannot read fails instead of being
answered from its text alone."""

from __future__ import annotations

import hashlib
import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from skulk_kernel.api import ChatMessage, ErrorChunk, SamplingParams, TextGenerationParams, TokenChunk, takes_images
from skulk_testing.conformance import make_runner_spec

# find_spec, not importorskip: importing mlx-vlm at collection imports transformers in every worker,
# which then caches "no torch" for the diffusers engine's tests (they put torch on the path later)
if importlib.util.find_spec("mlx_vlm") is None:
    pytest.skip("mlx-vlm is not installed", allow_module_level=True)

from tiny_vlm import write_tiny_vlm


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from skulk_engine_mlx.engine import MlxEngine
    from skulk_store.cards import card_from_config_json

    folder = write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))
    card = card_from_config_json(folder, "test/tiny-vlm")
    assert "vision" in card.capabilities
    loaded = MlxEngine().load(make_runner_spec(card, folder, backend="mlx-cpu"), lambda done, total: None)
    try:
        yield loaded
    finally:
        loaded.close()


def spool(monkeypatch: pytest.MonkeyPatch, tmp: Path, instance_id: str, command_id: str, images: list[bytes]) -> str:
    """What the node's receiver writes once the images arrived whole; returns the params' references."""
    from skulk_api_control import vision_wire
    from skulk_api_control.uploads import _write_atomically

    monkeypatch.setenv("SKULK_VISION_SPOOL", str(tmp))
    done, _ = vision_wire.IMAGES.spool_paths(instance_id, command_id)
    _write_atomically(done, vision_wire.bundle(images))
    return [vision_wire.ref_of(image) for image in images]  # type: ignore[return-value]


def params(text: str, refs: tuple[str, ...] = ()) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="test/tiny-vlm",
        messages=(ChatMessage(role="user", content=text, images=refs),),
        sampling=SamplingParams(max_tokens=6, temperature=0.0),
    )


def png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(out, "PNG")
    return out.getvalue()


def test_one_image_request_and_one_text_request(session: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert takes_images(session)
    refs = spool(monkeypatch, tmp_path, session.spec.instance_id, "c-image", [png(64, 48)])
    chunks = list(session.generate("c-image", params("what is in the picture", tuple(refs)), lambda: False))
    final = chunks[-1]
    assert isinstance(final, TokenChunk) and final.finish_reason in ("stop", "length"), chunks
    with_image = final.usage.prompt_tokens if final.usage else 0
    text = list(session.generate("c-text", params("what is in the picture"), lambda: False))
    plain = text[-1]
    assert isinstance(plain, TokenChunk) and plain.finish_reason in ("stop", "length"), text
    assert plain.usage is not None and with_image > plain.usage.prompt_tokens  # the image's tokens were read


def test_an_image_the_preprocessor_cannot_read_fails_the_request(
    session: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    garbage = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"x").digest() * 4  # a PNG header, then nothing valid
    refs = spool(monkeypatch, tmp_path, session.spec.instance_id, "c-bad", [garbage])
    chunks = list(session.generate("c-bad", params("what is it", tuple(refs)), lambda: False))
    assert isinstance(chunks[-1], ErrorChunk) and "images" in chunks[-1].message
    assert not [c for c in chunks if isinstance(c, TokenChunk) and c.text]  # nothing from the text alone


def test_a_failing_image_preprocessor_fails_the_request(
    session: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("the preprocessor broke")

    refs = spool(monkeypatch, tmp_path, session.spec.instance_id, "c-broken", [png(32, 32)])
    monkeypatch.setattr(session.processor, "image_processor", broken)
    chunks = list(session.generate("c-broken", params("what is it", tuple(refs)), lambda: False))
    assert isinstance(chunks[-1], ErrorChunk) and "the preprocessor broke" in chunks[-1].message
    assert not [c for c in chunks if isinstance(c, TokenChunk) and c.text]
