"""Entry point of the observe plugin: hookimpls only, light imports.

Where each span comes from (with tracing on):

* the API node: `wrap_inference` middleware (api.request, api.dispatch, data_plane.receive,
  api.stream_end);
* the master: `check_command` (the command reached it) and `on_event_applied` (the task was
  created, acknowledged, finished: master.placement_wait, master.task_*);
* the worker node: the worker's supervisor calls `skulk_observe.record_span` for the runner queue,
  the runner's prefill and decode batches and the data-plane sends (worker.*, runner.*,
  data_plane.send).

The flight recorder is fed by the supervisor (`record_phase`) whether tracing is on or not.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface

from . import OBSERVER, PLUGIN

# Commands the master received, by command id, while tracing was on: check_command has no node
# argument, so this is per process (one master per process outside tests; ids are unique anyway).
_MASTER_RECEIPTS: OrderedDict[str, int] = OrderedDict()
_GENERATION_COMMANDS = ("TextGeneration", "TextEmbedding")


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    from .service import ObserveConfig

    register(PLUGIN, ObserveConfig)


@hookimpl
def configure(node: NodeSurface) -> None:
    from .logs import apply_log_format
    from .service import ObserveConfig, Observer

    apply_log_format()  # $SKULK_LOG_FORMAT=json
    observer = Observer(node, node.plugin_config(PLUGIN) or ObserveConfig())
    observer.logs.install()
    node.services.publish(OBSERVER, observer)


@hookimpl
def wrap_inference(node: NodeSurface) -> Any:
    from .middleware import ObserveMiddleware

    return ObserveMiddleware(node)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_observe_routes

    add_observe_routes(app, node)


@hookimpl
async def startup(node: NodeSurface) -> None:
    observer = node.services.get(OBSERVER)
    if observer is None:
        return
    from .config import apply_effects
    from .metrics import NodeMetrics

    observer.metrics = NodeMetrics(node, observer)
    apply_effects(node, observer)
    observer.janitor = node.spawn(observer.run_janitor(), "observe-janitor")


@hookimpl
async def shutdown(node: NodeSurface) -> None:
    observer = node.services.withdraw(OBSERVER)
    if observer is None:
        return
    observer.logs.uninstall()
    if observer.janitor is not None:
        observer.janitor.cancel()


@hookimpl
def check_command(command: Any, state: Any) -> str | None:
    """Never vetoes: notes when a traced request reached the master."""
    if state.tracing_enabled and type(command).__name__ in _GENERATION_COMMANDS:
        _MASTER_RECEIPTS[command.command_id] = time.time_ns()
        while len(_MASTER_RECEIPTS) > 4096:
            _MASTER_RECEIPTS.popitem(last=False)
    return None


@hookimpl
def on_event_applied(node: NodeSurface, event: Any, before: Any, after: Any) -> None:
    observer = node.services.get(OBSERVER)
    if observer is None:
        return
    observer.events.append(event)
    inner = event.event
    kind = type(inner).__name__
    if kind == "PluginDataSet" and inner.plugin == PLUGIN:
        from .config import apply_effects

        apply_effects(node, observer)
        observer.note("config", f"{inner.key} {'deleted' if inner.value is None else 'set'}", idx=event.idx)
        return
    if kind == "TaskCreated" and inner.task.owner_node_id == node.node_id:
        # the API node learns which instance serves its request (for the envelope), chunks or not
        entry = observer.requests.get(inner.task.command_id)
        if entry is not None:
            entry["instance"] = inner.task.instance_id
            entry["concurrency"] = sum(1 for t in after.tasks.values() if t.instance_id == inner.task.instance_id)
    if not (node.is_master and after.tracing_enabled):
        return
    at_ns = int(event.at.timestamp() * 1e9)
    if kind == "TaskCreated":
        task = inner.task
        received = _MASTER_RECEIPTS.pop(task.command_id, None)
        attrs = {"instance_id": task.instance_id, "event_idx": event.idx}
        if received is not None:
            observer.span(task.command_id, "master.placement_wait", received, at_ns, attributes=attrs)
        observer.span(task.command_id, "master.task_created", at_ns, at_ns, attributes=attrs)
    elif kind == "TaskAcknowledged":
        observer.span(inner.task_id, "master.task_acknowledged", at_ns, at_ns, attributes={"event_idx": event.idx})
    elif kind == "TaskDeleted" and inner.task_id in before.tasks:
        status = before.tasks[inner.task_id].status
        observer.span(
            inner.task_id, "master.task_finished", at_ns, at_ns, attributes={"event_idx": event.idx, "status": status}
        )


@hookimpl
def on_state_synced(node: NodeSurface, before: Any, after: Any) -> None:
    observer = node.services.get(OBSERVER)
    if observer is not None:
        from .config import apply_effects

        apply_effects(node, observer)
        observer.note("state_synced", f"adopted a snapshot at event {after.last_event_applied_idx}")


@hookimpl
def on_master_changed(node: NodeSurface, master_node_id: str | None, is_master: bool) -> None:
    observer = node.services.get(OBSERVER)
    if observer is not None:
        observer.note("master_changed", f"master is now {master_node_id or '(election in progress)'}")
