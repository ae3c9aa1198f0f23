"""Run an instance's ranks as separate spawned processes on 127.0.0.1, for tests and benchmarks.

What runners do, without a node: each child builds its RunnerSpec, calls the engine's load()
(which forms the ring group), runs the same greedy generations as every other rank, and reports
its tokens, text and RSS. The parent bounds everything in time and kills every child it started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skulk_kernel.api import (
    ChatMessage,
    ErrorChunk,
    ModelCard,
    PipelineShardMetadata,
    RankGroup,
    RunnerSpec,
    SamplingParams,
    TensorShardMetadata,
    TextGenerationParams,
    TokenChunk,
)

PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a computer is to a child.",
    "List three fruits and their colors.",
    "Tell me a story about a brave little fox.",
)


@dataclass
class RankReport:
    rank: int
    tokens: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rss_after_load: int = 0
    param_bytes: int = 0  # model weights this rank holds
    load_s: float = 0.0
    decode_tps: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    error: str | None = None
    failed_after_s: float | None = None  # how long the failing generation ran before its error


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def layer_ranges(n_layers: int, world: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_layers, world)
    out, start = [], 0
    for r in range(world):
        end = start + base + (1 if r < extra else 0)
        out.append((start, end))
        start = end
    return out


@dataclass(frozen=True)
class RankJob:
    """What every rank of one local run does (picklable: it crosses into spawned children)."""

    model_path: str
    card_json: str
    world: int
    mode: str = "Pipeline"
    hosts: tuple[str, ...] | None = None
    deadline_s: float = 60.0
    collective_timeout_s: float = 60.0
    prompts: tuple[str, ...] = PROMPTS
    max_tokens: int = 64
    options: tuple[tuple[str, Any], ...] = ()
    exit_after_load: int | None = None  # this rank exits right after loading (a peer that dies)


def build_spec(job: RankJob, card: ModelCard, rank: int) -> RunnerSpec:
    if job.mode == "Tensor":
        start, end = 0, card.n_layers
        cls: type[PipelineShardMetadata] | type[TensorShardMetadata] = TensorShardMetadata
    else:
        start, end = layer_ranges(card.n_layers, job.world)[rank]
        cls = PipelineShardMetadata
    shard = cls(
        model_id=card.model_id,
        device_rank=rank,
        world_size=job.world,
        start_layer=start,
        end_layer=end,
        n_layers=card.n_layers,
        backend="mlx-cpu",
    )
    group = None
    if job.hosts:
        group = RankGroup(
            hosts=job.hosts, formation_deadline_s=job.deadline_s, collective_timeout_s=job.collective_timeout_s
        )
    return RunnerSpec(
        instance_id="local",
        runner_id=f"r{rank}",
        shard=shard,
        card=card,
        model_path=Path(job.model_path),
        group=group,
        options=dict(job.options),
    )


def rank_main(out: Any, job: RankJob, rank: int) -> None:
    """A spawned child: load this rank, run every prompt greedily, report, exit at once."""
    import psutil

    from .engine import MlxEngine
    from .session import MlxSession

    os.environ["HF_HUB_OFFLINE"] = "1"
    report = RankReport(rank=rank)
    started = time.perf_counter()
    try:
        card = ModelCard.model_validate_json(job.card_json)
        session = MlxEngine().load(build_spec(job, card, rank), lambda d, t: None)
        assert isinstance(session, MlxSession), "split ranks load text models"
        report.load_s = time.perf_counter() - started
        report.rss_after_load = psutil.Process().memory_info().rss
        report.param_bytes = session.param_bytes()
        if job.exit_after_load == rank:
            os._exit(3)
        for prompt in job.prompts:
            params = TextGenerationParams(
                model_id=card.model_id,
                messages=(ChatMessage(role="user", content=prompt),),
                sampling=SamplingParams(temperature=0.0, max_tokens=job.max_tokens),
            )
            started = time.perf_counter()
            chunks = list(session.generate("t", params, lambda: False))
            report.tokens.append(list(session.last_tokens))
            report.texts.append("".join(c.text for c in chunks if isinstance(c, TokenChunk)))
            if isinstance(chunks[-1], ErrorChunk):
                report.failed_after_s = time.perf_counter() - started
                raise RuntimeError(chunks[-1].message)
            if chunks[-1].stats is not None:
                report.decode_tps.append(chunks[-1].stats.generation_tps)
                report.ttft_ms.append(chunks[-1].stats.ttft_ms)
        session.close()
    except BaseException as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    out.put(report)
    out.close()
    out.join_thread()
    os._exit(0)  # skip MLX's ring teardown (it may wait on peers that already left)


def run_ranks(
    model_path: Path,
    card: ModelCard,
    world: int,
    mode: str = "Pipeline",
    *,
    prompts: tuple[str, ...] = PROMPTS,
    max_tokens: int = 64,
    deadline_s: float = 60.0,
    collective_timeout_s: float = 60.0,
    timeout_s: float = 240.0,
    options: dict[str, Any] | None = None,
    only_ranks: list[int] | None = None,
    exit_after_load: int | None = None,
) -> list[RankReport]:
    """Start `world` ranks (or only `only_ranks` of them), wait for their reports, kill them all.

    A rank that exits without reporting (``exit_after_load``) is not waited for.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    hosts = tuple(f"127.0.0.1:{p}" for p in free_ports(world)) if world > 1 else None
    job = RankJob(
        model_path=str(model_path),
        card_json=card.model_dump_json(),
        world=world,
        mode=mode,
        hosts=hosts,
        deadline_s=deadline_s,
        collective_timeout_s=collective_timeout_s,
        prompts=prompts,
        max_tokens=max_tokens,
        options=tuple(sorted((options or {}).items())),
        exit_after_load=exit_after_load,
    )
    ranks = list(only_ranks if only_ranks is not None else range(world))
    procs: list[Any] = []
    try:
        for rank in ranks:
            proc = ctx.Process(target=rank_main, args=(out, job, rank), daemon=True)
            proc.start()
            procs.append(proc)
        expected = len([r for r in ranks if r != exit_after_load])
        reports: list[RankReport] = []
        end = time.monotonic() + timeout_s
        while len(reports) < expected:
            try:
                reports.append(out.get(timeout=max(0.1, end - time.monotonic())))
            except queue.Empty:
                raise TimeoutError(f"ranks did not report within {timeout_s:g} s (got {len(reports)})") from None
        return sorted(reports, key=lambda r: r.rank)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
