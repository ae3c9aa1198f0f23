"""The placement planner as a pure function: candidates, filters, ranking, typed refusals."""

from __future__ import annotations

import pytest
from skulk_kernel.contracts import NodeCapacity, PlacementError, PlacementRequest
from skulk_kernel.events import Connection
from skulk_kernel.models import ModelCard
from skulk_kernel.state import State, Topology
from skulk_master.memory import GiB
from skulk_master.planner import MemoryPlanner

CARD = ModelCard(
    model_id="org/m",
    n_layers=30,
    hidden_size=576,
    num_key_value_heads=3,
    context_length=2048,
    storage_size=2 * GiB,
    compatible_backends=("llama_server-cpu", "llama_cpp-cpu"),
    backend_preference=("llama_server-cpu", "llama_cpp-cpu"),
)


def cap(
    node: str, gib: float, backends: tuple[str, ...] = ("llama_server-cpu", "llama_cpp-cpu"), *, splits: bool = True
) -> NodeCapacity:
    """A node whose engines can split models (unless `splits=False`, as llama.cpp's cannot)."""
    return NodeCapacity(
        node_id=node,
        ram_available=int(gib * GiB),
        ram_total=int(gib * GiB * 2),
        backends=backends,
        splits={b: ("Pipeline", "Tensor") for b in backends} if splits else {},
        addresses=(f"10.0.0.{ord(node[0])}", "127.0.0.1"),
    )


def place(nodes: dict[str, NodeCapacity], state: State | None = None, **kwargs):
    return MemoryPlanner().place(PlacementRequest(model=CARD, **kwargs), state or State(), nodes, "inst-1")


def test_single_node_fits_and_prefers_backend():
    inst = place({"a": cap("a", 8)})
    (shard,) = inst.shard_assignments.runner_to_shard.values()
    assert shard.backend == "llama_server-cpu"
    assert (shard.start_layer, shard.end_layer) == (0, 30)
    assert inst.engine == "llama_server"
    assert inst.context_limit == 2048
    assert inst.instance_id == "inst-1"


def test_prefers_the_node_with_more_free_memory():
    inst = place({"a": cap("a", 4), "b": cap("b", 16)})
    assert list(inst.shard_assignments.node_to_runner) == ["b"]


def test_memory_shortfall_names_node_and_arithmetic():
    with pytest.raises(PlacementError) as err:
        place({"small": cap("small", 1)})
    assert err.value.kind == "memory_shortfall"
    assert "small" in err.value.message
    # llama.cpp's measured factor and runtime (ENGINE_OVERHEAD, docs/models.md), no longer the 1.25 guess
    assert "x overhead 1.27 (llama_server, measured) + runtime 68 MiB + KV" in err.value.message
    assert "available" in err.value.message


def test_the_measured_overhead_is_per_engine_and_the_configured_one_overrides_it():
    measured = MemoryPlanner()
    assert measured.overhead_for("llama_server-cpu") == (1.27, 68 * 2**20, "llama_server, measured")
    assert measured.overhead_for("mlx-metal")[:2] == (1.18, 86 * 2**20)
    assert measured.overhead_for("echo-cpu") == (1.25, 0, "default")  # not measured: the old figure
    assert measured.overhead_for("vllm-cuda") == (1.25, 0, "default")
    configured = MemoryPlanner(overhead=1.25)  # [plugins.master] memory_overhead: the old rule, every engine
    assert configured.overhead_for("llama_server-cpu") == (1.25, 0, "configured")
    weights, kv, floor = 2 * GiB, configured.kv_bytes(CARD), 256 * 2**20
    assert configured.need_bytes(CARD, 1.0, 1, backend="llama_server-cpu") == int(weights * 1.25 + kv + floor)
    need = measured.need_bytes(CARD, 1.0, 1, backend="llama_server-cpu")
    assert need == int(weights * 1.27 + 68 * 2**20 + kv + floor)
    half = measured.need_bytes(CARD, 0.5, 2, backend="llama_server-cpu")  # the runtime is the whole runner's
    assert half == int(weights * 0.5 * 1.27 + 68 * 2**20 + kv * 0.5 + floor)
    with pytest.raises(PlacementError) as err:
        configured.place(PlacementRequest(model=CARD), State(), {"small": cap("small", 1)}, "i")
    assert "x overhead 1.25 (configured) + KV" in err.value.message


def test_master_config_keeps_an_explicit_overhead_and_defaults_to_the_measured_ones():
    from skulk_master.plugin import MasterConfig

    assert MasterConfig().memory_overhead is None
    assert MasterConfig(memory_overhead=1.25).memory_overhead == 1.25
    with pytest.raises(ValueError):
        MasterConfig(memory_overhead=0.5)


