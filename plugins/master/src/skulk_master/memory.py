"""Memory arithmetic of placement: the pools a backend is admitted from, the KV cache at a context
and type, the per-engine overhead measured by bench/bench_engine_memory.py, the contexts tried by
default, and the memory committed to instances that have not loaded yet.

Pure functions over cards, capacities and State, shared by the planner (admission), the API's
previews (`memory_breakdown`) and the worker's pre-spawn guard (`DISCRETE_GPU_COMPUTES`), so all
three judge a node by the same rule. docs/models.md and docs/cluster.md give the figures.
"""

from __future__ import annotations

from skulk_kernel.api import (
    ModelCard,
    NodeCapacity,
    NodeId,
    RingInstance,
    RunnerConnected,
    RunnerConnecting,
    RunnerIdle,
    RunnerLoading,
    State,
    TensorShardMetadata,
)

GiB = 1024**3
MiB = 1024**2

#: Computes whose weights live in the accelerator's own memory (Metal is unified: RAM is its pool).
DISCRETE_GPU_COMPUTES = frozenset({"cuda", "rocm"})
#: Metal's working set on unified memory: 75 % of total RAM, or all but 16 GiB where that is more.
UNIFIED_SHARE, UNIFIED_OS_RESERVE = 0.75, 16 * GiB

#: Bits per cached K or V element (llama.cpp's block formats: q8_0 = 34 bytes / 32, q4_0 = 18 / 32).
KV_BITS = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5}
#: Engines that keep a quantized KV cache (llama.cpp's cache_type_k/v); the others only f16.
QUANTIZED_KV_ENGINES = frozenset({"llama_server"})
#: What a runner holds besides its KV cache, measured per engine by bench/bench_engine_memory.py on
#: the engine's own load path (the table and how to re-measure: docs/models.md): engine -> (multiplier
#: on the weights' bytes, fixed runtime bytes: the runner process with the engine loaded and a tiny
#: model). Engines not listed (vllm: not measured; echo: holds no weights and stands in for real
#: engines in tests and demos) get DEFAULT_OVERHEAD and no fixed part; MasterConfig.memory_overhead,
#: when set, replaces both for every engine.
#: Measured as the working set: anonymous memory plus the file pages a decode reads (MemAvailable, a node's free
#: RAM, counts the rest of an mmap'd model as free: the weights llama.cpp's CPU build repacks into
#: buffers of its own are never read from the file again). The largest over the models measured:
#: small models' compute buffers weigh most (SmolLM2 Q4_1: 1.26; Qwen2.5 0.5B/1.5B Q4_K_M: 0.96);
#: MLX's is bf16 weights on its CPU build, its KV cache growing as tokens come.
ENGINE_OVERHEAD: dict[str, tuple[float, int]] = {
    "llama_server": (1.27, 68 * MiB),
    "llama_cpp": (1.14, 64 * MiB),
    "mlx": (1.18, 86 * MiB),
}
DEFAULT_OVERHEAD = 1.25
#: Without `context_tokens` the planner gives the largest context that fits, never above this.
DEFAULT_CONTEXT_CAP = 32_768
MIN_CONTEXT = 512  # the smallest context the default tries
#: Runner statuses whose memory the node's telemetry does not show yet: "committed" memory.
NOT_LOADED = (RunnerIdle, RunnerConnecting, RunnerConnected, RunnerLoading)


def unified_memory(cap: NodeCapacity, backend: str) -> bool:
    """Metal (``*-metal``, every ``mlx-*``) on macOS: the GPU's working set is part of RAM."""
    compute = backend.rpartition("-")[2]
    return cap.os == "Darwin" and (compute == "metal" or backend.startswith("mlx"))


def unified_ceiling(ram_total: int) -> int:
    """The most a node with unified memory lets models hold: 75 % of RAM, or RAM - 16 GiB if more."""
    return int(max(ram_total * UNIFIED_SHARE, ram_total - UNIFIED_OS_RESERVE))


def memory_pool(cap: NodeCapacity, backend: str) -> tuple[str, int]:
    """(pool name, free bytes) that admits `backend` on this node, before committed memory.

    A discrete-GPU backend (``*-cuda``, ``*-rocm``) is admitted against the node's free VRAM when
    its capacity carries ``vram_available``; Metal on macOS against RAM within the working-set
    ceiling (``unified_ceiling``); every other backend, and a GPU node that does not report
    VRAM, against RAM.
    """
    vram = cap.vram_available
    if backend.rpartition("-")[2] in DISCRETE_GPU_COMPUTES and vram is not None:
        return "VRAM", int(vram)
    if unified_memory(cap, backend):
        return "unified memory", min(cap.ram_available, unified_ceiling(cap.ram_total))
    return "RAM", cap.ram_available


