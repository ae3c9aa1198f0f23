"""Entry point of the vLLM engine plugin. Imports neither vllm nor torch (they are not even here)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel import hookimpl
from skulk_kernel.api import EngineInstaller, NodeSurface

PLUGIN = "engine-vllm"


class VllmConfig(BaseModel):
    """`[plugins.engine-vllm]` in a profile (also handed to each runner as its options)."""

    model_config = ConfigDict(extra="forbid")
    max_context: int = Field(default=32_768, ge=256, description="cap on --max-model-len")
    max_num_seqs: int = Field(default=8, ge=1, description="sequences vLLM batches at once")
    enforce_eager: bool = Field(default=False, description="CUDA: skip graph capture (CPU always does)")
    cpu_kvcache_gib: int | None = Field(default=None, ge=1, description="CPU KV cache (default: from the card)")
    tool_parser: str | None = Field(default=None, description="override the family's tool parser")
    ready_timeout_s: float = Field(default=900.0, gt=0, description="how long a server may take to load")
    extra_args: list[str] = Field(default_factory=list, description="appended to the vLLM command line")
    vram_total_bytes: int | None = Field(
        default=None, ge=1, description="CUDA: the GPU memory to size --gpu-memory-utilization by (default: probed)"
    )


def vllm_config(options: VllmConfig | dict[str, Any]) -> VllmConfig:
    """The runner's typed copy of the table (RunnerSpec.options is the node's validated table)."""
    return options if isinstance(options, VllmConfig) else VllmConfig.model_validate(dict(options))


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, VllmConfig)


@hookimpl
def configure(node: NodeSurface) -> None:
    from .engine import RUN_DIR_ENV

    # Runners inherit the environment: their servers' pid files go into this node's data dir.
    os.environ[RUN_DIR_ENV] = str(Path(node.options.home) / PLUGIN)


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engine import VllmEngine

    register(VllmEngine())


@hookimpl
def register_model_stores(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    if node is None:
        return
    from .models import VllmModelStore
    from .venv import detect_flavor

    def models_dir() -> Path:
        configured = node.facts.get("models_dir") or os.environ.get("SKULK_MODELS_DIR")
        return Path(configured) if configured else Path(node.options.home) / "models"

    register(VllmModelStore(models_dir, detect_flavor))


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    from .venv import detect_flavor, installed_info

    for flavor in ("cpu", "cuda"):
        if (info := installed_info(flavor)) is not None:
            facts.setdefault("engine_builds", {})[f"vllm-{flavor}"] = f"vllm {info.get('vllm', '?')}"
    facts.setdefault("engine_venvs", {})["vllm"] = detect_flavor()


@hookimpl
def register_engine_installers(register: Callable[[EngineInstaller], None]) -> None:
    from .cli import VllmInstaller

    register(VllmInstaller())


@hookimpl
def startup(node: NodeSurface) -> None:
    from .watch import clean_start, watch_loop

    run_dir = Path(node.options.home) / PLUGIN
    clean_start(run_dir)
    node.spawn(watch_loop(node, run_dir), "engine-vllm-watch")


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in only where a CUDA vLLM venv is installed and the node has a GPU it supports; on a
    CPU llama.cpp is the faster engine, so an installed CPU vLLM stays out (profile cuda-vllm)."""
    builds = facts.get("engine_builds") or {}
    gpus = [g.get("model", "?") for g in (facts.get("hardware") or {}).get("gpus", []) if g.get("vendor") == "nvidia"]
    if "vllm-cuda" in (facts.get("derived_backends") or []):
        return True, f"{builds.get('vllm-cuda', 'vllm')} (CUDA) on {', '.join(gpus) or 'the GPU'}"
    if "vllm-cuda" in builds:
        return False, "vLLM's CUDA build is installed, but no NVIDIA GPU it supports was found"
    if not gpus:
        return False, "no NVIDIA GPU (vLLM's CPU build is slower than llama.cpp)"
    return False, f"{gpus[0]}, but no CUDA vLLM venv: skulk-kernel engines install vllm --flavor cuda"