def test_exact_fit_is_refused():
    planner = MemoryPlanner()
    need = planner.need_bytes(CARD, 1.0, 1, backend="llama_cpp-cpu")  # the smaller of the two engines' needs
    nodes = {"a": NodeCapacity(node_id="a", ram_available=need, ram_total=need * 2, backends=("llama_server-cpu",))}
    with pytest.raises(PlacementError):
        planner.place(PlacementRequest(model=CARD, context_tokens=2048), State(), nodes, "i")


def test_pipeline_split_over_two_nodes_covers_every_layer_once():
    inst = place({"a": cap("a", 1.6), "b": cap("b", 3.2)}, min_nodes=2)
    shards = sorted(inst.shard_assignments.runner_to_shard.values(), key=lambda s: s.device_rank)
    assert shards[0].start_layer == 0 and shards[-1].end_layer == 30
    assert shards[0].end_layer == shards[1].start_layer
    assert all(s.world_size == 2 for s in shards)


def test_backend_filter_is_hard():
    with pytest.raises(PlacementError) as err:
        place({"mac": cap("mac", 64, backends=("mlx-metal",))})
    assert "no backend compatible" in err.value.message


def test_exclusions_and_min_nodes():
    with pytest.raises(PlacementError) as err:
        place({"a": cap("a", 8)}, excluded_nodes=("a",))
    assert err.value.kind == "all_excluded"
    with pytest.raises(PlacementError) as err:
        place({"a": cap("a", 8)}, min_nodes=2)
    assert err.value.kind == "topology_gap"


def test_no_readings_yet_is_retryable():
    with pytest.raises(PlacementError) as err:
        place({})
    assert err.value.retryable


def test_unconnected_nodes_do_not_form_a_cycle():
    state = State(topology=Topology(nodes=("a", "b", "c"), missing=(Connection(source="c", sink="a"),)))
    with pytest.raises(PlacementError):
        place({"a": cap("a", 1.7), "c": cap("c", 1.7)}, state=state, min_nodes=2)
    # half of the 2 GiB model: 1.61 GiB with llama_server's measured factor and runtime
    inst = place({"a": cap("a", 1.7), "b": cap("b", 1.7)}, state=state, min_nodes=2)
    assert set(inst.shard_assignments.node_to_runner) == {"a", "b"}


def test_tensor_divisibility():
    card = CARD.model_copy(update={"num_key_value_heads": 3, "supports_tensor": True})
    with pytest.raises(PlacementError) as err:
        MemoryPlanner().place(
            PlacementRequest(model=card, sharding="Tensor", min_nodes=2),
            State(),
            {"a": cap("a", 8), "b": cap("b", 8)},
            "i",
        )
    assert "divisible" in err.value.message


def test_tensor_sharding_needs_a_card_that_supports_it():
    card = CARD.model_copy(update={"supports_tensor": False, "num_key_value_heads": 4})
    with pytest.raises(PlacementError) as err:
        MemoryPlanner().place(
            PlacementRequest(model=card, sharding="Tensor", min_nodes=2),
            State(),
            {"a": cap("a", 8), "b": cap("b", 8)},
            "i",
        )
    assert "supports_tensor" in err.value.message


def test_an_engine_that_cannot_split_is_never_placed_across_nodes():
    nodes = {"a": cap("a", 3, splits=False), "b": cap("b", 3, splits=False)}
    with pytest.raises(PlacementError, match=r"runs whole models only: it cannot split .* across 2 nodes"):
        place(nodes, min_nodes=2)
    assert len(place(nodes).shard_assignments.node_to_runner) == 1  # one node of each still works


def test_a_multi_rank_instance_carries_its_group_a_single_rank_none():
    nodes = {"a": cap("a", 3), "b": cap("b", 3)}
    split = place(nodes, min_nodes=2)
    assert split.group is not None and len(split.group.hosts) == 2
    ports = [int(h.rsplit(":", 1)[1]) for h in split.group.hosts]
    assert ports[1] == ports[0] + 1 and [h.rsplit(":", 1)[0] for h in split.group.hosts] == ["10.0.0.97", "10.0.0.98"]
    assert split.group == place(nodes, min_nodes=2).group  # every node computes the same group
    assert place(nodes).group is None