def reservations(state: State, node: str, pool: str) -> tuple[int, int]:
    """(committed, held): bytes admitted on `node`'s `pool` ("VRAM", else RAM) for instances whose
    runner there has not loaded yet, and for every instance there (the instance's reserved_bytes).

    Committed memory is not in the node's telemetry yet, so without it two placements back to back
    would both be admitted into the same free memory.
    """
    committed = held = 0
    vram = pool == "VRAM"
    for inst in state.instances.values():
        runner = inst.shard_assignments.node_to_runner.get(NodeId(node))
        reserved = inst.reserved_bytes.get(NodeId(node), 0)
        if runner is None or not reserved:
            continue
        backend = inst.shard_assignments.runner_to_shard[runner].backend
        if (backend.rpartition("-")[2] in DISCRETE_GPU_COMPUTES) != vram:
            continue
        held += reserved
        status = state.runners.get(runner)
        if status is None or isinstance(status, NOT_LOADED):
            committed += reserved
    return committed, held


def default_contexts(card: ModelCard, cap: int = DEFAULT_CONTEXT_CAP) -> list[int]:
    """The contexts tried without `context_tokens`, largest first: the card's own up to `cap`,
    then every power of two below it down to MIN_CONTEXT."""
    top = max(1, min(card.context_length, cap))
    out, power = [top], 1 << (top.bit_length() - 1)
    power = power // 2 if power == top else power
    while power >= MIN_CONTEXT:
        out.append(power)
        power //= 2
    return out


def _fmt(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 2 else f"{n / MiB:.0f} MiB"


def kv_bytes(card: ModelCard, context: int, kv_cache_type: str = "f16") -> int:
    """K and V for every layer at `context` tokens, at `kv_cache_type`'s bits per element."""
    head_dim = int(card.sections.get("runtime", {}).get("head_dim", 64))
    elements = 2 * card.n_layers * context * card.num_key_value_heads * head_dim
    return int(elements * KV_BITS[kv_cache_type] / 8)


def engine_overhead(backend: str, configured: float | None = None) -> tuple[float, int, str]:
    """(multiplier on weights, fixed runtime bytes, source) for `backend`'s engine: `configured`
    (MasterConfig.memory_overhead) for every engine when set, else the engine's measured figures
    (ENGINE_OVERHEAD), else DEFAULT_OVERHEAD without a fixed part."""
    if configured is not None:
        return configured, 0, "configured"
    engine = backend.split("-", 1)[0]
    if engine in ENGINE_OVERHEAD:
        factor, runtime = ENGINE_OVERHEAD[engine]
        return factor, runtime, f"{engine}, measured"
    return DEFAULT_OVERHEAD, 0, "default"


def memory_breakdown(
    card: ModelCard, instance: RingInstance, overhead: float | None = None
) -> dict[str, dict[str, int | float | str]]:
    """Per node: the instance's context, its KV type, the weights, KV and admitted bytes of the
    node's share, and the overhead multiplier and runtime bytes admission charged, next to each
    other (the previews' answer). `overhead`: MasterConfig.memory_overhead where set."""
    out: dict[str, dict[str, int | float | str]] = {}
    assignments = instance.shard_assignments
    for node, runner in assignments.node_to_runner.items():
        shard = assignments.runner_to_shard[runner]
        factor, runtime, _ = engine_overhead(shard.backend, overhead)
        tensor = isinstance(shard, TensorShardMetadata) and shard.world_size > 1
        share = 1 / shard.world_size if tensor else (shard.end_layer - shard.start_layer) / shard.n_layers
        out[node] = {
            "context_tokens": instance.context_limit,
            "kv_cache_type": instance.kv_cache_type,
            "weights_bytes": int(card.storage_size * share),
            "kv_bytes": int(kv_bytes(card, instance.context_limit, instance.kv_cache_type) * share),
            "overhead": factor,
            "runtime_bytes": runtime,
            "need_bytes": instance.reserved_bytes.get(node, 0),
        }
    return out
