"""Issue [vision] acceptance on real node processes: an API node and a second node that runs the models.

`skulk/echo-vision` (engine-echo with `vision_model`) answers with `image <sha256> <bytes>` for each
image, the digest computed in the runner from the bytes it received: so an answer that names the
client's digest proves the same bytes crossed the data plane and were verified on the way. Through
the official SDKs (openai Chat and Responses, anthropic, ollama) an image request streams back; the
text-only `skulk/echo` is a 400 naming the model; bad images are clear 4xx and the node keeps
serving; a traced image request has its upload as its own span.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from PIL import Image
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = pytest.mark.slow

VISION = "skulk/echo-vision"
TEXT = "skulk/echo"

PROFILE = """
[profile]
name = "vision-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "store", "engine-echo", "engine-llamacpp",
           "api-control", "api-openai", "api-anthropic", "api-ollama", "observe"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-echo]
vision_model = true

[plugins.engine-llamacpp]
n_threads = 1
"""
LLAMA = "test/tiny-vision-llama"  # skulk_engine_llamacpp.tiny_vision: a chat GGUF and its projector


def picture(width: int = 64, height: int = 48, fmt: str = "PNG") -> bytes:
    """A noisy image (noise: no encoder shrinks it to nothing)."""
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(out, fmt)
    return out.getvalue()


def seen(image: bytes) -> str:
    return f"image {hashlib.sha256(image).hexdigest()} {len(image)}"


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@dataclass
class VisionCluster:
    api: NodeProcess
    runner: NodeProcess
    api_id: str
    runner_id: str


def _agreed(nodes: list[NodeProcess]) -> bool:
    masters = {n.get("/v1/diagnostics/node").json()["runtime"]["masterNodeId"] for n in nodes}
    return len(masters) == 1 and None not in masters and {len(n.state()["topology"]["nodes"]) for n in nodes} == {2}


@pytest.fixture(scope="module")
def cluster(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VisionCluster]:
    from skulk_engine_llamacpp.tiny_vision import write_tiny_vision_model

    gguf = write_tiny_vision_model(models_dir / "local" / "tiny-vision")
    tmp = tmp_path_factory.mktemp("vision")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {
        "SKULK_NETWORK_VERSION": f"vi{uuid.uuid4().hex[:10]}",
        "SKULK_VISION_SPOOL": str(tmp / "spool"),
        "SKULK_MODELS_DIR": str(models_dir),
        "HF_HUB_OFFLINE": "1",
    }
    nodes: list[NodeProcess] = []
    try:
        for i in range(2):
            nodes.append(start_node(str(profile), "--node-name", f"v{i}", home=tmp / f"node{i}", env=env))
        for node in nodes:
            node.wait_api(90)
        api, runner = nodes
        api.wait_until(lambda: _agreed(nodes), 90, "one master and both nodes in the topology")
        api_id, runner_id = api.get("/node_id").json(), runner.get("/node_id").json()
        added = runner.post("/models/add", json={"path": str(gguf), "model_id": LLAMA}, timeout=30)
        assert added.status_code == 200, added.text
        for model in (VISION, TEXT, LLAMA):
            api.wait_until(
                lambda m=model: (
                    api.post("/place_instance", json={"model_id": m, "excluded_nodes": [api_id]}).status_code == 200
                ),
                60,
                f"placing {model}",
            )
            api.wait_ready(model, 120)
        yield VisionCluster(api, runner, api_id, runner_id)
    finally:
        for node in nodes:
            node.stop()
        time.sleep(0.2)


def test_official_sdks_send_images_to_the_runner_on_the_second_node(cluster: VisionCluster) -> None:
    api = cluster.api
    state = api.state()
    placed = {
        inst["shardAssignments"]["modelId"]: list(inst["shardAssignments"]["nodeToRunner"])
        for inst in (next(iter(w.values())) for w in state["instances"].values())
    }
    assert placed[VISION] == [cluster.runner_id]
    image, jpeg = picture(), picture(fmt="JPEG")
    sdk = openai.OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    # Chat Completions, streamed: two images in one message, in order
    parts = [
        {"type": "text", "text": "what are these?"},
        {"type": "image_url", "image_url": {"url": data_url(image)}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()}},
    ]
    stream = sdk.chat.completions.create(model=VISION, messages=[{"role": "user", "content": parts}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == f"{seen(image)} {seen(jpeg)} what are these?"

    # Responses, streamed
    events = list(
        sdk.responses.create(
            model=VISION,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "describe"},
                        {"type": "input_image", "image_url": data_url(image), "detail": "auto"},
                    ],
                }
            ],
            stream=True,
        )
    )
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == f"{seen(image)} describe"

    # Anthropic Messages, streamed: a base64 image block
    claude = anthropic.Anthropic(base_url=api.url, api_key="unused", max_retries=0, timeout=60)
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()},
    }
    with claude.messages.stream(
        model=VISION,
        max_tokens=64,
        messages=[{"role": "user", "content": [block, {"type": "text", "text": "what is it?"}]}],
    ) as s:
        assert "".join(s.text_stream) == f"{seen(image)} what is it?"

    # Ollama chat, streamed: images as bytes (the client sends base64)
    client = ollama.Client(host=api.url, timeout=60)
    got = "".join(
        part["message"]["content"]
        for part in client.chat(
            model=VISION, messages=[{"role": "user", "content": "and this?", "images": [image]}], stream=True
        )
    )
    assert got == f"{seen(image)} and this?"
    generated = client.generate(model=VISION, prompt="one more", images=[image])
    assert generated["response"] == f"{seen(image)} one more"

    # a WebP is re-encoded once, on the API node: the runner gets a PNG
    webp = picture(fmt="WEBP")
    answer = sdk.chat.completions.create(
        model=VISION,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/webp;base64," + base64.b64encode(webp).decode()},
                    }
                ],
            }
        ],
    )
    assert (
        answer.choices[0].message.content.startswith("image ") and seen(webp) not in answer.choices[0].message.content
    )


def test_a_text_only_model_is_a_400_naming_it_in_every_api(cluster: VisionCluster) -> None:
    api = cluster.api
    image = picture(16, 16)
    sdk = openai.OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    wanted = f"model {TEXT} does not accept images"
    with pytest.raises(openai.BadRequestError, match=wanted):
        sdk.chat.completions.create(
            model=TEXT,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}]}],
            stream=True,
        )
    with pytest.raises(openai.BadRequestError, match=wanted):
        sdk.responses.create(
            model=TEXT, input=[{"role": "user", "content": [{"type": "input_image", "image_url": data_url(image)}]}]
        )
    claude = anthropic.Anthropic(base_url=api.url, api_key="unused", max_retries=0, timeout=60)
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()},
    }
    with pytest.raises(anthropic.BadRequestError, match=wanted):
        claude.messages.create(model=TEXT, max_tokens=8, messages=[{"role": "user", "content": [block]}])
    with pytest.raises(ollama.ResponseError, match=wanted) as caught:
        ollama.Client(host=api.url, timeout=60).chat(
            model=TEXT, messages=[{"role": "user", "content": "x", "images": [image]}]
        )
    assert caught.value.status_code == 400


def test_bad_images_are_clear_4xx_and_the_node_keeps_serving(cluster: VisionCluster) -> None:
    api = cluster.api

    def chat(url: str) -> httpx.Response:
        body = {
            "model": VISION,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        }
        return httpx.post(api.url + "/v1/chat/completions", json=body, timeout=120)

    huge = base64.b64encode(os.urandom(30 * 1024 * 1024)).decode()  # a 30 MB image: past the body limit
    response = chat("data:image/png;base64," + huge)
    assert response.status_code == 413, response.text
    pdf = b"%PDF-1.4\n" + os.urandom(4000)
    response = chat("data:image/png;base64," + base64.b64encode(pdf).decode())
    assert response.status_code == 400 and "not an image" in response.json()["error"]["message"]
    truncated = picture(200, 200)[:-500]
    response = chat(data_url(truncated))
    assert response.status_code == 400 and "truncated" in response.json()["error"]["message"], response.text
    response = chat("https://example.com/cat.png")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "remote_images_off" and "data URL" in error["message"]
    # Anthropic's shape for the same mistake
    body = {
        "model": VISION,
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
            }
        ],
    }
    response = httpx.post(api.url + "/v1/messages", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["type"] == "error", response.text
    # still serving, images and text
    image = picture(32, 32)
    ok = chat(data_url(image))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == seen(image)
    text = httpx.post(
        api.url + "/v1/chat/completions",
        json={"model": VISION, "messages": [{"role": "user", "content": "just text"}]},
        timeout=60,
    )
    assert text.status_code == 200 and text.json()["choices"][0]["message"]["content"] == "just text"


def test_a_traced_image_request_has_its_upload_as_a_span(cluster: VisionCluster) -> None:
    api = cluster.api
    assert httpx.put(api.url + "/v1/tracing", json={"enabled": True}, timeout=15).status_code == 200
    try:
        api.wait_until(lambda: api.get("/v1/tracing").json()["enabled"], 10, "tracing on")
        image = picture(128, 96)
        body = {
            "model": VISION,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}]}],
        }
        response = httpx.post(api.url + "/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200
        trace_id = response.json()["id"].removeprefix("chatcmpl-")
        deadline = time.monotonic() + 15
        names: list[str] = []
        while time.monotonic() < deadline:
            got = api.get(f"/v1/traces/{trace_id}")
            if got.status_code == 200:
                spans = got.json()["spans"]
                names = [s["name"] for s in spans]
                if "api.images_upload" in names and "runner.prefill" in names:
                    break
            time.sleep(0.3)
        upload = next(s for s in spans if s["name"] == "api.images_upload")
        assert upload["attributes"]["images"] == 1 and upload["attributes"]["bytes"] == len(image) + 4
        assert upload["node_id"] == cluster.api_id
        prefill = next(s for s in spans if s["name"] == "runner.prefill")
        assert upload["start_ns"] <= prefill["end_ns"], names
    finally:
        httpx.put(api.url + "/v1/tracing", json={"enabled": False}, timeout=15)


def test_official_sdks_send_images_to_llama_cpp_on_the_second_node(cluster: VisionCluster) -> None:
    """The same through a real engine: llama.cpp's server with the tiny projector, on the runner node.
    The answer is noise; each API's prompt count grows by the projector's tokens for the image."""
    from skulk_engine_llamacpp.tiny_vision import IMAGE_TOKENS

    api = cluster.api
    image = picture(48, 48)
    b64 = base64.b64encode(image).decode()
    sdk = openai.OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def chat(with_image: bool) -> int:
        parts: list[dict[str, object]] = [{"type": "text", "text": "what is this"}]
        if with_image:
            parts.append({"type": "image_url", "image_url": {"url": data_url(image)}})
        stream = sdk.chat.completions.create(
            model=LLAMA,
            messages=[{"role": "user", "content": parts}],  # type: ignore[misc, list-item]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in stream if c.usage is not None]
        return usage[-1].prompt_tokens

    def responses(with_image: bool) -> int:
        parts: list[dict[str, object]] = [{"type": "input_text", "text": "what is this"}]
        if with_image:
            parts.append({"type": "input_image", "image_url": data_url(image), "detail": "auto"})
        events = list(
            sdk.responses.create(
                model=LLAMA,
                input=[{"role": "user", "content": parts}],  # type: ignore[list-item, misc]
                max_output_tokens=4,
                stream=True,
            )
        )
        assert events[-1].type in ("response.completed", "response.incomplete")
        return events[-1].response.usage.input_tokens  # type: ignore[union-attr]

    claude = anthropic.Anthropic(base_url=api.url, api_key="unused", max_retries=0, timeout=60)

    def messages(with_image: bool) -> int:
        blocks: list[dict[str, object]] = [{"type": "text", "text": "what is this"}]
        if with_image:
            blocks.insert(0, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}})
        with claude.messages.stream(
            model=LLAMA,
            max_tokens=4,
            messages=[{"role": "user", "content": blocks}],  # type: ignore[typeddict-item, list-item]
        ) as s:
            "".join(s.text_stream)
            return s.get_final_message().usage.input_tokens

    client = ollama.Client(host=api.url, timeout=60)

    def ollama_chat(with_image: bool) -> int:
        message = {"role": "user", "content": "what is this", **({"images": [image]} if with_image else {})}
        parts = list(client.chat(model=LLAMA, messages=[message], stream=True, options={"num_predict": 4}))
        assert parts[-1]["done"]
        return int(parts[-1]["prompt_eval_count"] or 0)

    for api_name, ask in (("chat", chat), ("responses", responses), ("messages", messages), ("ollama", ollama_chat)):
        with_image, without = ask(True), ask(False)
        assert with_image - without >= IMAGE_TOKENS, (api_name, with_image, without)
