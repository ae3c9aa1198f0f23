"""Events: past-tense facts, indexed by the master, applied by every node.

Events are immutable history. The closed union `Event` is the only thing apply() accepts; plugin
data that must be replicated rides in `PluginDataSet`, which apply() stores without interpreting.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, get_args

from pydantic import Field

from .ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from .instances import Instance, RunnerStatus
from .models import ModelCard
from .tasks import Task, TaskStatus
from .wire import Tagged, WireModel, tagged_union


class Connection(WireModel):
    """A directed observation about `source`'s session to `sink` over `kind` (zenoh, libp2p)."""

    source: NodeId
    sink: NodeId
    kind: str = "transport"


class InstanceCreated(Tagged):
    instance: Instance


class InstanceDeleted(Tagged):
    instance_id: InstanceId
    reason: str = ""


class InstanceFailureRecorded(Tagged):
    instance_id: InstanceId
    model_id: ModelId
    reason: str
    at: datetime


class RunnerStatusUpdated(Tagged):
    runner_id: RunnerId
    status: RunnerStatus


class TaskCreated(Tagged):
    task: Task


class TaskAcknowledged(Tagged):
    task_id: TaskId


class TaskStatusUpdated(Tagged):
    task_id: TaskId
    status: TaskStatus


class TaskFailed(Tagged):
    task_id: TaskId
    error_message: str


class TaskDeleted(Tagged):
    task_id: TaskId


class NodeJoined(Tagged):
    node_id: NodeId


class NodeTimedOut(Tagged):
    """Carries the evidence, so the log explains the prune after the live readings are gone."""

    node_id: NodeId
    last_event_age_s: float | None = None
    heartbeat_age_s: float | None = None
    telemetry_age_s: float | None = None
    timeout_s: float


class TopologyEdgeCreated(Tagged):  # the session is back: the pair leaves `Topology.missing`
    edge: Connection


class TopologyEdgeDeleted(Tagged):  # `source` has no session to `sink`, a member: recorded as missing
    edge: Connection


class DownloadPending(Tagged):
    node_id: NodeId
    model_id: ModelId


class DownloadCompleted(Tagged):
    node_id: NodeId
    model_id: ModelId
    total_bytes: int = Field(default=0, ge=0)


class DownloadFailed(Tagged):
    node_id: NodeId
    model_id: ModelId
    error_message: str


class CustomModelCardAdded(Tagged):
    card: ModelCard


class CustomModelCardDeleted(Tagged):
    model_id: ModelId


class TracingStateChanged(Tagged):
    enabled: bool


class PluginDataSet(Tagged):
    """Replicated plugin data; `value=None` deletes the key."""

    plugin: str
    key: str
    value: Any = None


# fmt: off
Event: TypeAlias = (
    InstanceCreated | InstanceDeleted | InstanceFailureRecorded | RunnerStatusUpdated | TaskCreated
    | TaskAcknowledged | TaskStatusUpdated | TaskFailed | TaskDeleted | NodeJoined | NodeTimedOut
    | TopologyEdgeCreated | TopologyEdgeDeleted | DownloadPending | DownloadCompleted | DownloadFailed
    | CustomModelCardAdded | CustomModelCardDeleted | TracingStateChanged | PluginDataSet
)
# fmt: on
EVENT_TYPES: tuple[type[Tagged], ...] = get_args(Event)
if not TYPE_CHECKING:
    Event = tagged_union(Event)


class IndexedEvent(WireModel):
    """The unit that is persisted, replayed and applied.

    `origin` and `at` are stamped by the master when it indexes the event: apply() reads time only
    from here, never from a clock.
    """

    idx: int = Field(ge=0)
    origin: NodeId
    at: datetime
    event: Event


class LocalEvent(WireModel):
    """An event a node reports on LOCAL_EVENTS, before the master indexes it."""

    origin: NodeId
    event: Event
