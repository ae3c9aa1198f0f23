"""State: the one replicated picture of the cluster, built only by apply()."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import msgpack
from pydantic import Field

from .events import Connection
from .ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from .instances import Instance, RunnerStatus
from .models import ModelCard
from .tasks import Task
from .wire import Tagged, WireModel, tagged_union

MAX_INSTANCE_FAILURES = 64


class Topology(WireModel):  # every pair of members is connected but those in `missing` (a mesh costs nothing)
    nodes: tuple[NodeId, ...] = ()
    missing: tuple[Connection, ...] = ()


class InstanceFailure(WireModel):
    instance_id: InstanceId
    model_id: ModelId
    reason: str
    at: datetime


class DownloadPendingStatus(Tagged):
    pass


class DownloadCompletedStatus(Tagged):
    total_bytes: int = 0


class DownloadFailedStatus(Tagged):
    error_message: str


DownloadStatus: TypeAlias = DownloadPendingStatus | DownloadCompletedStatus | DownloadFailedStatus
if not TYPE_CHECKING:
    DownloadStatus = tagged_union(DownloadStatus)


class State(WireModel):
    instances: dict[InstanceId, Instance] = Field(default_factory=dict)
    runners: dict[RunnerId, RunnerStatus] = Field(default_factory=dict)
    tasks: dict[TaskId, Task] = Field(default_factory=dict)
    downloads: dict[NodeId, dict[ModelId, DownloadStatus]] = Field(default_factory=dict)
    topology: Topology = Topology()
    last_seen: dict[NodeId, datetime] = Field(default_factory=dict)
    instance_failures: tuple[InstanceFailure, ...] = ()
    custom_model_cards: dict[ModelId, ModelCard] = Field(default_factory=dict)
    tracing_enabled: bool = False
    last_event_applied_idx: int = -1
    plugin_data: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def state_hash(self) -> str:
        """A digest that is equal on two nodes exactly when their States are equal."""
        packed = msgpack.packb(self.wire(), use_bin_type=True)
        return hashlib.sha256(packed).hexdigest()


class StateSnapshot(WireModel):
    """The master's answer on STATE_SYNC: its whole State (bounded, unlike the log)."""

    master_node_id: NodeId
    state: State | None = None
    reason: str = ""
