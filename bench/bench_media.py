"""Video jobs through the API against the test video engine called in process, measured in one run.

    .venv/bin/python bench/bench_media.py [--reps 5] [--seconds 2]

Two real nodes over Zenoh (the API node and a second node holding `skulk/test-video`, as
tests/media/test_video_cluster.py does, with no step delay), so every job crosses the cluster:
command to the master, task to the runner, progress and the MP4's pieces back on the data plane.
Reported (medians of --reps; runs alternate API and in-process so load on the shared box hits
both alike):

* time to the first progress event: through the API, from `POST /v1/videos` to the first
  `GET /v1/videos/{id}` showing progress > 0 (polled every 5 ms); in process, from calling
  `generate_video` to its first ProgressChunk;
* job time: through the API, from the POST to the MP4 downloaded from `/content`; in process, the
  whole `generate_video` stream; their ratio and the difference (the job framework's overhead).

Prints one JSON object and writes it to bench/results/media.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from skulk_testing.nodes import NodeProcess, start_node  # noqa: E402

from tests.media.test_video_cluster import MODEL, PROFILE, _agreed  # noqa: E402

SIZE = "256x144"


def cluster(tmp: Path) -> list[NodeProcess]:
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE.replace("step_seconds = 0.1", "step_seconds = 0.0"))
    env = {"SKULK_NETWORK_VERSION": f"bm{uuid.uuid4().hex[:10]}", "SKULK_MEDIA_SPOOL": str(tmp / "spool")}
    nodes = [start_node(str(profile), "--node-name", f"m{i}", home=tmp / f"n{i}", env=env) for i in range(2)]
    for n in nodes:
        n.wait_api(90)
    api = nodes[0]
    api.wait_until(lambda: _agreed(nodes), 90, "master")
    api_id = api.get("/node_id").json()
    api.wait_until(
        lambda: api.post("/place_instance", json={"model_id": MODEL, "excluded_nodes": [api_id]}).status_code == 200,
        60,
        "placement",
    )
    api.wait_ready(MODEL, 120)
    return nodes


def through_api(client: httpx.Client, seconds: float, seed: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    job = client.post("/v1/videos", json={"model": MODEL, "prompt": "bench", "size": SIZE, "seconds": seconds,
                                          "seed": seed}).json()  # fmt: skip
    first = 0.0
    while True:
        state = client.get(f"/v1/videos/{job['id']}").json()
        if not first and state["progress"] > 0:
            first = time.perf_counter() - started
        if state["status"] == "completed":
            break
        if state["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"bench job ended {state['status']}: {state['error']}")
        time.sleep(0.005)
    data = client.get(f"/v1/videos/{job['id']}/content").content
    total = time.perf_counter() - started
    client.delete(f"/v1/videos/{job['id']}")
    return first or total, total, len(data)


def in_process(session: Any, seconds: float, seed: int) -> tuple[float, float, int]:
    from skulk_api_media.video_section import VideoSection, resolve
    from skulk_kernel.api import MediaChunk, MediaParams, ModelId, ProgressChunk
    from skulk_video_comfyui.cards import test_video_card

    section = VideoSection.model_validate(test_video_card().sections["video"])
    resolved = resolve(section, size=SIZE, seconds=seconds, steps=None, has_image=False)
    params = MediaParams(model_id=ModelId(MODEL), prompt="bench", seed=seed, options=resolved.options())
    started = time.perf_counter()
    first = 0.0
    size = 0
    for chunk in session.generate_video("bench", params, lambda: False):
        if not first and isinstance(chunk, ProgressChunk):
            first = time.perf_counter() - started
        if isinstance(chunk, MediaChunk):
            size += len(chunk.data) * 3 // 4
    return first, time.perf_counter() - started, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    from skulk_testing.conformance import make_runner_spec
    from skulk_video_comfyui.cards import test_video_card
    from skulk_video_comfyui.engines import TestVideoEngine

    session = TestVideoEngine().load(make_runner_spec(test_video_card()), lambda d, t: None)
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp:
        nodes = cluster(Path(tmp))
        try:
            api_runs, local_runs = [], []
            with httpx.Client(base_url=nodes[0].url, timeout=120, trust_env=False) as client:
                through_api(client, args.seconds, 0)  # warm: the runner's first encode
                in_process(session, args.seconds, 0)
                for rep in range(args.reps):
                    api_runs.append(through_api(client, args.seconds, rep + 1))
                    local_runs.append(in_process(session, args.seconds, rep + 1))
        finally:
            for node in nodes:
                node.stop()
    med = statistics.median
    api_first, api_total = med(r[0] for r in api_runs), med(r[1] for r in api_runs)
    local_first, local_total = med(r[0] for r in local_runs), med(r[1] for r in local_runs)
    report = {
        "what": f"test video engine, {SIZE}, {args.seconds:g} s at 12 fps, API on a second node vs in process",
        "reps": args.reps,
        "mp4_bytes": api_runs[-1][2],
        "first_progress_ms": {"api": round(api_first * 1e3, 1), "in_process": round(local_first * 1e3, 2)},
        "job_s": {"api": round(api_total, 3), "in_process": round(local_total, 3)},
        "job_ratio_api_vs_in_process": round(api_total / local_total, 3),
        "job_overhead_ms": round((api_total - local_total) * 1e3, 1),
    }
    text = json.dumps(report, indent=1)
    print(text)
    out = ROOT / "bench" / "results" / "media.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
