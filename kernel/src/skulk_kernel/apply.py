"""apply(state, indexed_event) -> State: pure, total, deterministic.

No hooks, no clock, no randomness, no I/O: the same log gives byte-identical State on every node
whatever plugins it loaded. Each event type has one small function; an event that refers to
something State does not hold is a no-op (replays and races must never raise).
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from . import events as ev
from .state import (
    MAX_INSTANCE_FAILURES,
    DownloadCompletedStatus,
    DownloadFailedStatus,
    DownloadPendingStatus,
    InstanceFailure,
    State,
    Topology,
)


class OutOfOrderEvent(ValueError):
    """apply() was handed an event whose index does not follow the State's last one."""


def apply(state: State, indexed: ev.IndexedEvent) -> State:
    if indexed.idx != state.last_event_applied_idx + 1:
        raise OutOfOrderEvent(f"event {indexed.idx} does not follow {state.last_event_applied_idx}")
    updates = _apply_event(indexed.event, state)
    # Start from the rule's own last_seen (NodeTimedOut prunes it), then stamp the origin.
    last_seen = {**updates.get("last_seen", state.last_seen), indexed.origin: indexed.at}
    return state.model_copy(update={**updates, "last_seen": last_seen, "last_event_applied_idx": indexed.idx})


Updates = dict[str, Any]


@singledispatch
def _apply_event(event: object, state: State) -> Updates:
    raise TypeError(f"apply() has no rule for {type(event).__name__}")


def _without(mapping: dict[Any, Any], *keys: Any) -> dict[Any, Any]:
    return {k: v for k, v in mapping.items() if k not in keys}


@_apply_event.register
def _(event: ev.InstanceCreated, state: State) -> Updates:
    inst = event.instance
    return {"instances": {**state.instances, inst.instance_id: inst}}


@_apply_event.register
def _(event: ev.InstanceDeleted, state: State) -> Updates:
    inst = state.instances.get(event.instance_id)
    if inst is None:
        return {}
    runner_ids = inst.shard_assignments.runner_to_shard.keys()
    return {"instances": _without(state.instances, event.instance_id), "runners": _without(state.runners, *runner_ids)}


@_apply_event.register
def _(event: ev.InstanceFailureRecorded, state: State) -> Updates:
    failure = InstanceFailure(instance_id=event.instance_id, model_id=event.model_id, reason=event.reason, at=event.at)
    return {"instance_failures": (*state.instance_failures, failure)[-MAX_INSTANCE_FAILURES:]}


@_apply_event.register
def _(event: ev.RunnerStatusUpdated, state: State) -> Updates:
    # A runner belongs to an instance; a late status for a deleted instance must not resurrect it.
    owned = any(event.runner_id in inst.shard_assignments.runner_to_shard for inst in state.instances.values())
    if not owned:
        return {}
    return {"runners": {**state.runners, event.runner_id: event.status}}


@_apply_event.register
def _(event: ev.TaskCreated, state: State) -> Updates:
    return {"tasks": {**state.tasks, event.task.task_id: event.task}}


def _set_task_status(state: State, task_id: str, status: str) -> Updates:
    task = state.tasks.get(task_id)  # type: ignore[call-overload]
    if task is None:
        return {}
    return {"tasks": {**state.tasks, task_id: task.model_copy(update={"status": status})}}


@_apply_event.register
def _(event: ev.TaskAcknowledged, state: State) -> Updates:
    return _set_task_status(state, event.task_id, "Running")


@_apply_event.register
def _(event: ev.TaskStatusUpdated, state: State) -> Updates:
    return _set_task_status(state, event.task_id, event.status)


@_apply_event.register
def _(event: ev.TaskFailed, state: State) -> Updates:
    return _set_task_status(state, event.task_id, "Failed")


@_apply_event.register
def _(event: ev.TaskDeleted, state: State) -> Updates:
    return {"tasks": _without(state.tasks, event.task_id)}


@_apply_event.register
def _(event: ev.NodeJoined, state: State) -> Updates:
    if event.node_id in state.topology.nodes:
        return {}
    nodes = (*state.topology.nodes, event.node_id)
    return {"topology": state.topology.model_copy(update={"nodes": nodes})}


@_apply_event.register
def _(event: ev.NodeTimedOut, state: State) -> Updates:
    node = event.node_id
    topology = Topology(
        nodes=tuple(n for n in state.topology.nodes if n != node),
        missing=tuple(c for c in state.topology.missing if node not in (c.source, c.sink)),
    )
    return {
        "topology": topology,
        "last_seen": _without(state.last_seen, node),
        "downloads": _without(state.downloads, node),
    }


@_apply_event.register
def _(event: ev.TopologyEdgeCreated, state: State) -> Updates:
    missing = tuple(c for c in state.topology.missing if c != event.edge)
    return {"topology": state.topology.model_copy(update={"missing": missing})}


@_apply_event.register
def _(event: ev.TopologyEdgeDeleted, state: State) -> Updates:
    if event.edge in state.topology.missing:
        return {}
    return {"topology": state.topology.model_copy(update={"missing": (*state.topology.missing, event.edge)})}


def _set_download(state: State, node: str, model: str, status: object) -> Updates:
    per_node = {**state.downloads.get(node, {}), model: status}  # type: ignore[call-overload]
    return {"downloads": {**state.downloads, node: per_node}}


@_apply_event.register
def _(event: ev.DownloadPending, state: State) -> Updates:
    return _set_download(state, event.node_id, event.model_id, DownloadPendingStatus())


@_apply_event.register
def _(event: ev.DownloadCompleted, state: State) -> Updates:
    status = DownloadCompletedStatus(total_bytes=event.total_bytes)
    return _set_download(state, event.node_id, event.model_id, status)


@_apply_event.register
def _(event: ev.DownloadFailed, state: State) -> Updates:
    status = DownloadFailedStatus(error_message=event.error_message)
    return _set_download(state, event.node_id, event.model_id, status)


@_apply_event.register
def _(event: ev.CustomModelCardAdded, state: State) -> Updates:
    return {"custom_model_cards": {**state.custom_model_cards, event.card.model_id: event.card}}


@_apply_event.register
def _(event: ev.CustomModelCardDeleted, state: State) -> Updates:
    return {"custom_model_cards": _without(state.custom_model_cards, event.model_id)}


@_apply_event.register
def _(event: ev.TracingStateChanged, state: State) -> Updates:
    return {"tracing_enabled": event.enabled}


@_apply_event.register
def _(event: ev.PluginDataSet, state: State) -> Updates:
    per_plugin = dict(state.plugin_data.get(event.plugin, {}))
    if event.value is None:
        per_plugin.pop(event.key, None)
    else:
        per_plugin[event.key] = event.value
    plugin_data = {**state.plugin_data, event.plugin: per_plugin}
    if not per_plugin:
        plugin_data.pop(event.plugin)
    return {"plugin_data": plugin_data}


def replay(records: Any, state: State | None = None) -> State:
    """Fold an iterable of IndexedEvents into a State (used by joiners and tests)."""
    current = state or State()
    for indexed in records:
        current = apply(current, indexed)
    return current
