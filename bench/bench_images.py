"""Image generation through the node against the same pipeline called in process, in one run.

    .venv/bin/python bench/bench_images.py [--reps 5] [--steps 10] [--size 64x64]

Two real nodes over Zenoh (an API node and an image node holding the tiny random Stable Diffusion
pipeline, as tests/media/images does), so every image crosses the data plane as verified pieces.
The client is the official `openai` SDK. Reported (medians of --reps, API and in-process runs
alternating so load on the shared box hits both alike):

* `pipeline_s`: the diffusers pipeline called in this process (`pipe(...)` plus the PNG encode);
* `session_s`: the engine's own session in this process (`generate_image`: its thread, a
  ProgressChunk per step, PNG pieces), i.e. the engine's cost without the cluster;
* `api_s`: `client.images.generate(..., response_format="b64_json")` through the API node;
* `api_vs_pipeline`: api_s / pipeline_s (the job overhead as a ratio; 1.0 is none) and
  `overhead_ms`, the difference;
* `first_progress_ms`: time from the request to the first ProgressChunk on the API node (the
  `x-skulk-first-progress-ms` header) against the first step's callback in process.

Prints one JSON object (and writes it to bench/results/images.json).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from skulk_testing.nodes import NodeProcess, start_node  # noqa: E402

from tests.media.images.conftest import MODEL, PROFILE, _master_agreed, build_model, overlay  # noqa: E402


def cluster(tmp: Path, models: Path, threads: int) -> list[NodeProcess]:
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE.replace("{models}", str(models)) + f"threads = {threads}\n")
    env = {"SKULK_NETWORK_VERSION": f"bi{uuid.uuid4().hex[:10]}", "SKULK_DIFFUSERS_SPOOL": str(tmp / "spool")}
    nodes = [start_node(str(profile), "--node-name", f"b{i}", home=tmp / f"n{i}", env=env) for i in range(2)]
    for n in nodes:
        n.wait_api(90)
    api = nodes[0]
    api.wait_until(lambda: _master_agreed(nodes), 90, "master")
    api_id = api.get("/node_id").json()
    api.wait_until(
        lambda: api.post("/place_instance", json={"model_id": MODEL, "excluded_nodes": [api_id]}).status_code == 200,
        60,
        "placing the model",
    )
    api.wait_ready(MODEL, 180)
    return nodes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, in process and in the runner")
    args = parser.parse_args()
    where = overlay()
    tmp = Path(tempfile.mkdtemp(prefix="bench-images-"))
    folder = tmp / "models" / MODEL
    build_model(folder, where)

    import torch
    from diffusers import DiffusionPipeline
    from openai import OpenAI
    from skulk_engine_diffusers.cards import card_for_folder
    from skulk_engine_diffusers.engine import DiffusersEngine
    from skulk_kernel.api import MediaChunk, MediaParams, ModelId, ProgressChunk
    from skulk_testing.conformance import make_runner_spec

    width, height = (int(v) for v in args.size.split("x"))
    torch.set_num_threads(args.threads)  # the runner's setting ([plugins.engine-diffusers] threads)
    pipe = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    card = card_for_folder(folder)
    spec = make_runner_spec(card, folder, backend="diffusers-cpu", options={"threads": args.threads})
    session = DiffusersEngine().load(spec, lambda done, total: None)

    def in_pipeline(seed: int) -> tuple[float, float]:
        first: list[float] = []
        started = time.perf_counter()

        def on_step(p: Any, step: int, t: Any, kw: dict[str, Any]) -> dict[str, Any]:
            first.append(time.perf_counter() - started)
            return kw

        image = pipe(
            "a lighthouse at dusk",
            width=width,
            height=height,
            num_inference_steps=args.steps,
            generator=torch.Generator("cpu").manual_seed(seed),
            callback_on_step_end=on_step,
        ).images[0]
        image.save(io.BytesIO(), format="PNG")
        return time.perf_counter() - started, first[0]

    def in_session(seed: int) -> float:
        params = MediaParams(
            model_id=ModelId(MODEL),
            prompt="a lighthouse at dusk",
            size=args.size,
            seed=seed,
            options={"steps": args.steps},
        )
        started = time.perf_counter()
        chunks = list(session.generate_image("bench", params, lambda: False))
        assert any(isinstance(c, MediaChunk) for c in chunks) and any(isinstance(c, ProgressChunk) for c in chunks)
        return time.perf_counter() - started

    nodes = cluster(tmp, tmp / "models", args.threads)
    try:
        client = OpenAI(base_url=nodes[0].url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def through_api(seed: int) -> tuple[float, float]:
            started = time.perf_counter()
            raw = client.images.with_raw_response.generate(
                model=MODEL,
                prompt="a lighthouse at dusk",
                size=args.size,
                response_format="b64_json",
                extra_body={"seed": seed, "steps": args.steps},
            )
            elapsed = time.perf_counter() - started
            result = raw.parse()
            assert base64.b64decode((result.data or [])[0].b64_json or "")[:4] == b"\x89PNG"
            return elapsed, float(raw.headers["x-skulk-first-progress-ms"]) / 1000

        through_api(0), in_pipeline(0), in_session(0)  # warm both: first calls allocate
        api, api_first, base, base_first, sess = [], [], [], [], []
        for rep in range(args.reps):
            seed = 100 + rep
            a, af = through_api(seed)
            b, bf = in_pipeline(seed)
            s = in_session(seed)
            api.append(a)
            api_first.append(af)
            base.append(b)
            base_first.append(bf)
            sess.append(s)
    finally:
        for node in nodes:
            node.stop()
    pipeline_s, api_s = statistics.median(base), statistics.median(api)
    result = {
        "what": f"{args.size}, {args.steps} steps, tiny random SD pipeline, CPU torch {torch.__version__}",
        "reps": args.reps,
        "pipeline_s": round(pipeline_s, 4),
        "session_s": round(statistics.median(sess), 4),
        "api_s": round(api_s, 4),
        "api_vs_pipeline": round(api_s / pipeline_s, 3),
        "overhead_ms": round((api_s - pipeline_s) * 1000, 1),
        "first_progress_ms_api": round(statistics.median(api_first) * 1000, 1),
        "first_step_ms_in_process": round(statistics.median(base_first) * 1000, 1),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "images.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
