"""Images on the API node (vision.py) and on the wire (vision_wire.py): decoding, limits, the bundle."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from skulk_api_control import vision, vision_wire
from skulk_api_control.dispatch import InferenceError
from skulk_kernel.api import ChatMessage, ModelCard, TextGenerationParams


def png(width: int = 32, height: int = 24, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, fmt)
    return out.getvalue()


def noise(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


LIMITS = vision_wire.ImageLimits()


def test_png_and_jpeg_travel_as_they_came_and_others_become_png() -> None:
    assert vision.normalize(png(), LIMITS) == png()
    jpeg = png(fmt="JPEG")
    assert vision.normalize(jpeg, LIMITS) == jpeg
    webp = vision.normalize(png(fmt="WEBP"), LIMITS)
    with Image.open(io.BytesIO(webp)) as img:
        assert img.format == "PNG" and img.size == (32, 24)
    out = io.BytesIO()
    Image.new("CMYK", (16, 16), (0, 50, 100, 0)).save(out, "JPEG")  # stb_image (llama.cpp) reads no CMYK
    with Image.open(io.BytesIO(vision.normalize(out.getvalue(), LIMITS))) as img:
        assert img.format == "PNG" and img.mode == "RGB"


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (png()[:-40], 400, "truncated or corrupt"),
        (b"%PDF-1.7 not an image at all" * 10, 400, "not an image"),
        (png(300, 300), 413, "300x300 pixels"),
    ],
)
def test_bad_images_are_4xx_that_say_what_is_wrong(data: bytes, status: int, words: str) -> None:
    limits = vision_wire.ImageLimits(images_max_pixels=200 * 200)
    with pytest.raises(InferenceError) as caught:
        vision.normalize(data, limits)
    assert caught.value.status == status and words in caught.value.message


def test_an_image_over_the_byte_limit_is_413_before_it_is_decoded() -> None:
    limits = vision_wire.ImageLimits(images_max_bytes=2048)
    big = base64.b64encode(b"\0" * 10_000).decode()
    with pytest.raises(InferenceError) as caught:
        asyncio.run(vision._read(big, limits, 0))
    assert caught.value.status == 413 and "at most 2048 bytes" in caught.value.message


def test_remote_urls_are_refused_unless_the_operator_allows_them() -> None:
    with pytest.raises(InferenceError) as caught:
        asyncio.run(vision._read("https://example.invalid/cat.png", LIMITS, 1))
    assert caught.value.status == 400 and caught.value.code == "remote_images_off"
    assert "image 2" in caught.value.message and "images_remote_fetch = true" in caught.value.message
    with pytest.raises(InferenceError, match="data URL's type is application/pdf"):
        asyncio.run(vision._read("data:application/pdf;base64,AAAA", LIMITS, 0))
    with pytest.raises(InferenceError, match="valid base64"):
        asyncio.run(vision._read("not base64 at all!", LIMITS, 0))


def test_the_bundle_verifies_each_image_and_its_order() -> None:
    a, b = png(8, 8), png(16, 8)
    refs = [vision_wire.ref_of(a), vision_wire.ref_of(b)]
    data = vision_wire.bundle([a, b])
    digest, size = vision_wire.declared_refs(refs)
    assert size == len(data) and vision_wire.bundle_digest(data) == digest
    assert vision_wire.unbundle(data) == [a, b]
    assert vision_wire.bundle_digest(vision_wire.bundle([b, a])) != digest  # order counts
    assert vision_wire.bundle_digest(data[:-1]) == ""  # malformed: never equal to a declared digest
    task = SimpleNamespace(params=SimpleNamespace(messages=[SimpleNamespace(images=tuple(refs))]))
    assert vision_wire.declared(task) == (digest, size)


class FakeNode:
    def __init__(self, card: ModelCard, limits: vision_wire.ImageLimits = LIMITS) -> None:
        self.card = card
        self.limits = limits
        self.services: Any = _Services()

    def plugin_config(self, name: str) -> Any:
        return self.limits


class _Services(dict):  # type: ignore[type-arg]
    def publish(self, key: Any, value: Any) -> Any:
        self[key] = value
        return value


def _card(*caps: str) -> ModelCard:
    return ModelCard(model_id="m/v", n_layers=1, hidden_size=8, family="x", storage_size=1, capabilities=caps)


def _params(*images: str) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="m/v", messages=(ChatMessage(role="user", content="what is this?", images=images),)
    )


def test_prepare_turns_sources_into_references_and_holds_the_node_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(_card("text", "vision"))
    monkeypatch.setattr(vision, "resolve_card", lambda n, ref: n.card)
    image = png()
    params, prepared = asyncio.run(vision.prepare(node, _params(data_url(image), base64.b64encode(image).decode())))  # type: ignore[arg-type]
    ref = f"sha256:{hashlib.sha256(image).hexdigest()}:{len(image)}"
    assert params.messages[0].images == (ref, ref)
    assert prepared is not None and vision_wire.unbundle(prepared.data) == [image, image]
    assert node.services[vision.HELD].bytes == len(prepared.data)
    prepared.release()
    prepared.release()
    assert node.services[vision.HELD].bytes == 0
    tight = FakeNode(_card("vision"), vision_wire.ImageLimits(images_max_node_bytes=1024))
    with pytest.raises(InferenceError) as caught:
        asyncio.run(vision.prepare(tight, _params(data_url(noise(64, 64)))))  # type: ignore[arg-type]
    assert caught.value.status == 503


def test_a_model_without_vision_is_a_400_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "resolve_card", lambda n, ref: n.card)
    with pytest.raises(InferenceError) as caught:
        asyncio.run(vision.prepare(FakeNode(_card("text")), _params(data_url(png()))))  # type: ignore[arg-type]
    assert caught.value.status == 400 and "model m/v does not accept images" in caught.value.message
    same, none = asyncio.run(vision.prepare(FakeNode(_card("text")), _params()))  # type: ignore[arg-type]
    assert none is None and same.messages[0].images == ()


def _depth(value: Any) -> int:
    if isinstance(value, (list, dict)):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


_JSON = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(alphabet='ab"\\[]{}', max_size=6)),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet='k"\\[{', max_size=3), children, max_size=3)
    ),
    max_leaves=20,
)


@given(_JSON)
def test_the_body_depth_check_skips_strings_whole(value: Any) -> None:
    """The hardening's depth check reads a 4 MB image body in milliseconds (its string pattern is one
    unrolled loop); brackets and escaped quotes inside strings still do not count."""
    from skulk_api_control.hardening import json_depth

    assert json_depth(json.dumps(value).encode(), 100) == _depth(value)


def test_the_body_depth_check_is_fast_on_an_image_sized_body() -> None:
    import time

    from skulk_api_control.hardening import json_depth, oversized_integer

    body = json.dumps({"messages": [{"content": [{"image_url": {"url": data_url(os.urandom(3_000_000))}}]}]})
    started = time.perf_counter()
    assert json_depth(body.encode(), 64) == 6 and oversized_integer(body.encode()) is None
    assert time.perf_counter() - started < 0.4  # was 1.2 s: one alternation per character, in both scans
    assert oversized_integer(json.dumps({"s": 'x\\"99999999999999999999', "n": 10**20}).encode()) == b"1" + b"0" * 20


@pytest.fixture
def image_server() -> Any:
    """A real HTTP server on loopback: /cat.png (an image), /page.html (not one), /big.png (over the
    limit), /slow.png (answers after the fetch timeout)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    image = png(40, 30)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            kind, body = {
                "/cat.png": ("image/png", image),
                "/page.html": ("text/html", b"<html></html>"),
                "/big.png": ("image/png", b"\0" * 8192),
            }.get(self.path, ("image/png", image))
            if self.path == "/slow.png":
                time.sleep(1.5)
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", image
    finally:
        server.shutdown()
        server.server_close()


def test_remote_fetch_when_allowed_is_bounded_in_size_type_and_time(image_server: Any) -> None:
    base, image = image_server
    limits = vision_wire.ImageLimits(images_remote_fetch=True, images_max_bytes=4096, images_fetch_timeout_s=0.5)
    assert asyncio.run(vision._read(f"{base}/cat.png", limits, 0)) == image
    with pytest.raises(InferenceError, match="text/html, not an image") as caught:
        asyncio.run(vision._read(f"{base}/page.html", limits, 0))
    assert caught.value.status == 400
    with pytest.raises(InferenceError) as caught:
        asyncio.run(vision._read(f"{base}/big.png", limits, 0))
    assert caught.value.status == 413
    with pytest.raises(InferenceError, match=r"did not arrive within 0\.5s") as caught:
        asyncio.run(vision._read(f"{base}/slow.png", limits, 0))
    assert caught.value.status == 408
