"""The kernel-facing MLX engine: probe, backend tags and load().

load() runs inside a runner subprocess (spawned, never forked: a fork after MLX computed hangs
the child). For a multi-rank instance it pins the rank (optional), forms the ring group within
the group's formation deadline, loads the model lazily, keeps only this rank's part (pipeline)
or shards it (tensor), materialises that part, and waits at a barrier until every rank has
loaded. Everything MLX runs on one compute thread and is waited for with a timeout.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import EngineProbe, RunnerSpec, Sharding, TensorShardMetadata

from .batcher import BATCH_WIDTH
from .compute import ComputeThread
from .options import resolve_options
from .ring import form_group, pin_to_core
from .session import Loaded, MlxSession
from .split import StageSpec, shard_tensor, split_pipeline
from .vlm import VlmSession, load_vlm

log = logging.getLogger("skulk.engine_mlx")


def compute_kind() -> str:
    """``metal`` on Apple Silicon macOS, ``cpu`` elsewhere (MLX's CPU build on Linux)."""
    return "metal" if sys.platform == "darwin" and platform.machine() == "arm64" else "cpu"


def mlx_version() -> str | None:
    """The installed mlx version, without importing mlx (its import is not cheap)."""
    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
        return None
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def mlx_usable(timeout_s: float = 60.0) -> str | None:
    """None when ``mlx.core`` imports, else why not (``pip install mlx`` alone fails on Linux).

    Checked in a child interpreter so the node process never loads MLX itself.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import mlx.core"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"mlx import check failed: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        return "mlx does not import: " + (lines[-1] if lines else f"exit {proc.returncode}")
    return None


def model_folder(spec: RunnerSpec) -> Path:
    if spec.model_path is None:
        raise FileNotFoundError(f"{spec.card.model_id} has no model files on this node")
    path = Path(spec.model_path)
    return path.parent if path.is_file() else path


class MlxEngine:
    name = "mlx"
    tasks = frozenset({"TextGeneration"})
    #: a single-rank session batches this many requests; a split or vision session says 1 itself
    dispatch_width = BATCH_WIDTH
    splits: frozenset[Sharding] = frozenset({"Pipeline", "Tensor"})

    def probe(self) -> EngineProbe:
        version = mlx_version()
        if version is None:
            hint = 'pip install "mlx[cpu]" mlx-lm' if sys.platform == "linux" else "pip install mlx mlx-lm"
            return EngineProbe(available=False, reason=f"mlx and mlx-lm are not installed ({hint})")
        return EngineProbe(available=True, version=f"mlx {version}")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        if not self.probe().available:
            return []
        build = facts.get("engine_builds", {}).get("mlx") if isinstance(facts.get("engine_builds"), dict) else None
        if isinstance(build, str) and build.startswith("unusable"):
            return []
        return [f"mlx-{compute_kind()}"]

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> MlxSession | VlmSession:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        config = resolve_options(spec.options, spec.card)
        shard = spec.shard
        folder = model_folder(spec)
        if "vision" in spec.card.capabilities:  # mlx-vlm's model classes, one node (vlm.py)
            progress(0, 1)
            session = load_vlm(spec, folder, ComputeThread())
            progress(1, 1)
            return session
        group = spec.group if shard.world_size > 1 else None
        if shard.world_size > 1 and (group is None or len(group.hosts) != shard.world_size):
            raise ValueError(f"a {shard.world_size}-rank shard needs a group of {shard.world_size} hosts, got {group}")
        tensor = isinstance(shard, TensorShardMetadata)
        stage = StageSpec(shard.device_rank, shard.world_size, shard.start_layer, shard.end_layer, shard.n_layers)
        if not tensor:
            stage.check()
        total = max(1, shard.n_layers if tensor else shard.end_layer - shard.start_layer)
        progress(0, total)
        if group is not None and config.pin_ranks:
            pin_to_core(group, shard.device_rank)
        compute = ComputeThread()
        world = form_group(group, shard.device_rank, compute) if group is not None else None

        def load_part() -> Loaded:
            import mlx.core as mx
            from mlx_lm.utils import load_model, load_tokenizer

            model, model_config = load_model(folder, lazy=True)
            if world is not None:
                shard_tensor(model, world) if tensor else split_pipeline(model, stage, world)
            if config.dtype is not None:
                model.set_dtype(getattr(mx, config.dtype))
            mx.eval(model.parameters())
            mx.clear_cache()  # buffers freed by the split/shard stay in MLX's cache otherwise
            tokenizer = load_tokenizer(folder)
            context = int(model_config.get("max_position_embeddings") or spec.card.context_length)
            return Loaded(
                model=model,
                tokenizer=tokenizer,
                group=world,
                rank=shard.device_rank,
                world_size=shard.world_size,
                context_length=min(context, spec.context_limit or spec.card.context_length),
                backend=f"mlx-{compute_kind()}",
            )

        loaded = compute.call(load_part, None, "loading the model")
        if world is not None and group is not None:
            self._barrier(world, compute, group.formation_deadline_s, shard.device_rank, shard.world_size)
        progress(total, total)
        timeout = group.collective_timeout_s if group is not None else None
        return MlxSession(loaded, config, compute, timeout)

    @staticmethod
    def _barrier(world: Any, compute: ComputeThread, deadline_s: float, rank: int, size: int) -> None:
        """Every rank has loaded its part (else a slow loader would time out the first request)."""

        def barrier() -> None:
            import mlx.core as mx

            mx.eval(mx.distributed.all_sum(mx.ones(1), group=world))

        try:
            compute.call(barrier, deadline_s, "the post-load barrier")
        except TimeoutError:
            raise TimeoutError(f"rank {rank} of {size}: not every rank loaded within {deadline_s:g} s") from None
