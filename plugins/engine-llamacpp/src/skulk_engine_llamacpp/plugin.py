"""Entry point of the llama.cpp engine plugin. Imports no llama.cpp binding at module level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from skulk_kernel import hookimpl
from skulk_kernel.api import IndexedEvent, NodeSurface, State

PLUGIN = "engine-llamacpp"


class LlamaCppConfig(BaseModel):
    """`[plugins.engine-llamacpp]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    n_threads: int = Field(default=1, ge=1, description="threads for one stream's decode (1 is best on 2 busy cores)")
    n_threads_batch: int | None = Field(
        default=None,
        ge=1,
        description="threads when several tokens are computed at once: prompts, and several streams "
        "decoding together (default: the cores this process may use)",
    )
    n_parallel: int = Field(default=16, ge=1, description="llama_server slots: requests decoded together")
    draft_model_path: str | None = Field(
        default=None, description="llama_server: a GGUF of the same vocabulary drafting tokens (speculative decoding)"
    )
    draft_models: dict[str, str] = Field(
        default_factory=dict,
        description="llama_server: model id -> the draft GGUF for that model only (wins over draft_model_path)",
    )
    draft_max: int = Field(default=8, ge=1, description="llama_server: tokens the draft proposes per step")
    after_tool_result: Literal["answer", "free"] = Field(
        default="answer",
        description="llama_server: the turn after a tool result is answered from it (no tool catalog, "
        "prose first) unless the request forces a call; 'free' leaves it to the model",
    )
    n_ctx: int | None = Field(default=None, ge=64, description="context tokens (default: the model's)")
    cache_ram_mib: int = Field(default=256, ge=0, description="llama_server RAM prompt cache")
    logprobs_inprocess: bool = Field(default=False, description="llama_cpp: allocate logits for logprobs")
    n_ubatch: int | None = Field(
        default=None,
        ge=1,
        description="micro-batch llama.cpp evaluates at once (default: llama.cpp's 512; 32 keeps every batch "
        "exact, long prompts' resumes included, at 0.40-0.64x prefill)",
    )
    n_batch: int | None = Field(
        default=None,
        ge=1,
        description="tokens handed to one llama_decode call (default: llama.cpp's, 2048 for llama_server, "
        "512 for llama_cpp); at least n_ubatch",
    )
    verbosity: int = Field(default=0, ge=0, description="llama_server: llama.cpp's log verbosity (stderr)")
    n_gpu_layers: int | Literal["auto"] = Field(
        default="auto",
        description="a GPU build's layers on the GPU: auto = all of them, or those that fit the free VRAM "
        "by the card's per-layer size (logged); an int is taken as given (0: CPU only). A CPU build ignores it",
    )

    @field_validator("n_gpu_layers")
    @classmethod
    def _not_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("n_gpu_layers is a count of layers (0 or more) or 'auto'")
        return value


def llamacpp_config(options: dict[str, Any]) -> LlamaCppConfig:
    """The runner's typed copy of the table (RunnerSpec.options is the node's validated table)."""
    return LlamaCppConfig.model_validate(dict(options))


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, LlamaCppConfig)


@hookimpl
def register_engines(register: Callable[[Any], None]) -> None:
    from .engine import LlamaCppEngine, LlamaServerEngine
    from .rpc_engine import LlamaRpcEngine

    register(LlamaServerEngine())
    register(LlamaCppEngine())
    register(LlamaRpcEngine())


@hookimpl
def register_engine_installers(register: Callable[[Any], None]) -> None:
    from .installer import LlamaCppInstaller
    from .rpc_build import RpcInstaller

    for backend in ("cuda", "rocm", "vulkan"):
        register(LlamaCppInstaller(backend))
    register(RpcInstaller())


@hookimpl
def probe_node(facts: dict[str, Any]) -> None:
    from .engine import probe_builds
    from .rpc_build import find_build

    builds = facts.setdefault("engine_builds", {})
    builds.update(probe_builds())
    if (rpc := find_build()) is not None:
        builds["llama_rpc"] = rpc.group_key  # what the planner compares across the ranks of a group
        builds["llama_rpc (build)"] = rpc.describe()


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in wherever a llama.cpp build imports; the reason names the build and what it runs on."""
    hw = facts.get("hardware") or {}
    builds = [b for b in hw.get("builds", []) if b.get("engine") in ("llama_server", "llama_cpp")]
    if not builds:
        return False, "no llama.cpp build imports (pip install xllamacpp)"
    return True, "; ".join(f"{b['engine']} {b['build']} on {'+'.join(b['computes'])}" for b in builds)


@hookimpl
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    """Images of chat tasks whose runner is on this node arrive on the data plane (vision cards, vision.py)."""
    from skulk_api_control.vision_wire import follow

    follow(node, event.event)


@hookimpl
def shutdown(node: NodeSurface) -> None:
    from skulk_api_control.vision_wire import unfollow

    unfollow(node)
