"""Instances, shards and runner statuses: the placement half of State.

An instance is one running copy of a model, spread over one or more runners (one per rank). Its
ranks form a ring: a single-node instance is a ring of one, a pipeline passes hidden states to the
next rank, a tensor split all-reduces around it. Every shard carries the backend it was placed for
and, for a multi-rank instance, the address its rank listens on for its group.

The reference system's wire names (``MlxRingInstance``, ``instance_meta: "MlxRing"``) belong to
its HTTP contract; the control API translates them at its edge (see skulk_api_control.state_view).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypeAlias

from pydantic import Field

from .ids import InstanceId, ModelId, NodeId, RunnerId
from .wire import Tagged, WireModel, tagged_union

Sharding = Literal["Pipeline", "Tensor"]
KvCacheType = Literal["f16", "q8_0", "q4_0"]
GROUP_FORMATION_DEADLINE_S = 120.0


class ShardBase(Tagged):
    """One rank's part of a model: layers [start_layer, end_layer) (all of them for Tensor)."""

    model_id: ModelId
    device_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    start_layer: int = Field(ge=0)
    end_layer: int = Field(ge=0)
    n_layers: int = Field(ge=1)
    backend: str


class PipelineShardMetadata(ShardBase):
    pass


class TensorShardMetadata(ShardBase):
    pass


ShardMetadata: TypeAlias = PipelineShardMetadata | TensorShardMetadata
if not TYPE_CHECKING:
    ShardMetadata = tagged_union(ShardMetadata)


class ShardAssignments(WireModel):
    model_id: ModelId
    runner_to_shard: dict[RunnerId, ShardMetadata]
    node_to_runner: dict[NodeId, RunnerId]


class RankGroup(WireModel):
    """How the ranks of a multi-rank instance reach each other, stamped once by the planner.

    `hosts[r]` is the ``ip:port`` rank r listens on (chosen from the observed topology); the
    ranks must all have joined within `formation_deadline_s` or the instance fails with the reason.
    """

    hosts: tuple[str, ...]
    layers: tuple[tuple[int, int], ...] = ()  # each rank's [start, end) layers (a driver sizes its split)
    formation_deadline_s: float = Field(default=GROUP_FORMATION_DEADLINE_S, gt=0)
    collective_timeout_s: float = Field(default=60.0, gt=0)


class RingInstance(Tagged):
    instance_id: InstanceId
    shard_assignments: ShardAssignments
    engine: str
    context_limit: int = Field(ge=1, description="tokens; prompt + max_tokens must fit")
    excluded_nodes: tuple[NodeId, ...] = ()
    group: RankGroup | None = Field(default=None, description="None for a single-rank instance")
    system_role: str | None = Field(default=None, description='a cluster service ("steward"), not a user model')
    kv_cache_type: KvCacheType = "f16"
    reserved_bytes: dict[NodeId, int] = Field(default_factory=dict, description="memory admitted, per node")


Instance: TypeAlias = RingInstance
if not TYPE_CHECKING:
    Instance = tagged_union(Instance)


# --- runner statuses ---------------------------------------------------------------------------


class RunnerIdle(Tagged):
    pass


class RunnerConnecting(Tagged):
    pass


class RunnerConnected(Tagged):
    pass


class RunnerLoading(Tagged):
    layers_loaded: int = 0
    total_layers: int = 0


class RunnerLoaded(Tagged):
    pass


class RunnerWarmingUp(Tagged):
    pass


class RunnerReady(Tagged):
    pass


class RunnerRunning(Tagged):
    pass


class RunnerShuttingDown(Tagged):
    pass


class RunnerShutdown(Tagged):
    pass


class RunnerFailed(Tagged):
    error_message: str


# fmt: off
RunnerStatus: TypeAlias = (
    RunnerIdle | RunnerConnecting | RunnerConnected | RunnerLoading | RunnerLoaded | RunnerWarmingUp
    | RunnerReady | RunnerRunning | RunnerShuttingDown | RunnerShutdown | RunnerFailed
)
# fmt: on
if not TYPE_CHECKING:
    RunnerStatus = tagged_union(RunnerStatus)
SERVING_STATUSES = (RunnerReady, RunnerRunning)


def instance_ready(instance: Instance, runners: Mapping[RunnerId, object]) -> bool:
    """An instance serves when every one of its runners is Ready or Running."""
    shards = instance.shard_assignments.runner_to_shard
    return bool(shards) and all(isinstance(runners.get(rid), SERVING_STATUSES) for rid in shards)