def test_ranks_on_one_host_talk_over_loopback():
    same = {
        n: NodeCapacity(
            node_id=n,
            ram_available=3 * GiB,
            ram_total=4 * GiB,
            backends=("mlx-cpu",),
            splits={"mlx-cpu": ("Pipeline",)},
            addresses=("192.0.2.2", "127.0.0.1"),
        )
        for n in "ab"
    }
    card = CARD.model_copy(update={"compatible_backends": ("mlx-cpu",), "backend_preference": ()})
    inst = MemoryPlanner().place(PlacementRequest(model=card, min_nodes=2), State(), same, "inst-2")
    assert inst.group is not None and all(h.startswith("127.0.0.1:") for h in inst.group.hosts)


# ---------------------------------------------------------------- VRAM as its own pool

from dataclasses import dataclass  # noqa: E402

from skulk_master.memory import memory_pool  # noqa: E402

GPU_CARD = CARD.model_copy(
    update={
        "compatible_backends": ("vllm-cuda", "llama_server-cpu"),
        "backend_preference": ("vllm-cuda", "llama_server-cpu"),
    }
)


@dataclass(frozen=True)
class GpuCapacity(NodeCapacity):
    """NodeCapacity plus the VRAM field the hardware telemetry carries (see the planner's memory_pool)."""

    vram_available: int | None = None


def gpu(node: str, ram_gib: float, vram_gib: float | None, backends=("vllm-cuda", "llama_server-cpu")) -> GpuCapacity:
    return GpuCapacity(
        node_id=node,
        ram_available=int(ram_gib * GiB),
        ram_total=int(ram_gib * GiB * 2),
        backends=backends,
        addresses=("127.0.0.1",),
        vram_available=None if vram_gib is None else int(vram_gib * GiB),
    )


def place_gpu(nodes, **kwargs):
    return MemoryPlanner().place(PlacementRequest(model=GPU_CARD, **kwargs), State(), nodes, "inst-g")


def test_memory_pool_is_vram_for_discrete_gpu_backends_only():
    node = gpu("g", 64, 24)
    assert memory_pool(node, "vllm-cuda") == ("VRAM", 24 * GiB)
    assert memory_pool(node, "llama_server-rocm") == ("VRAM", 24 * GiB)
    assert memory_pool(node, "llama_server-cpu") == ("RAM", 64 * GiB)
    assert memory_pool(node, "mlx-metal") == ("RAM", 64 * GiB)  # unified memory
    assert memory_pool(cap("c", 8), "vllm-cuda") == ("RAM", 8 * GiB)  # no VRAM reported: as before


def test_gpu_backend_admitted_against_vram_not_ram():
    inst = place_gpu({"g": gpu("g", ram_gib=1, vram_gib=24)})  # plenty of VRAM, little RAM
    (shard,) = inst.shard_assignments.runner_to_shard.values()
    assert shard.backend == "vllm-cuda"


def test_vram_shortfall_names_the_pool():
    # 1 GiB of VRAM cannot hold 2 GiB of weights, however much RAM the node has
    with pytest.raises(PlacementError) as err:
        place_gpu({"g": gpu("g", ram_gib=64, vram_gib=1, backends=("vllm-cuda",))})
    assert err.value.kind == "memory_shortfall" and "1.00 GiB of VRAM is available for vllm-cuda" in err.value.message


def test_pipeline_split_weights_layers_by_vram():
    nodes = {"a": gpu("a", 4, 30), "b": gpu("b", 60, 10)}
    big = GPU_CARD.model_copy(update={"storage_size": 20 * GiB})
    inst = MemoryPlanner().place(
        PlacementRequest(model=big, min_nodes=2), State(), {n: _splitting(c) for n, c in nodes.items()}, "inst-p"
    )
    shards = {inst.shard_assignments.runner_to_shard[r].backend for r in inst.shard_assignments.runner_to_shard}
    assert shards == {"vllm-cuda"}
    spans = {n: inst.shard_assignments.runner_to_shard[r] for n, r in inst.shard_assignments.node_to_runner.items()}
    assert spans["a"].end_layer - spans["a"].start_layer > spans["b"].end_layer - spans["b"].start_layer


def _splitting(c: GpuCapacity) -> GpuCapacity:
    from dataclasses import replace

    return replace(c, splits={b: ("Pipeline",) for b in c.backends})


def test_a_replica_goes_to_a_node_that_does_not_serve_the_model_yet():
    """Replicas spread over nodes even while the first one has not loaded (its node still looks free)."""
    nodes = {"a": cap("a", 16), "b": cap("b", 8)}
    first = place(nodes)
    assert list(first.shard_assignments.node_to_runner) == ["a"]
    state = State().model_copy(update={"instances": {first.instance_id: first}})
    second = MemoryPlanner().place(PlacementRequest(model=CARD), state, nodes, "inst-2")
    assert list(second.shard_assignments.node_to_runner) == ["b"]
    third = MemoryPlanner().place(
        PlacementRequest(model=CARD), state.model_copy(update={"instances": {"1": first, "2": second}}), nodes, "inst-3"
    )
    assert len(third.shard_assignments.node_to_runner) == 1  # every node has one: memory decides again


