"""Placement: which nodes run a model, and which layers each one holds.

Pure over its inputs (request, State, live node capacities), so POST /place_instance can dry-run
exactly the function the master uses. Candidates are connected cycles of at least `min_nodes`
nodes; filters run in order (exclusions, backends, tensor divisibility, per-node memory) and the
survivors are ranked: fewest nodes, preferred backend, files already present, most free memory.
Every refusal is a typed PlacementError whose message carries the arithmetic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import combinations, permutations

from skulk_kernel.api import (
    InstanceId,
    ModelCard,
    NodeCapacity,
    NodeId,
    PipelineShardMetadata,
    PlacementError,
    PlacementRequest,
    RankGroup,
    RingInstance,
    RunnerId,
    ShardAssignments,
    ShardMetadata,
    State,
    TensorShardMetadata,
)

GiB = 1024**3
MiB = 1024**2
MAX_CYCLE = 4
# Ports of multi-rank groups: [base, base + span + MAX_CYCLE). Below every common ephemeral range
# (Linux 32768-60999, macOS and Windows 49152-65535): a port the kernel hands to any outgoing
# connection or bind(0) on the host could not be listened on, and the group would never form (seen:
# "Address already in use", then a 120 s formation timeout, with 41000-57000 under a parallel test run).
RING_PORT_BASE, RING_PORT_SPAN = 20000, 12000


#: Computes whose weights live in the accelerator's own memory (Metal is unified: RAM is its pool).
DISCRETE_GPU_COMPUTES = frozenset({"cuda", "rocm"})


def memory_pool(cap: NodeCapacity, backend: str) -> tuple[str, int]:
    """(pool name, free bytes) that admits `backend` on this node: VRAM is its own pool.

    A discrete-GPU backend (``*-cuda``, ``*-rocm``) is admitted against the node's free VRAM when
    its capacity carries ``vram_available`` (telemetry from the hardware plugin, once
    NodeCapacity has the field); every other backend, and a GPU node that does not report VRAM,
    against RAM as before.
    """
    vram = getattr(cap, "vram_available", None)
    if backend.rpartition("-")[2] in DISCRETE_GPU_COMPUTES and vram is not None:
        return "VRAM", int(vram)
    return "RAM", cap.ram_available


def _fmt(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 2 else f"{n / MiB:.0f} MiB"


@dataclass(frozen=True)
class _Candidate:
    nodes: tuple[str, ...]
    backend: str
    shares: dict[str, tuple[int, int]]  # node -> (start_layer, end_layer)


def ring_hosts(instance_id: str, ring: tuple[str, ...], caps: dict[str, NodeCapacity]) -> tuple[str, ...]:
    """The ``ip:port`` each rank of a multi-rank instance listens on, in rank order.

    Ranks on one host (every node reports the same addresses) talk over loopback; otherwise each
    listens on its node's first non-loopback address. Ports derive from the instance id, so every
    node computes the same group and a re-placement (a new id) gets fresh ports.
    """
    base = RING_PORT_BASE + int(hashlib.sha256(instance_id.encode()).hexdigest()[:8], 16) % RING_PORT_SPAN
    one_host = len({caps[n].addresses for n in ring}) == 1
    hosts = []
    for rank, node in enumerate(ring):
        addresses = [a for a in caps[node].addresses if not a.startswith("127.")]
        address = "127.0.0.1" if one_host or not addresses else addresses[0]
        hosts.append(f"{address}:{base + rank}")
    return tuple(hosts)


def replicas_by_node(state: State, model_id: str) -> dict[str, int]:
    """How many instances of `model_id` each node already runs a share of.

    A replica is ranked away from the nodes that already serve its model, so replicas land on
    different nodes and one node's death leaves another replica to resume on. Free memory alone
    cannot do this: a replica placed a moment ago has not loaded yet, so its node still looks free.
    """
    count: dict[str, int] = {}
    for inst in state.instances.values():
        if inst.shard_assignments.model_id == model_id:
            for node in inst.shard_assignments.node_to_runner:
                count[node] = count.get(node, 0) + 1
    return count


class MemoryPlanner:
    name = "memory"

    def __init__(self, overhead: float = 1.25, floor_bytes: int = 256 * MiB) -> None:
        self.overhead = overhead
        self.floor_bytes = floor_bytes

    # ------------------------------------------------------------------ candidates

    @staticmethod
    def _connected(state: State, a: str, b: str) -> bool:
        edges = state.topology.connections
        if not edges:  # no observations yet: every pair of live nodes counts as reachable
            return True
        return any({c.source, c.sink} == {a, b} for c in edges)

    def _cycles(self, state: State, nodes: list[str], size: int) -> list[tuple[str, ...]]:
        found = []
        for combo in combinations(sorted(nodes), size):
            if size == 1:
                found.append(combo)
                continue
            for order in permutations(combo[1:]):
                ring = (combo[0], *order)
                if all(self._connected(state, ring[i], ring[(i + 1) % size]) for i in range(size)):
                    found.append(ring)
                    break
        return found

    def kv_bytes(self, card: ModelCard) -> int:
        """KV cache for the full context at fp16 (K and V, every layer): the admission floor."""
        head_dim = int(card.sections.get("runtime", {}).get("head_dim", 64))
        return 2 * card.n_layers * card.context_length * card.num_key_value_heads * head_dim * 2

    def _layer_split(
        self, card: ModelCard, ring: tuple[str, ...], caps: dict[str, NodeCapacity], sharding: str, backend: str = ""
    ) -> dict[str, tuple[int, int]]:
        n = card.n_layers
        if sharding == "Tensor" or len(ring) == 1:
            return {node: (0, n) for node in ring}
        weights = [max(memory_pool(caps[node], backend)[1], 1) for node in ring]
        total = sum(weights)
        bounds, start = {}, 0
        for i, node in enumerate(ring):
            count = n - start if i == len(ring) - 1 else max(1, round(n * weights[i] / total))
            count = min(count, n - start - (len(ring) - 1 - i))
            bounds[node] = (start, start + count)
            start += count
        return bounds

    def need_bytes(self, card: ModelCard, share: float, width: int) -> int:
        weights = card.storage_size * share
        kv = self.kv_bytes(card) * share
        return int(weights * self.overhead + kv + self.floor_bytes)

    # ------------------------------------------------------------------ placement

    def place(
        self, request: PlacementRequest, state: State, nodes: dict[str, NodeCapacity], instance_id: str
    ) -> RingInstance:
        card = request.model
        if not nodes:
            raise PlacementError(
                "info_gossiping", "no node has reported its resources yet; retry in a few seconds", retryable=True
            )
        live = [n for n in nodes if n not in request.excluded_nodes]
        if not live:
            raise PlacementError(
                "all_excluded",
                f"excluded_nodes {list(request.excluded_nodes)} removed every candidate node ({sorted(nodes)})",
            )
        if request.min_nodes > len(live):
            raise PlacementError(
                "topology_gap",
                f"min_nodes={request.min_nodes} but only {len(live)} eligible node(s) are in the cluster",
            )
        rejections: list[str] = []
        viable: list[_Candidate] = []
        for size in range(request.min_nodes, min(len(live), MAX_CYCLE) + 1):
            for ring in self._cycles(state, live, size):
                cand = self._check(request, card, ring, nodes, rejections)
                if cand is not None:
                    viable.append(cand)
            if viable:
                break
        if not viable:
            detail = "; ".join(dict.fromkeys(rejections)) or "no connected set of nodes"
            kind = "memory_shortfall" if any("memory" in r for r in rejections) else "no_candidate"
            raise PlacementError(kind, f"cannot place {card.model_id}: {detail}")
        hosting = replicas_by_node(state, card.model_id)
        best = min(viable, key=lambda c: self._rank(c, card, nodes, hosting))
        return self._instance(request, card, best, instance_id, nodes)

    def _check(
        self,
        request: PlacementRequest,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        rejections: list[str],
    ) -> _Candidate | None:
        common = set.intersection(*(set(caps[n].backends) for n in ring))
        allowed = [b for b in common if not card.compatible_backends or b in card.compatible_backends]
        if not allowed:
            have = {n: list(caps[n].backends) for n in ring}
            rejections.append(f"no backend compatible with {list(card.compatible_backends) or 'any'} on {have}")
            return None
        pref = list(card.backend_preference)
        backend = min(allowed, key=lambda b: (pref.index(b) if b in pref else len(pref), b))
        width = len(ring)
        if width > 1 and any(request.sharding not in caps[n].splits.get(backend, ()) for n in ring):
            rejections.append(
                f"the {backend} engine runs whole models only: it cannot split {card.model_id} across {width} "
                f"nodes ({request.sharding}); place it on one node (min_nodes 1), or use an engine that splits "
                "models, such as mlx"
            )
            return None
        if request.sharding == "Tensor" and width > 1 and not card.supports_tensor:
            rejections.append(
                f"{card.model_id} does not support tensor sharding (its card says "
                "supports_tensor = false); use Pipeline"
            )
            return None
        if (
            request.sharding == "Tensor"
            and width > 1
            and (card.hidden_size % width or card.num_key_value_heads % width)
        ):
            rejections.append(
                f"tensor sharding over {width} nodes needs hidden_size "
                f"({card.hidden_size}) and KV heads ({card.num_key_value_heads}) divisible "
                f"by {width}"
            )
            return None
        shares = self._layer_split(card, ring, caps, request.sharding, backend)
        for node in ring:
            start, end = shares[node]
            share = (1 / width) if request.sharding == "Tensor" else (end - start) / card.n_layers
            need = self.need_bytes(card, share, width)
            pool, available = memory_pool(caps[node], backend)
            if need >= available:
                rejections.append(
                    f"memory shortfall on node {node}: needs {_fmt(need)} = weights "
                    f"{_fmt(card.storage_size * share)} x overhead {self.overhead} + KV "
                    f"{_fmt(self.kv_bytes(card) * share)} + floor {_fmt(self.floor_bytes)}, but only "
                    f"{_fmt(available)} {'of VRAM ' if pool == 'VRAM' else ''}is available for {backend}"
                )
                return None
        return _Candidate(ring, backend, shares)

    @staticmethod
    def _rank(
        c: _Candidate, card: ModelCard, caps: dict[str, NodeCapacity], hosting: dict[str, int]
    ) -> tuple[object, ...]:
        pref = list(card.backend_preference)
        present = sum(card.model_id in caps[n].models_present for n in c.nodes)
        free = sum(caps[n].ram_available for n in c.nodes)
        replicas = sum(hosting.get(n, 0) for n in c.nodes)
        backend = pref.index(c.backend) if c.backend in pref else len(pref)
        return (len(c.nodes), replicas, backend, -present, -free, c.nodes)

    def _instance(
        self,
        request: PlacementRequest,
        card: ModelCard,
        cand: _Candidate,
        instance_id: str,
        caps: dict[str, NodeCapacity],
    ) -> RingInstance:
        shard_type = TensorShardMetadata if request.sharding == "Tensor" else PipelineShardMetadata
        runner_to_shard: dict[RunnerId, ShardMetadata] = {}
        node_to_runner: dict[NodeId, RunnerId] = {}
        for rank, node in enumerate(cand.nodes):
            runner_id = RunnerId(f"{instance_id}-r{rank}")
            start, end = cand.shares[node]
            runner_to_shard[runner_id] = shard_type(
                model_id=card.model_id,
                device_rank=rank,
                world_size=len(cand.nodes),
                start_layer=start,
                end_layer=end,
                n_layers=card.n_layers,
                backend=cand.backend,
            )
            node_to_runner[NodeId(node)] = runner_id
        group = RankGroup(hosts=ring_hosts(instance_id, cand.nodes, caps)) if len(cand.nodes) > 1 else None
        return RingInstance(
            instance_id=InstanceId(instance_id),
            shard_assignments=ShardAssignments(
                model_id=card.model_id, runner_to_shard=runner_to_shard, node_to_runner=node_to_runner
            ),
            engine=cand.backend.split("-", 1)[0],
            context_limit=card.context_length,
            excluded_nodes=tuple(NodeId(n) for n in request.excluded_nodes),
            group=group,
        )
