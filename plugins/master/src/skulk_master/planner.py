"""Placement: which nodes run a model, and which layers each one holds.

Pure over its inputs (request, State, live node capacities), so POST /place_instance can dry-run
exactly the function the master uses. Candidates are connected cycles of at least `min_nodes`
nodes; filters run in order (exclusions, backends, tensor divisibility, KV cache type, per-node
memory at the largest context that fits: `context_tokens`, else `default_contexts`) and the
survivors are ranked: fewest nodes, largest context, fewest replicas, preferred backend, files
already present, most free memory. A node's free memory is its pool (`memory_pool`) less what
instances not loaded yet were admitted for there (`reservations`). Every refusal is a typed
PlacementError whose message carries the arithmetic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import combinations, permutations
from typing import cast

from skulk_kernel.api import (
    InstanceId,
    KvCacheType,
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

from .memory import (
    KV_BITS,
    MIN_CONTEXT,
    QUANTIZED_KV_ENGINES,
    MiB,
    _fmt,
    default_contexts,
    engine_overhead,
    kv_bytes,
    memory_pool,
    reservations,
    unified_ceiling,
)

MAX_CYCLE = 4
#: engines whose ranks may run different computes (each rank's own build and device: a CUDA box's
#: rpc-server beside a Mac's Metal one); every other engine's ranks share one backend tag
MIXED_COMPUTE_ENGINES = frozenset({"llama_rpc"})
# Ports of multi-rank groups: [base, base + span + MAX_CYCLE). Below every common ephemeral range
# (Linux 32768-60999, macOS and Windows 49152-65535): a port the kernel hands to any outgoing
# connection or bind(0) on the host could not be listened on, and the group would never form (seen:
# "Address already in use", then a 120 s formation timeout, with 41000-57000 under a parallel test run).
RING_PORT_BASE, RING_PORT_SPAN = 20000, 12000


@dataclass(frozen=True)
class _Candidate:
    nodes: tuple[str, ...]
    backend: str
    shares: dict[str, tuple[int, int]]  # node -> (start_layer, end_layer)
    context: int = 0
    need: dict[str, int] = field(default_factory=dict)  # node -> bytes admitted
    tags: dict[str, str] = field(default_factory=dict)  # node -> its own backend tag, where they differ

    def tag(self, node: str) -> str:
        return self.tags.get(node, self.backend)


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

    def __init__(self, overhead: float | None = None, floor_bytes: int = 256 * MiB) -> None:
        self.overhead = overhead  # None: each engine's measured figures (ENGINE_OVERHEAD)
        self.floor_bytes = floor_bytes

    def overhead_for(self, backend: str) -> tuple[float, int, str]:
        """(multiplier on weights, fixed runtime bytes, where they come from) for `backend`'s engine."""
        return engine_overhead(backend, self.overhead)

    # ------------------------------------------------------------------ candidates

    @staticmethod
    def _connected(state: State, a: str, b: str) -> bool:
        """Members are connected unless either reports the session between them missing."""
        return not any({c.source, c.sink} == {a, b} for c in state.topology.missing)

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

    def kv_bytes(self, card: ModelCard, context: int | None = None, kv_cache_type: str = "f16") -> int:
        """KV cache (K and V, every layer) for `context` tokens (None: the card's whole context)."""
        return kv_bytes(card, card.context_length if context is None else context, kv_cache_type)

    def _layer_split(
        self,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        sharding: str,
        backend: str = "",
        tags: dict[str, str] | None = None,
    ) -> dict[str, tuple[int, int]]:
        n = card.n_layers
        if sharding == "Tensor" or len(ring) == 1:
            return {node: (0, n) for node in ring}
        weights = [max(memory_pool(caps[node], (tags or {}).get(node, backend))[1], 1) for node in ring]
        total = sum(weights)
        bounds, start = {}, 0
        for i, node in enumerate(ring):
            count = n - start if i == len(ring) - 1 else max(1, round(n * weights[i] / total))
            count = min(count, n - start - (len(ring) - 1 - i))
            bounds[node] = (start, start + count)
            start += count
        return bounds

    def need_bytes(
        self,
        card: ModelCard,
        share: float,
        width: int,
        context: int | None = None,
        kv_cache_type: str = "f16",
        backend: str = "",
    ) -> int:
        """weights x overhead + runtime + KV + floor for a `share` of the model on `backend`'s engine
        (context None: the card's; the runtime is the whole runner's, whatever its share)."""
        factor, runtime, _ = self.overhead_for(backend)
        weights = card.storage_size * share
        kv = self.kv_bytes(card, context, kv_cache_type) * share
        return int(weights * factor + runtime + kv + self.floor_bytes)

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
        if request.kv_cache_type not in KV_BITS:
            raise PlacementError("invalid_kv_cache_type", f"kv_cache_type must be one of {sorted(KV_BITS)}")
        # never above the card's own (the API refuses a larger one; a re-placement keeps the lost one's)
        asked = min(request.context_tokens, card.context_length) if request.context_tokens else None
        viable, rejections = self._search(request, card, state, live, nodes, [asked] if asked else None)
        if not viable:
            detail = "; ".join(dict.fromkeys(rejections)) or "no connected set of nodes"
            kind = "memory_shortfall" if any("memory" in r for r in rejections) else "no_candidate"
            if asked and kind == "memory_shortfall":
                smaller = [c for c in default_contexts(card, asked) if c < asked]
                fits = self._search(request, card, state, live, nodes, smaller)[0] if smaller else []
                best_fit = max((c.context for c in fits), default=0)
                detail += (
                    f"; the largest context that fits is {best_fit} (context_tokens={best_fit})"
                    if best_fit
                    else f"; no context down to {MIN_CONTEXT} tokens fits"
                )
            raise PlacementError(kind, f"cannot place {card.model_id}: {detail}")
        hosting = replicas_by_node(state, card.model_id)
        best = min(viable, key=lambda c: self._rank(c, card, nodes, hosting))
        return self._instance(request, card, best, instance_id, nodes)

    def _search(
        self,
        request: PlacementRequest,
        card: ModelCard,
        state: State,
        live: list[str],
        caps: dict[str, NodeCapacity],
        contexts: list[int] | None,
    ) -> tuple[list[_Candidate], list[str]]:
        """The viable candidates of the smallest viable size, each at the largest of `contexts`
        (None: default_contexts) that fits it, and every reason a candidate was refused."""
        rejections: list[str] = []
        viable: list[_Candidate] = []
        for size in range(request.min_nodes, min(len(live), MAX_CYCLE) + 1):
            for ring in self._cycles(state, live, size):
                cand = self._check(request, card, ring, caps, rejections, state, contexts or default_contexts(card))
                if cand is not None:
                    viable.append(cand)
            if viable:
                break
        return viable, rejections

    def _check(
        self,
        request: PlacementRequest,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        rejections: list[str],
        state: State,
        contexts: list[int],
    ) -> _Candidate | None:
        common = set.intersection(*(set(caps[n].backends) for n in ring))
        allowed = [b for b in common if not card.compatible_backends or b in card.compatible_backends]
        if not allowed:
            if (mixed := self._check_mixed(request, card, ring, caps, rejections, state, contexts)) is not None:
                return mixed
            have = {n: list(caps[n].backends) for n in ring}
            rejections.append(f"no backend compatible with {list(card.compatible_backends) or 'any'} on {have}")
            return None
        pref = list(card.backend_preference)
        for backend in sorted(allowed, key=lambda b: (pref.index(b) if b in pref else len(pref), b)):
            # preferred first (a GPU build before the CPU one); a backend that does not hold the
            # model (VRAM short) falls back to the next, so a GPU node still runs it on its CPU
            found = self._check_backend(request, card, ring, caps, rejections, state, contexts, backend)
            if found is not None:
                return found
        return self._check_mixed(request, card, ring, caps, rejections, state, contexts)

    def _check_mixed(
        self,
        request: PlacementRequest,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        rejections: list[str],
        state: State,
        contexts: list[int],
    ) -> _Candidate | None:
        """A ring of an engine whose ranks may differ in compute (MIXED_COMPUTE_ENGINES), each node on
        its own most preferred tag of that engine and charged against that tag's pool."""
        if len(ring) < 2:
            return None
        pref = list(card.backend_preference)
        for engine in sorted(MIXED_COMPUTE_ENGINES):
            tags: dict[str, str] = {}
            for node in ring:
                own = [
                    b
                    for b in caps[node].backends
                    if b.split("-", 1)[0] == engine and (not card.compatible_backends or b in card.compatible_backends)
                ]
                if not own:
                    break
                tags[node] = min(own, key=lambda b: (pref.index(b) if b in pref else len(pref), b))
            if len(tags) == len(ring) and len(set(tags.values())) > 1:
                first = tags[ring[0]]
                return self._check_backend(request, card, ring, caps, rejections, state, contexts, first, tags)
        return None

    def _check_backend(
        self,
        request: PlacementRequest,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        rejections: list[str],
        state: State,
        contexts: list[int],
        backend: str,
        tags: dict[str, str] | None = None,
    ) -> _Candidate | None:
        width = len(ring)
        tags = tags or {}
        if width > 1 and any(request.sharding not in caps[n].splits.get(tags.get(n, backend), ()) for n in ring):
            rejections.append(
                f"the {backend} engine runs whole models only: it cannot split {card.model_id} across {width} "
                f"nodes ({request.sharding}); place it on one node (min_nodes 1), or use an engine that splits "
                "models: llama_rpc for a GGUF (skulk-kernel engines install llamacpp-rpc on each node), mlx"
            )
            return None
        if width > 1 and (why := self._mixed_builds(backend, ring, caps)):
            rejections.append(why)
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
        kv_type = request.kv_cache_type
        if kv_type != "f16" and backend.split("-", 1)[0] not in QUANTIZED_KV_ENGINES:
            rejections.append(
                f"kv_cache_type {kv_type} needs an engine that quantizes its KV cache "
                f"({', '.join(sorted(QUANTIZED_KV_ENGINES))}); {backend} keeps it at f16"
            )
            return None
        shares = self._layer_split(card, ring, caps, request.sharding, backend, tags)
        first = ""
        for context in contexts:
            need, why = self._fits(request, card, ring, caps, shares, backend, context, state, tags)
            if not why:
                return _Candidate(ring, backend, shares, context, need, tags)
            first = first or why
        rejections.append(first)
        return None

    @staticmethod
    def _mixed_builds(backend: str, ring: tuple[str, ...], caps: dict[str, NodeCapacity]) -> str:
        """Why `ring` cannot form one group on `backend` because its nodes run different builds of the
        engine ('' when they agree): the ranks of one instance speak one protocol (llama.cpp's RPC
        version, an MLX ring's wire format), and a mismatch fails only once the group forms."""
        engine = backend.split("-", 1)[0]
        builds = {n: caps[n].builds.get(engine, "") for n in ring}
        if len(set(builds.values())) <= 1:
            return ""
        listed = ", ".join(f"{n}: {b or 'unknown'}" for n, b in builds.items())
        return (
            f"nodes {', '.join(ring)} run different {engine} builds ({listed}); the ranks of one instance "
            "need one build: install the same one on each (skulk-kernel engines install)"
        )

    def _fits(
        self,
        request: PlacementRequest,
        card: ModelCard,
        ring: tuple[str, ...],
        caps: dict[str, NodeCapacity],
        shares: dict[str, tuple[int, int]],
        backend: str,
        context: int,
        state: State,
        tags: dict[str, str] | None = None,
    ) -> tuple[dict[str, int], str]:
        """(bytes needed per node, "") when `ring` holds the model at `context` tokens; else ({}, why)."""
        width, kv_type, needs = len(ring), request.kv_cache_type, {}
        ring_backend = backend
        for node in ring:
            backend = (tags or {}).get(node, ring_backend)  # the node's own tag (and pool) in a mixed ring
            start, end = shares[node]
            share = (1 / width) if request.sharding == "Tensor" else (end - start) / card.n_layers
            need = self.need_bytes(card, share, width, context, kv_type, backend)
            pool, free = memory_pool(caps[node], backend)
            committed, held = reservations(state, node, pool)
            available = free - committed
            if pool == "unified memory":
                available = min(available, unified_ceiling(caps[node].ram_total) - held)
            if need >= available:
                pending = f" ({_fmt(committed)} committed to instances not loaded yet)" if committed else ""
                factor, runtime, source = self.overhead_for(backend)
                return {}, (
                    f"memory shortfall on node {node}: at {context} tokens needs {_fmt(need)} = weights "
                    f"{_fmt(card.storage_size * share)} x overhead {factor:g} ({source})"
                    f"{f' + runtime {_fmt(runtime)}' if runtime else ''} + KV "
                    f"{_fmt(self.kv_bytes(card, context, kv_type) * share)} ({kv_type}) + floor "
                    f"{_fmt(self.floor_bytes)}, but only {_fmt(max(available, 0))} "
                    f"{'' if pool == 'RAM' else f'of {pool} '}is available for {backend}{pending}"
                )
            needs[node] = need
        return needs, ""

    @staticmethod
    def _rank(
        c: _Candidate, card: ModelCard, caps: dict[str, NodeCapacity], hosting: dict[str, int]
    ) -> tuple[object, ...]:
        pref = list(card.backend_preference)
        present = sum(card.model_id in caps[n].models_present for n in c.nodes)
        free = sum(caps[n].ram_available for n in c.nodes)
        replicas = sum(hosting.get(n, 0) for n in c.nodes)
        backend = pref.index(c.backend) if c.backend in pref else len(pref)
        return (len(c.nodes), -c.context, replicas, backend, -present, -free, c.nodes)

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
                backend=cand.tag(node),
            )
            node_to_runner[NodeId(node)] = runner_id
        group = (
            RankGroup(hosts=ring_hosts(instance_id, cand.nodes, caps), layers=tuple(cand.shares[n] for n in cand.nodes))
            if len(cand.nodes) > 1
            else None
        )
        return RingInstance(
            instance_id=InstanceId(instance_id),
            shard_assignments=ShardAssignments(
                model_id=card.model_id, runner_to_shard=runner_to_shard, node_to_runner=node_to_runner
            ),
            engine=cand.backend.split("-", 1)[0],
            context_limit=cand.context,
            excluded_nodes=tuple(NodeId(n) for n in request.excluded_nodes),
            group=group,
            kv_cache_type=cast(KvCacheType, request.kv_cache_type),
            reserved_bytes={NodeId(n): need for n, need in cand.need.items()},
        )
