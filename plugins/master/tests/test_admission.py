"""Admission that matches the machine: context as a placement choice, KV cache types, memory pools,
and memory committed to placements that have not loaded yet ([capacity], acceptance 1 and 2)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from skulk_kernel.api import (
    CommandId,
    DecisionView,
    IndexedEvent,
    InstanceCreated,
    ModelId,
    NodeCapacity,
    NodeId,
    PlaceInstance,
    PlacementError,
    PlacementRequest,
    RunnerId,
    RunnerLoading,
    RunnerReady,
    RunnerStatusUpdated,
    State,
    apply,
    decide,
)
from skulk_master.memory import (
    ENGINE_OVERHEAD,
    GiB,
    default_contexts,
    kv_bytes,
    memory_breakdown,
    memory_pool,
    unified_ceiling,
)
from skulk_master.planner import MemoryPlanner
from skulk_testing.geometry import GB, LLAMA_8B, LLAMA_70B, QWEN_32B, machine

NOW = datetime(2026, 12, 4, tzinfo=UTC)
#: llama_server's measured weights multiplier and runtime (docs/models.md), in place of the 1.25 guess
FACTOR, RUNTIME = ENGINE_OVERHEAD["llama_server"]


def place(card, nodes: dict[str, NodeCapacity], state: State | None = None, **kwargs):  # type: ignore[no-untyped-def]
    request = PlacementRequest(model=card, **kwargs)
    return MemoryPlanner().place(request, state or State(), nodes, "inst-1")


def node_24gb(node_id: str = "n24") -> NodeCapacity:
    return machine(node_id, 24, used_gb=2)  # 22 GB free: an OS and a desktop on a 24 GB machine


# ------------------------------------------------------------------ acceptance 1: context


def test_kv_arithmetic_of_the_8b_card() -> None:
    assert kv_bytes(LLAMA_8B, 131_072) == 16 * GiB  # the whole context at f16: what the old rule charged
    assert kv_bytes(LLAMA_8B, 32_768) == 4 * GiB
    assert kv_bytes(LLAMA_8B, 32_768, "q8_0") == int(4 * GiB * 8.5 / 16)
    assert kv_bytes(LLAMA_8B, 32_768, "q4_0") == int(4 * GiB * 4.5 / 16)


def test_the_8b_model_on_a_24gb_node_is_admitted_at_32k_by_default() -> None:
    old_need = MemoryPlanner().need_bytes(LLAMA_8B, 1.0, 1)  # the whole card's context, as before
    assert old_need >= node_24gb().ram_available  # the old rule refused it
    inst = place(LLAMA_8B, {"n24": node_24gb()})
    assert inst.context_limit == 32_768
    assert inst.kv_cache_type == "f16"
    assert inst.reserved_bytes["n24"] == pytest.approx(4.58 * GiB * FACTOR + RUNTIME + 4 * GiB + 256 * 2**20, abs=2)


def test_the_8b_model_at_128k_is_refused_with_the_largest_context_that_fits() -> None:
    with pytest.raises(PlacementError) as err:
        place(LLAMA_8B, {"n24": node_24gb()}, context_tokens=131_072)
    assert err.value.kind == "memory_shortfall"
    message = err.value.message
    assert "at 131072 tokens needs" in message and "KV 16.00 GiB (f16)" in message
    assert message.endswith("the largest context that fits is 65536 (context_tokens=65536)")


def test_an_explicit_context_that_fits_is_admitted_and_stamped() -> None:
    inst = place(LLAMA_8B, {"n24": node_24gb()}, context_tokens=65_536)
    assert inst.context_limit == 65_536
    inst = place(LLAMA_8B, {"n24": node_24gb()}, context_tokens=3000)
    assert inst.context_limit == 3000


def test_the_default_steps_down_in_powers_of_two_on_a_small_node() -> None:
    assert default_contexts(LLAMA_8B)[:3] == [32_768, 16_384, 8192]
    assert default_contexts(LLAMA_8B.model_copy(update={"context_length": 3000})) == [3000, 2048, 1024, 512]
    inst = place(LLAMA_8B, {"n10": machine("n10", 10, used_gb=1)})  # 8.38 GiB free: not 32k
    assert inst.context_limit == 16_384


def test_a_quantized_kv_cache_is_charged_at_its_size_and_fits_128k() -> None:
    inst = place(LLAMA_8B, {"n24": node_24gb()}, context_tokens=131_072, kv_cache_type="q8_0")
    assert inst.kv_cache_type == "q8_0" and inst.context_limit == 131_072
    kv = 16 * GiB * 8.5 / 16
    assert inst.reserved_bytes["n24"] == pytest.approx(4.58 * GiB * FACTOR + RUNTIME + kv + 256 * 2**20, abs=2)


def test_a_quantized_kv_cache_needs_an_engine_that_has_one() -> None:
    echo = machine("e", 64, backends=("echo-cpu",))
    with pytest.raises(PlacementError) as err:
        place(LLAMA_8B.model_copy(update={"compatible_backends": ()}), {"e": echo}, kv_cache_type="q4_0")
    assert "kv_cache_type q4_0 needs an engine that quantizes its KV cache (llama_server)" in err.value.message


def test_previews_show_context_kv_and_weights_per_node() -> None:
    inst = place(LLAMA_8B, {"n24": node_24gb()})
    assert memory_breakdown(LLAMA_8B, inst) == {
        "n24": {
            "context_tokens": 32_768,
            "kv_cache_type": "f16",
            "weights_bytes": int(4.58 * GiB),
            "kv_bytes": 4 * GiB,
            "overhead": FACTOR,
            "runtime_bytes": RUNTIME,
            "need_bytes": inst.reserved_bytes["n24"],
        }
    }


# ------------------------------------------------------------------ pools


def test_unified_memory_is_bounded_by_the_metal_working_set() -> None:
    mac = machine("m", 24, used_gb=1, backends=("mlx-metal",), os="Darwin")
    assert unified_ceiling(mac.ram_total) == int(18 * GB)  # 75 % of 24 GB (24 - 16 GiB is less)
    assert unified_ceiling(192 * GB) == 192 * GB - 16 * GiB  # all but 16 GiB (75 % is less)
    assert memory_pool(mac, "mlx-metal") == ("unified memory", int(18 * GB))
    assert memory_pool(mac, "llama_server-cpu") == ("RAM", int(23 * GB))
    linux = machine("l", 24, used_gb=1, backends=("mlx-cpu",))
    assert memory_pool(linux, "mlx-cpu") == ("RAM", int(23 * GB))


def test_a_32b_model_on_a_24gb_mac_is_refused_against_the_working_set() -> None:
    mac = machine("m", 24, used_gb=1, backends=("mlx-metal",), os="Darwin")
    card = QWEN_32B.model_copy(update={"compatible_backends": ("mlx-metal", "mlx-cpu"), "storage_size": 14 * GiB})
    with pytest.raises(PlacementError) as err:  # 14 GiB x 1.18 (mlx, measured) + KV fits in 23 GB free, not in 18 GB
        place(card, {"m": mac}, context_tokens=2048)
    assert "of unified memory is available for mlx-metal" in err.value.message
    assert place(card, {"m": machine("m", 24, used_gb=1, backends=("mlx-cpu",))}, context_tokens=2048)


# ------------------------------------------------------------------ acceptance 2: committed memory


def view(caps: dict[str, NodeCapacity]) -> DecisionView:
    cards = {c.model_id: c for c in (LLAMA_8B, LLAMA_70B)}
    return DecisionView(
        master_id="a", now=NOW, capacities=caps, resolve=lambda ref: cards.get(ModelId(ref)), planner=MemoryPlanner()
    )


def applied(state: State, *events: object) -> State:
    for event in events:
        indexed = IndexedEvent(idx=state.last_event_applied_idx + 1, origin=NodeId("a"), at=NOW, event=event)  # type: ignore[arg-type]
        state = apply(state, indexed)
    return state


def command(cid: str) -> PlaceInstance:
    return PlaceInstance(command_id=CommandId(cid), model_id=LLAMA_8B.model_id)


def test_two_placements_back_to_back_never_land_in_the_same_free_memory() -> None:
    one_fits = {"a": machine("a", 16, used_gb=1)}  # 13.97 GiB free: one 8B at 32k (9.98 GiB), not two
    state = State()
    first = decide(state, command("p1"), view(one_fits))
    assert first.refusal is None
    state = applied(state, *first.events)
    second = decide(state, command("p2"), view(one_fits))  # telemetry has not moved: the runner is loading
    assert second.refusal is not None and second.refusal.kind == "memory_shortfall"
    assert "committed to instances not loaded yet" in second.refusal.reason

    two_nodes = {**one_fits, "b": machine("b", 16, used_gb=1)}
    second = decide(state, command("p2"), view(two_nodes))
    (created,) = second.events
    assert isinstance(created, InstanceCreated)
    assert list(created.instance.shard_assignments.node_to_runner) == ["b"]


def test_committed_memory_counts_until_the_runner_has_loaded() -> None:
    one_fits = {"a": machine("a", 16, used_gb=1)}
    state = applied(State(), *decide(State(), command("p1"), view(one_fits)).events)
    runner = RunnerId("p1-r0")
    loading = applied(state, RunnerStatusUpdated(runner_id=runner, status=RunnerLoading()))
    assert decide(loading, command("p2"), view(one_fits)).refusal is not None
    # loaded: the node's own reading now shows the memory, so it is no longer added on top
    ready = applied(state, RunnerStatusUpdated(runner_id=runner, status=RunnerReady()))
    assert decide(ready, command("p2"), view(one_fits)).refusal is None


def test_a_replacement_keeps_the_lost_instances_context_and_kv_type() -> None:
    from skulk_kernel.api import replacement

    inst = place(LLAMA_8B, {"n24": node_24gb()}, context_tokens=8192, kv_cache_type="q8_0")
    again = replacement(inst, "seed", min_nodes=1, excluded=())
    assert (again.context_tokens, again.kv_cache_type) == (8192, "q8_0")


# ------------------------------------------------------------------ GPU first, CPU when VRAM is short


def test_a_gpu_backend_is_preferred_and_a_short_vram_falls_back_to_the_cpu_build() -> None:
    gpu_first = ("llama_server-cuda", "llama_server-cpu")
    card = LLAMA_8B.model_copy(update={"compatible_backends": gpu_first, "backend_preference": gpu_first})
    big_gpu = machine("g", 64, used_gb=2, backends=gpu_first, vram_gb=24)
    placed = place(card, {"g": big_gpu})
    (shard,) = placed.shard_assignments.runner_to_shard.values()
    assert shard.backend == "llama_server-cuda"
    small_gpu = machine("s", 64, used_gb=2, backends=gpu_first, vram_gb=4)  # 8B at 32k needs about 10 GB
    placed = place(card, {"s": small_gpu})
    (shard,) = placed.shard_assignments.runner_to_shard.values()
    assert shard.backend == "llama_server-cpu"  # RAM holds it; before, the node refused the model
