"""Typed node hardware facts: what a node has, as detected (never as configured).

These models are what ``probe_node`` writes into the node's facts (``facts["hardware"]``, as
plain JSON so every plugin can read it without importing this one) and what the doctor and
:func:`.derive.derive_backends` read back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Vendor = Literal["nvidia", "amd", "apple", "intel", "other"]
Source = Literal["nvml", "sysfs", "system_profiler", "engine"]


class GpuFacts(BaseModel):
    """One accelerator. Readings that a source cannot give stay None (never a made-up 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=0)
    vendor: Vendor
    model: str
    source: Source
    vram_total_bytes: int | None = Field(default=None, ge=0, description="None: unified memory (Apple)")
    vram_free_bytes: int | None = Field(default=None, ge=0)
    utilization_pct: float | None = Field(default=None, ge=0, le=100)
    temperature_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    compute_capability: str | None = Field(default=None, description="NVIDIA: '8.9'; AMD: the gfx target")
    unified_memory: bool = False
    pci_bus_id: str | None = None


class EngineBuild(BaseModel):
    """An engine build installed on this node and the devices its own runtime lists."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    engine: str = Field(description="the engine's name, as in its backend tags (llama_server, vllm, mlx)")
    build: str = Field(description="what is installed, e.g. 'xllamacpp 2026.10' or 'vllm 0.32.0'")
    computes: tuple[str, ...] = Field(description="what it can run on: cpu, cuda, rocm, metal")


class NodeHardware(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    os: str
    arch: str
    gpus: tuple[GpuFacts, ...] = ()
    nvidia_driver: str | None = None
    nvidia_cuda_driver: str | None = Field(default=None, description="highest CUDA the driver supports, '12.4'")
    apple_chip: str | None = None
    builds: tuple[EngineBuild, ...] = ()
    errors: dict[str, str] = Field(default_factory=dict, description="source -> why it could not be read")

    def vendors(self) -> set[str]:
        return {g.vendor for g in self.gpus}

    def vram_total(self) -> int:
        return sum(g.vram_total_bytes or 0 for g in self.gpus)

    def vram_free(self) -> int:
        return sum(g.vram_free_bytes or 0 for g in self.gpus)
