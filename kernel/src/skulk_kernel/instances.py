"""Instances, shards and runner statuses: the placement half of State.

An instance is one running copy of a model, spread over one or more runners (one per rank). The
instance's tag names how its ranks talk (`MlxRingInstance` is also used for single-node instances of
any engine, as in the reference) and every shard carries the backend it was placed for.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .ids import InstanceId, ModelId, NodeId, RunnerId
from .wire import Tagged, WireModel, tagged_union

Sharding = Literal["Pipeline", "Tensor"]
InstanceMeta = Literal["MlxRing", "MlxJaccl", "LlamaRpc"]


class _Shard(Tagged):
    model_id: ModelId
    device_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    start_layer: int = Field(ge=0)
    end_layer: int = Field(ge=0)
    n_layers: int = Field(ge=1)
    backend: str


class PipelineShardMetadata(_Shard):
    pass


class TensorShardMetadata(_Shard):
    pass


class CfgShardMetadata(_Shard):
    pass


class RpcDonorShardMetadata(_Shard):
    pass


ShardMetadata = tagged_union(
    PipelineShardMetadata, TensorShardMetadata, CfgShardMetadata, RpcDonorShardMetadata
)


class ShardAssignments(WireModel):
    model_id: ModelId
    runner_to_shard: dict[RunnerId, ShardMetadata]
    node_to_runner: dict[NodeId, RunnerId]


class _Instance(Tagged):
    instance_id: InstanceId
    shard_assignments: ShardAssignments
    engine: str
    context_limit: int = Field(ge=1, description="tokens; prompt + max_tokens must fit")
    excluded_nodes: tuple[NodeId, ...] = ()


class MlxRingInstance(_Instance):
    pass


class MlxJacclInstance(_Instance):
    pass


class LlamaRpcInstance(_Instance):
    pass


Instance = tagged_union(MlxRingInstance, MlxJacclInstance, LlamaRpcInstance)
INSTANCE_TYPES: dict[InstanceMeta, type[_Instance]] = {
    "MlxRing": MlxRingInstance,
    "MlxJaccl": MlxJacclInstance,
    "LlamaRpc": LlamaRpcInstance,
}


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


RunnerStatus = tagged_union(
    RunnerIdle,
    RunnerConnecting,
    RunnerConnected,
    RunnerLoading,
    RunnerLoaded,
    RunnerWarmingUp,
    RunnerReady,
    RunnerRunning,
    RunnerShuttingDown,
    RunnerShutdown,
    RunnerFailed,
)
SERVING_STATUSES = (RunnerReady, RunnerRunning)


def instance_ready(instance: _Instance, runners: dict[RunnerId, object]) -> bool:
    """An instance serves when every one of its runners is Ready or Running."""
    shards = instance.shard_assignments.runner_to_shard
    return bool(shards) and all(
        isinstance(runners.get(rid), SERVING_STATUSES) for rid in shards
    )