# ---------------------------------------------------------------- llama.cpp RPC groups


def rpc_cap(node: str, gib: float, build: str) -> NodeCapacity:
    return NodeCapacity(
        node_id=node,
        ram_available=int(gib * GiB),
        ram_total=int(gib * GiB * 2),
        backends=("llama_server-cpu", "llama_rpc-cpu"),
        splits={"llama_server-cpu": (), "llama_rpc-cpu": ("Pipeline",)},
        addresses=(f"10.0.0.{ord(node[0])}", "127.0.0.1"),
        builds={"llama_server": "xllamacpp 1", "llama_rpc": build},
    )


RPC_CARD = CARD.model_copy(
    update={
        "compatible_backends": ("llama_server-cpu", "llama_rpc-cpu"),
        "backend_preference": ("llama_server-cpu", "llama_rpc-cpu"),
    }
)


def test_a_gguf_splits_over_llama_rpc_with_each_ranks_layers_in_its_group():
    nodes = {n: rpc_cap(n, 3, "llama.cpp 0c1e570 (RPC protocol 7.0.0)") for n in "abc"}
    inst = MemoryPlanner().place(PlacementRequest(model=RPC_CARD, min_nodes=3), State(), nodes, "inst-r")
    shards = sorted(inst.shard_assignments.runner_to_shard.values(), key=lambda s: s.device_rank)
    assert {s.backend for s in shards} == {"llama_rpc-cpu"} and inst.engine == "llama_rpc"
    assert inst.group is not None and inst.group.layers == tuple((s.start_layer, s.end_layer) for s in shards)
    one = MemoryPlanner().place(PlacementRequest(model=RPC_CARD), State(), nodes, "inst-1")
    assert one.engine == "llama_server"  # a whole-model engine wherever one node holds it


def test_nodes_with_different_rpc_builds_are_never_grouped_and_the_reason_names_them():
    nodes = {
        "a": rpc_cap("a", 3, "llama.cpp 0c1e570 (RPC protocol 7.0.0)"),
        "b": rpc_cap("b", 3, "llama.cpp 9f2 (RPC protocol 6.1.0)"),
    }
    with pytest.raises(
        PlacementError, match=r"run different llama_rpc builds \(a: llama.cpp 0c1e570.*b: llama.cpp 9f2"
    ):
        MemoryPlanner().place(PlacementRequest(model=RPC_CARD, min_nodes=2), State(), nodes, "inst-x")


def test_an_rpc_group_spans_a_gpu_box_and_a_cpu_node_each_charged_against_its_own_pool():
    build = "llama.cpp 0c1e570 (RPC protocol 7.0.0)"
    gpu = NodeCapacity(
        node_id="g",
        ram_available=1 * GiB,  # the GPU box's RAM alone could not hold its share
        ram_total=2 * GiB,
        backends=("llama_server-cuda", "llama_rpc-cuda"),
        splits={"llama_server-cuda": (), "llama_rpc-cuda": ("Pipeline",)},
        addresses=("10.0.0.1", "127.0.0.1"),
        vram_available=6 * GiB,
        builds={"llama_rpc": build},
    )
    nodes = {"g": gpu, "c": rpc_cap("c", 3, build)}
    card = RPC_CARD.model_copy(
        update={
            "compatible_backends": ("llama_server-cuda", "llama_rpc-cuda", "llama_server-cpu", "llama_rpc-cpu"),
            "backend_preference": ("llama_server-cuda", "llama_rpc-cuda", "llama_server-cpu", "llama_rpc-cpu"),
        }
    )
    inst = MemoryPlanner().place(PlacementRequest(model=card, min_nodes=2), State(), nodes, "inst-m")
    by_node = {
        n: inst.shard_assignments.runner_to_shard[r].backend for n, r in inst.shard_assignments.node_to_runner.items()
    }
    assert by_node == {"g": "llama_rpc-cuda", "c": "llama_rpc-cpu"} and inst.engine == "llama_rpc"
    shares = {n: inst.shard_assignments.runner_to_shard[r] for n, r in inst.shard_assignments.node_to_runner.items()}
    # layers follow each node's own pool: the GPU's 6 GiB of VRAM takes more than the CPU node's 3 GiB of RAM
    assert shares["g"].end_layer - shares["g"].start_layer > shares["c"].end_layer - shares["c"].start_layer
