"""Issue [vision] on llama.cpp: a tiny random vision model (a chat GGUF and a projector GGUF written with
the `gguf` package, `skulk_engine_llamacpp.tiny_vision`) added from its folder, placed, and asked with
an image through the official openai SDK.

The store finds the projector beside the GGUF (`[vision] mmproj`, capability `vision`), the engine
starts llama.cpp's server with it, and the image reaches the server as an image_url part: the
prompt then holds the projector's tokens (16 for this model) on top of the text's, which is what
is checked, since a random model's words mean nothing. A text request to the same instance still
serves; the same image to a text-only card is a 400 naming it.
"""

from __future__ import annotations

import base64
import io
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VISION, TEXT = "test/tiny-vision", "test/tiny-chat-text"


@pytest.fixture(scope="module")
def vision_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.tiny import write_tiny_chatml_gguf
    from skulk_engine_llamacpp.tiny_vision import write_tiny_vision_model

    model = write_tiny_vision_model(models_dir / "local" / "tiny-vision")
    chat = write_tiny_chatml_gguf(models_dir / "local" / "tiny-random-chatml-4k.gguf", context_length=4096)
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"vision-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", "--no-default-models", home=tmp_path_factory.mktemp("vision"), env=env)
    try:
        node.wait_api(timeout=60)
        for path, model_id in ((model, VISION), (chat, TEXT)):
            added = node.post("/models/add", json={"path": str(path), "model_id": model_id}, timeout=30)
            assert added.status_code == 200, added.text
        for model_id in (VISION, TEXT):
            place_until_listed(node, model_id)
            node.wait_ready(model_id, timeout=120)
        yield node
    finally:
        node.stop()


def photo(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(out, "PNG")
    return out.getvalue()


def ask(sdk: openai.OpenAI, model: str, image: bytes | None, text: str) -> tuple[str, int, float]:
    """(answer, prompt tokens, seconds to the first token) of one streamed request."""
    content: list[dict[str, object]] = [{"type": "text", "text": text}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    started = time.perf_counter()
    first = 0.0
    answer, prompt = "", 0
    stream = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],  # type: ignore[misc, list-item]
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - started
        answer += "".join(c.delta.content or "" for c in chunk.choices)
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
    return answer, prompt, first


def test_the_card_says_vision_and_the_api_lists_it(vision_node: NodeProcess) -> None:
    listed = {m["id"]: m for m in vision_node.get("/v1/models").json()["data"]}
    assert "vision" in listed[VISION]["capabilities"] and "vision" not in listed[TEXT]["capabilities"]
    show = vision_node.post("/api/show", json={"model": VISION}, timeout=10).json()
    assert "vision" in show["capabilities"]


def test_an_image_reaches_llama_cpp_through_the_projector(vision_node: NodeProcess) -> None:
    from skulk_engine_llamacpp.tiny_vision import IMAGE_TOKENS

    sdk = openai.OpenAI(base_url=vision_node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    text = "what is in the picture?"
    answer, with_image, _ = ask(sdk, VISION, photo(64, 48), text)
    assert answer
    plain_answer, plain, _ = ask(sdk, VISION, None, text)  # a text request to a vision instance serves
    assert plain_answer
    assert with_image - plain >= IMAGE_TOKENS, (with_image, plain)
    two = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(photo(20, 20)).decode()}}
    ] * 2
    both = sdk.chat.completions.create(
        model=VISION,
        messages=[{"role": "user", "content": [*two, {"type": "text", "text": text}]}],
        max_tokens=4,  # type: ignore[list-item]
    )
    assert both.usage is not None and both.usage.prompt_tokens - plain >= 2 * IMAGE_TOKENS
    with pytest.raises(openai.BadRequestError, match=f"model {TEXT} does not accept images"):
        ask(sdk, TEXT, photo(16, 16), text)


def test_time_to_first_token_with_a_one_megapixel_image(vision_node: NodeProcess) -> None:
    """Issue [vision]'s measure: the same request with and without a 1 MP image, in one run."""
    sdk = openai.OpenAI(base_url=vision_node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    image = photo(1152, 864)  # about 1 MP of noise: the largest PNG of that size (no compression wins)
    rows = []
    for i in range(3):
        _, _, plain = ask(sdk, VISION, None, f"run {i}: tell me a story")
        _, _, pictured = ask(sdk, VISION, image, f"run {i}: tell me a story")
        rows.append((plain, pictured))
    plain = sorted(r[0] for r in rows)[1]
    pictured = sorted(r[1] for r in rows)[1]
    print(
        f"\nvision TTFT (median of 3): text {plain * 1000:.1f} ms, with a 1 MP image ({len(image)} bytes PNG) "
        f"{pictured * 1000:.1f} ms, ratio {pictured / plain:.1f}x; "
        f"on the wire: {len(base64.b64encode(image))} bytes of base64 in the request"
    )
    assert pictured < 30  # bounded: the image is decoded, sent and projected in seconds


def test_adding_the_projector_itself_is_a_400(vision_node: NodeProcess, models_dir: Path) -> None:
    projector = models_dir / "local" / "tiny-vision" / "mmproj-tiny-vision.gguf"
    r = vision_node.post("/models/add", json={"path": str(projector), "model_id": "test/not-a-model"}, timeout=30)
    assert r.status_code == 400 and "vision projector" in r.text, r.text
