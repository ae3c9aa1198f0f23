"""Images in chat requests ([vision] closing note): time to the first token with a 1 MP image against the
same request without it, and the bytes on the wire per image, in one run.

    .venv/bin/python bench/bench_vision.py [--rounds 5] [--out bench/results/vision.json]

Two real nodes (Zenoh on loopback): an API node and a runner node. The runner node serves
`skulk/echo-vision` (the image's path without a model: API-side decode and checks, the data-plane
upload, the runner's digest check) and the tiny random llama.cpp vision model (`tiny_vision`: the
same path plus llama.cpp decoding the image and running the projector). Each round sends, to each
model, the same streamed Chat Completions request without an image, with a 1 MP JPEG (a photo-like
gradient, quality 90) and with a 1 MP PNG of noise (the worst case: nothing compresses), on fresh
prompts (llama.cpp caches prompts). TTFT is client-side, request sent to first content delta;
medians over rounds, ratios against the text-only request of the same round set.

Bytes on the wire per image: the client's request (base64 in JSON), the data-plane pieces the API
node sends to the runner node (the serialized MediaChunk pieces of the upload), and the spans of
one traced request (`api.images_upload` on the API node).
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE = """
[profile]
name = "bench-vision"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "store", "engine-echo", "engine-llamacpp",
           "api-control", "api-openai", "observe"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-echo]
vision_model = true

[plugins.engine-llamacpp]
n_threads = 1
"""
LLAMA = "bench/tiny-vision"
ECHO = "skulk/echo-vision"


def jpeg_photo(width: int, height: int) -> bytes:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], axis=-1)
    rgb = np.clip(rgb + np.random.default_rng(0).normal(0, 12, rgb.shape), 0, 255)  # sensor-like grain
    out = io.BytesIO()
    Image.fromarray(rgb.astype("uint8")).save(out, "JPEG", quality=90)
    return out.getvalue()


def png_noise(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(out, "PNG")
    return out.getvalue()


def ttft(url: str, model: str, text: str, image: bytes | None, mime: str) -> float:
    import httpx

    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if image is not None:
        content.insert(
            0, {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(image).decode()}}
        )
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: HTTP {response.status_code} {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                return time.perf_counter() - started
    raise RuntimeError(f"{model}: no content in the stream")


def wire_bytes(image: bytes) -> dict[str, int]:
    from skulk_api_control import uploads, vision_wire

    pieces = uploads.pieces(vision_wire.IMAGES, "bench-command-id-0000", vision_wire.bundle([image]))
    body = json.dumps(
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}}
    )
    return {
        "file": len(image),
        "client_request_part": len(body),
        "data_plane_pieces": len(pieces),
        "data_plane_bytes": sum(len(p.model_dump_json()) for p in pieces),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "vision.json"))
    args = parser.parse_args()

    from skulk_engine_llamacpp.tiny_vision import write_tiny_vision_model
    from skulk_testing.nodes import start_node

    tmp = Path(tempfile.mkdtemp(prefix="bench-vision-"))
    models = tmp / "models"
    gguf = write_tiny_vision_model(models / "tiny-vision")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {
        "SKULK_NETWORK_VERSION": f"bv{uuid.uuid4().hex[:10]}",
        "SKULK_MODELS_DIR": str(models),
        "HF_HUB_OFFLINE": "1",
    }
    nodes = []
    try:
        for i in range(2):
            nodes.append(start_node(str(profile), "--node-name", f"bv{i}", home=tmp / f"node{i}", env=env))
        for node in nodes:
            node.wait_api(90)
        api, runner = nodes
        api.wait_until(lambda: len(api.state()["topology"]["nodes"]) == 2, 90, "both nodes")
        added = runner.post("/models/add", json={"path": str(gguf), "model_id": LLAMA}, timeout=30)
        assert added.status_code == 200, added.text
        api_id = api.get("/node_id").json()

        def placed(model_id: str) -> bool:
            body = {"model_id": model_id, "excluded_nodes": [api_id]}
            return bool(api.post("/place_instance", json=body).status_code == 200)

        for model in (ECHO, LLAMA):
            api.wait_until(
                functools.partial(placed, model),
                90,
                f"placing {model}",
            )
            api.wait_ready(model, 180)
        images = {
            "jpeg_1mp": (jpeg_photo(1152, 864), "image/jpeg"),
            "png_noise_1mp": (png_noise(1152, 864), "image/png"),
        }
        times: dict[str, dict[str, list[float]]] = {m: {k: [] for k in ("text", *images)} for m in (ECHO, LLAMA)}
        for r in range(args.rounds + 1):  # round 0 warms both paths up and is not counted
            for model in (ECHO, LLAMA):
                row = {"text": ttft(api.url, model, f"round {r} {uuid.uuid4().hex[:6]} say hi", None, "")}
                for name, (data, mime) in images.items():
                    row[name] = ttft(api.url, model, f"round {r} {uuid.uuid4().hex[:6]} say hi", data, mime)
                if r:
                    for k, v in row.items():
                        times[model][k].append(v)
        result: dict[str, Any] = {"rounds": args.rounds, "ttft_ms": {}, "ratio_vs_text": {}, "wire": {}}
        for model, rows in times.items():
            med = {k: statistics.median(v) * 1000 for k, v in rows.items()}
            result["ttft_ms"][model] = {k: round(v, 1) for k, v in med.items()}
            result["ratio_vs_text"][model] = {k: round(med[k] / med["text"], 2) for k in images}
        for name, (data, _) in images.items():
            result["wire"][name] = wire_bytes(data)
        # one traced request: the upload as its own span
        import httpx

        httpx.put(api.url + "/v1/tracing", json={"enabled": True}, timeout=15)
        api.wait_until(lambda: api.get("/v1/tracing").json()["enabled"], 10, "tracing on")
        for name, (data, mime) in images.items():
            url = f"data:{mime};base64," + base64.b64encode(data).decode()
            part = {"type": "image_url", "image_url": {"url": url}}
            body = {"model": ECHO, "messages": [{"role": "user", "content": [part]}]}
            cid = api.post("/v1/chat/completions", json=body, timeout=60).json()["id"].removeprefix("chatcmpl-")
            time.sleep(1.0)
            spans = api.get(f"/v1/traces/{cid}").json().get("spans", [])
            result[f"traced_spans_ms_{name}"] = {
                f"{s['name']}@{'api' if s['node_id'] == api_id else 'runner'}": round(
                    (s["end_ns"] - s["start_ns"]) / 1e6, 2
                )
                for s in spans
            }
        print(json.dumps(result, indent=1))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    main()
