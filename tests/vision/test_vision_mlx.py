"""Issue [vision] acceptance 3 on a node: a tiny random Qwen2-VL (plugins/engine-mlx/tests/tiny_vlm.py) added
from its folder (the store reads its `vision_config`: capability `vision`), placed on engine-mlx, and
asked through the openai SDK with an image and without one. Both answer; the image's tokens show in
the prompt count (the processor read it)."""

from __future__ import annotations

import base64
import io
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VLM = "test/tiny-qwen2-vl"
HELPERS = Path(__file__).resolve().parents[2] / "plugins" / "engine-mlx" / "tests"


@pytest.fixture(scope="module")
def mlx_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("mlx_vlm")
    sys.path.insert(0, str(HELPERS))
    from tiny_vlm import write_tiny_vlm

    folder = write_tiny_vlm(models_dir / "local" / "tiny-qwen2-vl")
    env = {
        "SKULK_MODELS_DIR": str(models_dir),
        "SKULK_NETWORK_VERSION": f"vmlx-{uuid.uuid4().hex[:8]}",
        "HF_HUB_OFFLINE": "1",
    }
    node = start_node("cpu-mlx", "--no-default-models", home=tmp_path_factory.mktemp("vision-mlx"), env=env)
    try:
        node.wait_api(timeout=90)
        added = node.post("/models/add", json={"path": str(folder), "model_id": VLM}, timeout=30)
        assert added.status_code == 200, added.text
        place_until_listed(node, VLM)
        node.wait_ready(VLM, timeout=180)
        yield node
    finally:
        node.stop()


def test_one_image_request_and_one_text_request_on_engine_mlx(mlx_node: NodeProcess) -> None:
    from PIL import Image

    listed = {m["id"]: m for m in mlx_node.get("/v1/models").json()["data"]}
    assert "vision" in listed[VLM]["capabilities"]
    out = io.BytesIO()
    Image.new("RGB", (96, 64), (10, 200, 90)).save(out, "PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    sdk = openai.OpenAI(base_url=mlx_node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    pictured = sdk.chat.completions.create(
        model=VLM,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        max_tokens=4,
    )
    plain = sdk.chat.completions.create(model=VLM, messages=[{"role": "user", "content": "what is it"}], max_tokens=4)
    assert pictured.choices[0].finish_reason in ("stop", "length") and plain.choices[0].finish_reason in (
        "stop",
        "length",
    )
    assert pictured.usage is not None and plain.usage is not None
    assert pictured.usage.prompt_tokens > plain.usage.prompt_tokens  # the image's tokens were read
