"""Video jobs through the API on two real node processes (Zenoh): the test video engine on the second.

`skulk/test-video` is placed on the second node only, so every job sent to the first node crosses
the cluster: the command to the master, the task to the second node's runner, progress and the
MP4's pieces back on the data plane, an input image out to the runner on the data plane. The jobs
are made with the official `openai` SDK (`client.videos`), the way a user would. Each module gets a
fresh SKULK_NETWORK_VERSION; both nodes (process groups, runners included) are killed at the end.

Acceptance 1 and 4 of issue 19.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import openai
import pytest
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
MODEL = "skulk/test-video"

PROFILE = """
[profile]
name = "video-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "store",
           "api-control", "api-media", "video-comfyui"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.video-comfyui]
step_seconds = 0.1
"""


@dataclass
class VideoCluster:
    api: NodeProcess
    worker: NodeProcess
    api_id: str
    worker_id: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.api.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _agreed(nodes: list[NodeProcess]) -> bool:
    views = [n.get("/v1/diagnostics/node").json() for n in nodes]
    masters = {v["runtime"]["masterNodeId"] for v in views}
    return len(masters) == 1 and None not in masters and {len(n.state()["topology"]["nodes"]) for n in nodes} == {2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VideoCluster]:
    tmp = tmp_path_factory.mktemp("video")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_NETWORK_VERSION": f"vid{uuid.uuid4().hex[:10]}", "SKULK_MEDIA_SPOOL": str(tmp / "spool")}
    nodes: list[NodeProcess] = []
    try:
        for i in range(2):
            nodes.append(start_node(str(profile), "--node-name", f"v{i}", home=tmp / f"node{i}", env=env))
        for node in nodes:
            node.wait_api(90)
        api, worker = nodes
        api.wait_until(lambda: _agreed(nodes), 90, "one master and both nodes in the topology")
        api_id, worker_id = api.get("/node_id").json(), worker.get("/node_id").json()
        api.wait_until(
            lambda: (
                api.post("/place_instance", json={"model_id": MODEL, "excluded_nodes": [api_id]}).status_code == 200
            ),
            60,
            "placing the test video model on the second node",
        )
        api.wait_ready(MODEL, 120)
        yield VideoCluster(api=api, worker=worker, api_id=api_id, worker_id=worker_id)
    finally:
        for node in nodes:
            node.stop()
        time.sleep(0.2)


def poll(cluster: VideoCluster, video_id: str, timeout: float = 90) -> tuple[dict[str, Any], list[int]]:
    """Poll the job until it ends; (the final job, every progress value seen)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cluster.api.get(f"/v1/videos/{video_id}").json()
        seen.append(job["progress"])
        if job["status"] in ("completed", "failed", "cancelled"):
            return job, seen
        time.sleep(0.05)
    raise AssertionError(f"video {video_id} did not finish in {timeout}s: {job}")


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    """The error object of an SDK exception (the SDK hands over the body's `error` member)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    return dict(body.get("error", body))


def decode(data: bytes) -> list[Any]:
    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    with av.open(out, mode="w", format="image2pipe") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        array = np.broadcast_to(np.array(rgb, dtype=np.uint8), (height, width, 3)).copy()
        for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def test_a_job_on_the_second_node_progresses_and_makes_the_asked_mp4_deterministically(cluster: VideoCluster) -> None:
    client = cluster.client()
    placed = [
        inst
        for wrapped in cluster.api.state()["instances"].values()
        for inst in wrapped.values()
        if inst["shardAssignments"]["modelId"] == MODEL
    ]
    assert {n for inst in placed for n in inst["shardAssignments"]["nodeToRunner"]} == {cluster.worker_id}

    job = client.videos.create(
        model=MODEL, prompt="a fox in the snow", size="160x96", seconds="2", extra_body={"seed": 7}
    )
    assert job.status in ("queued", "in_progress") and job.model == MODEL and job.size == "160x96"
    final, seen = poll(cluster, job.id)
    assert final["status"] == "completed", final
    assert final["progress"] == 100 and seen == sorted(seen), seen
    assert any(0 < p < 100 for p in seen), f"no progress between 0 and 100 was seen: {seen}"

    first = client.videos.download_content(job.id).read()
    frames = decode(first)
    assert len(frames) == 25 == final["frames"]  # 2 s at 12 fps, snapped up to the 4k+1 grid
    assert frames[0].shape == (96, 160, 3)

    again = client.videos.create(
        model=MODEL, prompt="a fox in the snow", size="160x96", seconds="2", extra_body={"seed": 7}
    )
    assert poll(cluster, again.id)[0]["status"] == "completed"
    assert client.videos.download_content(again.id).read() == first, "the same seed must give the same bytes"

    other = client.videos.create(
        model=MODEL, prompt="a fox in the snow", size="160x96", seconds="2", extra_body={"seed": 8}
    )
    assert poll(cluster, other.id)[0]["status"] == "completed"
    assert client.videos.download_content(other.id).read() != first

    listed = [v.id for v in client.videos.list()]
    assert {job.id, again.id, other.id} <= set(listed)
    deleted = client.videos.delete(job.id)
    assert deleted.deleted and deleted.id == job.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(job.id)
    cluster.api.wait_until(lambda: not cluster.api.state()["tasks"], 30, "finished tasks leave State")


def test_an_input_image_reaches_the_runner_and_becomes_the_first_frame(cluster: VideoCluster) -> None:
    client = cluster.client()
    image = png(64, 48, (250, 20, 30))
    job = client.videos.create(
        model=MODEL,
        prompt="from a still",
        size="160x96",
        seconds="1",
        input_reference=("still.png", image, "image/png"),
    )
    final, _ = poll(cluster, job.id)
    assert final["status"] == "completed", final
    first = decode(client.videos.download_content(job.id).read())[0]
    assert abs(first.reshape(-1, 3).mean(axis=0) - np.array([250, 20, 30])).max() < 20


def test_cancel_stops_a_running_job(cluster: VideoCluster) -> None:
    created = cluster.api.post(
        "/v1/videos", json={"model": MODEL, "prompt": "a long one", "seconds": 1, "steps": 200}
    ).json()  # 200 steps of 0.1 s: 20 s unless cancelled
    video_id = created["id"]
    cluster.api.wait_until(
        lambda: cluster.api.get(f"/v1/videos/{video_id}").json()["progress"] > 0, 30, "the job to make progress"
    )
    started = time.monotonic()
    cancelled = cluster.api.post(f"/v1/videos/{video_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    content = cluster.api.get(f"/v1/videos/{video_id}/content")
    assert content.status_code == 409 and "cancelled" in content.json()["error"]["message"]
    cluster.api.wait_until(lambda: not cluster.api.state()["tasks"], 15, "the cancelled task to leave State")
    assert time.monotonic() - started < 15


def test_bad_input_is_a_clear_4xx(cluster: VideoCluster) -> None:
    client = cluster.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.videos.create(model=MODEL, prompt="x", size="1234x567")
    error = error_of(caught.value)
    assert error["param"] == "size" and error["code"] == "unsupported_size" and "160x96" in error["message"]

    with pytest.raises(openai.BadRequestError) as caught:
        client.videos.create(model=MODEL, prompt="x", seconds="12")  # type: ignore[arg-type]
    error = error_of(caught.value)
    assert error["param"] == "seconds" and "8" in error["message"]

    with pytest.raises(openai.BadRequestError) as caught:
        client.videos.create(
            model=MODEL, prompt="x", input_reference=("notes.txt", b"not an image at all", "text/plain")
        )
    error = error_of(caught.value)
    assert error["param"] == "input_reference" and error["code"] == "invalid_image"

    for call in (
        lambda: client.videos.retrieve("video_does_not_exist"),
        lambda: client.videos.download_content("video_does_not_exist"),
        lambda: client.videos.delete("video_does_not_exist"),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "video_does_not_exist" in str(missing.value)

    with pytest.raises(openai.NotFoundError):
        client.videos.create(model="no/such-model", prompt="x")
    response = cluster.api.post("/v1/videos", json={"model": MODEL})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    response = cluster.api.post("/v1/videos", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert cluster.api.get("/v1/videos").status_code == 200  # the node is fine
