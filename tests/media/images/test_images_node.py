"""Issue [media] images acceptance: the official `openai` SDK against real node processes, a real
diffusers pipeline (tiny, random weights) placed on a second node, so every image crosses the data
plane as verified pieces.

3. A generation returns decodable images of the requested size (PIL), as b64_json and as a URL the
   node serves; the same seed gives the same image, another seed another one; edits too.
4. Bad input is a clear 4xx in OpenAI's error shape: an unknown size, an input that is not an
   image, n out of range, an unknown model; the node keeps serving afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import io

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import MODEL, ImageCluster

pytestmark = pytest.mark.slow
STEPS = {"steps": 4}


def client(cluster: ImageCluster) -> OpenAI:
    return OpenAI(base_url=cluster.api.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def decode(data: bytes, fmt: str = "PNG"):  # -> PIL.Image.Image
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    assert image.format == fmt
    return image


def png_bytes(seed: int, size: tuple[int, int] = (64, 64)) -> bytes:
    from PIL import Image

    pixels = bytes((seed * 37 + i * 11) % 256 for i in range(size[0] * size[1] * 3))
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def generate_b64(cluster: ImageCluster, seed: int, **kwargs) -> list[bytes]:
    result = client(cluster).images.generate(
        model=MODEL,
        prompt="a lighthouse at dusk",
        response_format="b64_json",
        extra_body={"seed": seed, **STEPS},
        **kwargs,
    )
    assert result.data
    return [base64.b64decode(item.b64_json or "") for item in result.data]


def test_the_model_runs_on_the_other_node(image_cluster: ImageCluster) -> None:
    state = image_cluster.api.state()
    placed = [next(iter(w.values())) for w in state["instances"].values()]
    nodes = {
        n
        for inst in placed
        if inst["shardAssignments"]["modelId"] == MODEL
        for n in inst["shardAssignments"]["nodeToRunner"]
    }
    assert nodes == {image_cluster.worker_id}


def test_b64_json_png_of_the_requested_size(image_cluster: ImageCluster) -> None:
    raw = client(image_cluster).images.with_raw_response.generate(
        model=MODEL, prompt="a red fox", size="96x64", n=2, response_format="b64_json", extra_body={"seed": 3, **STEPS}
    )
    result = raw.parse()
    assert result.size == "96x64" and result.output_format == "png"
    images = [base64.b64decode(item.b64_json or "") for item in result.data or []]
    assert len(images) == 2
    for data in images:
        assert decode(data).size == (96, 64)
    assert images[0] != images[1], "n=2 made the same image twice"
    assert raw.headers["x-skulk-steps"] == "4", "a progress chunk per denoising step reached the API node"


def test_same_seed_same_image_other_seed_other_image(image_cluster: ImageCluster) -> None:
    first = generate_b64(image_cluster, seed=11)
    again = generate_b64(image_cluster, seed=11)
    other = generate_b64(image_cluster, seed=12)
    assert hashlib.sha256(first[0]).digest() == hashlib.sha256(again[0]).digest()
    assert first[0] != other[0]
    assert decode(first[0]).size == (64, 64)  # 'size' omitted: the model's native size


def test_url_response_serves_the_image_and_unknown_files_are_404(image_cluster: ImageCluster) -> None:
    result = client(image_cluster).images.generate(
        model=MODEL,
        prompt="a lighthouse at dusk",
        size="64x64",
        response_format="url",
        extra_body={"seed": 11, **STEPS},
    )
    url = (result.data or [])[0].url or ""
    assert url.startswith(image_cluster.api.url + "/v1/images/files/img_")
    fetched = httpx.get(url, timeout=10)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert decode(fetched.content).size == (64, 64)
    assert fetched.content == generate_b64(image_cluster, seed=11)[0], "url and b64_json carry the same image"
    missing = httpx.get(image_cluster.api.url + "/v1/images/files/img_0000.png", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


def test_jpeg_and_webp_output_formats(image_cluster: ImageCluster) -> None:
    for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP")):
        (data,) = generate_b64(image_cluster, seed=5, output_format=fmt)
        assert decode(data, pil).size == (64, 64)


def test_edit_with_an_input_image(image_cluster: ImageCluster) -> None:
    source = png_bytes(1)

    def edit(seed: int, image: bytes) -> bytes:
        result = client(image_cluster).images.edit(
            model=MODEL,
            image=("in.png", image, "image/png"),
            prompt="the same scene at night",
            size="64x64",
            response_format="b64_json",
            extra_body={"seed": seed, "steps": 8, "strength": 0.5},
        )
        return base64.b64decode((result.data or [])[0].b64_json or "")

    out = edit(2, source)
    assert decode(out).size == (64, 64)
    assert edit(2, source) == out, "same seed and input: same edit"
    assert edit(2, png_bytes(9)) != out, "another input image: another edit"


# ------------------------------------------------------------------ bad input: clear 4xx


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    assert "Traceback" not in body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("size", ["1000x7", "1024x1024", "big", "64x63"])
def test_unknown_size_is_400(image_cluster: ImageCluster, size: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(image_cluster).images.generate(model=MODEL, prompt="x", size=size)
    error = error_of(caught.value)
    assert error["param"] == "size" and "WIDTHxHEIGHT" in error["message"] and "64x64" in error["message"]


@pytest.mark.parametrize("n", [0, 5, 11])
def test_n_out_of_range_is_400(image_cluster: ImageCluster, n: int) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(image_cluster).images.generate(model=MODEL, prompt="x", n=n)
    error = error_of(caught.value)
    assert error["param"] == "n" and "from 1 to 4" in error["message"]


def test_unknown_model_is_404(image_cluster: ImageCluster) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(image_cluster).images.generate(model="no-such-image-model", prompt="x")
    error = error_of(caught.value)
    assert error["code"] == "model_not_found" and MODEL in error["message"]


def test_non_image_input_is_400(image_cluster: ImageCluster) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(image_cluster).images.edit(
            model=MODEL, image=("notes.txt", b"hello, not an image", "text/plain"), prompt="x"
        )
    error = error_of(caught.value)
    assert error["param"] == "image" and error["code"] == "invalid_image"


def test_broken_image_behind_a_png_signature_is_400_from_the_runner(image_cluster: ImageCluster) -> None:
    broken = png_bytes(4)[:40] + b"\x00" * 64  # a PNG header, then garbage: only a full decode finds it
    with pytest.raises(openai.BadRequestError) as caught:
        client(image_cluster).images.edit(
            model=MODEL, image=("in.png", broken, "image/png"), prompt="x", extra_body=STEPS
        )
    error = error_of(caught.value)
    assert error["code"] == "invalid_image" and "PNG, JPEG or WebP" in error["message"]


def test_other_bad_bodies_are_400(image_cluster: ImageCluster) -> None:
    api = image_cluster.api.url
    cases = [
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": "x", "response_format": "gif"}, "response_format"),
        ({"model": MODEL, "prompt": "x", "output_format": "bmp"}, "output_format"),
        ({"model": MODEL, "prompt": "x", "n": "two"}, "n"),
    ]
    for body, param in cases:
        response = httpx.post(api + "/v1/images/generations", json=body, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param
    assert httpx.post(api + "/v1/images/generations", content=b"{nope", timeout=30).status_code == 400


def test_the_node_still_serves_after_bad_input(image_cluster: ImageCluster) -> None:
    (data,) = generate_b64(image_cluster, seed=1)
    assert decode(data).size == (64, 64)
    assert image_cluster.api.proc is not None and image_cluster.api.proc.poll() is None
    assert image_cluster.worker.proc is not None and image_cluster.worker.proc.poll() is None


def test_model_may_be_omitted_when_one_image_model_is_placed(image_cluster: ImageCluster) -> None:
    result = client(image_cluster).images.generate(prompt="a fox", extra_body={"seed": 11, **STEPS})
    data = base64.b64decode((result.data or [])[0].b64_json or "")
    assert data == generate_b64(image_cluster, seed=11)[0]
