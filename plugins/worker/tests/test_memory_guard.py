"""The worker's pre-spawn guard judges the master's own reservation against the pool the master used."""

from __future__ import annotations

from types import SimpleNamespace

import psutil
from skulk_kernel.api import ModelCard, ModelId, NodeId, PipelineShardMetadata
from skulk_worker.plugin import WorkerConfig
from skulk_worker.worker import Worker

GIB = 1024**3


def shard(backend: str) -> PipelineShardMetadata:
    return PipelineShardMetadata(
        model_id=ModelId("m"), device_rank=0, world_size=1, start_layer=0, end_layer=2, n_layers=2, backend=backend
    )


def guard(reserved: int | None, backend: str, gpus: tuple[dict[str, int], ...] = ()) -> str | None:
    node = SimpleNamespace(node_id="n1", facts={"gpus": list(gpus)})
    worker = Worker(node, WorkerConfig())  # type: ignore[arg-type]
    instance = SimpleNamespace(reserved_bytes={NodeId("n1"): reserved} if reserved else {})
    card = ModelCard(model_id=ModelId("m"), n_layers=2, hidden_size=8, storage_size=1024)
    return worker._memory_refusal(instance, shard(backend), card)


def test_the_masters_reservation_is_the_need_and_ram_the_pool_on_a_cpu_backend() -> None:
    refusal = guard(psutil.virtual_memory().total * 4, "llama_server-cpu")
    assert refusal is not None and "the master reserved" in refusal and "of RAM" in refusal
    assert guard(GIB // 4, "llama_server-cpu") is None


def test_a_discrete_gpu_backend_is_judged_against_free_vram() -> None:
    gpus = ({"vram_total_bytes": 24 * GIB, "vram_free_bytes": 2 * GIB},)
    refusal = guard(6 * GIB, "llama_server-cuda", gpus)
    assert refusal is not None and "of VRAM" in refusal and "2048 MiB" in refusal
    assert guard(GIB, "llama_server-cuda", gpus) is None
    # the same reservation on the CPU backend of that node is judged against RAM, not VRAM
    assert guard(GIB, "llama_server-cpu", gpus) is None


def test_an_instance_made_by_hand_falls_back_to_its_weights() -> None:
    assert guard(None, "echo-cpu") is None  # 1 KiB of weights
