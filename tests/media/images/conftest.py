"""Two real node processes over Zenoh for the image acceptance tests: an API node and an image node.

The image model is a real diffusers folder (a tiny Stable Diffusion pipeline with random weights,
`skulk_engine_diffusers.tiny`, built here because no diffusion weights can be had offline), found
by both nodes' diffusers model store and placed on the second node only, so every request to the
first crosses the data plane: the command, an edit's input image as pieces, the images back as
`MediaChunk` pieces. torch and diffusers come from the engine's cached overlay
(`ensure_diffusers_env`, made once per machine, a few minutes the first time). The nodes (process
groups, runners included) are killed at the end whatever happened.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

MODEL = "tiny-sd"

PROFILE = """
[profile]
name = "images-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-diffusers", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-diffusers]
model_dirs = ["{models}"]
max_n = 4
url_ttl_s = 600
"""


@dataclass
class ImageCluster:
    api: NodeProcess
    worker: NodeProcess
    api_id: str
    worker_id: str
    model_dir: Path


def overlay() -> Path | None:
    """The engine's torch/diffusers overlay (made once), also put on this process's path for PIL."""
    from skulk_engine_diffusers.environment import ensure_diffusers_env

    where = ensure_diffusers_env()
    if where is not None and str(where) not in sys.path:
        sys.path.append(str(where))
    return where


def build_model(folder: Path, where: Path | None) -> None:
    """Build the tiny pipeline in a child process, so torch never loads into the test process."""
    setup = f"import sys; sys.path.append({str(where)!r}); " if where is not None else ""
    code = setup + (
        "from pathlib import Path; from skulk_engine_diffusers.tiny import build_tiny_pipeline; "
        f"build_tiny_pipeline(Path({str(folder)!r}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)


def _master_agreed(nodes: list[NodeProcess]) -> bool:
    views = [n.get("/v1/diagnostics/node").json() for n in nodes]
    masters = {v["runtime"]["masterNodeId"] for v in views}
    members = {len(n.state()["topology"]["nodes"]) for n in nodes}
    return len(masters) == 1 and None not in masters and members == {len(nodes)}


@pytest.fixture(scope="module")
def image_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageCluster]:
    tmp = tmp_path_factory.mktemp("images")
    where = overlay()
    models = tmp / "models"
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE.replace("{models}", str(models)))
    env = {"SKULK_NETWORK_VERSION": f"img{uuid.uuid4().hex[:10]}", "SKULK_MEDIA_SPOOL": str(tmp / "spool")}
    nodes: list[NodeProcess] = []
    try:
        for i in range(2):
            nodes.append(start_node(str(profile), "--node-name", f"i{i}", home=tmp / f"node{i}", env=env))
        build_model(models / MODEL, where)  # while the nodes start: their model store reads the folder when asked
        for node in nodes:
            node.wait_api(90)
        api, worker = nodes
        api.wait_until(lambda: _master_agreed(nodes), 90, "one master and both nodes in the topology")
        api_id, worker_id = api.get("/node_id").json(), worker.get("/node_id").json()
        # the image node needs telemetry in before a placement can exclude the API node
        api.wait_until(
            lambda: (
                api.post("/place_instance", json={"model_id": MODEL, "excluded_nodes": [api_id]}).status_code == 200
            ),
            60,
            f"placing {MODEL}",
        )
        api.wait_ready(MODEL, 180)
        yield ImageCluster(api=api, worker=worker, api_id=api_id, worker_id=worker_id, model_dir=models / MODEL)
    finally:
        for node in nodes:
            node.stop()
        time.sleep(0.2)
