"""decide(state, command, view) -> Decision: what the master does about a command, as data.

The other pure function beside apply(): no transport, no clock, no randomness, no hooks. What the
master knows besides State (capacities, the catalog, the planner, parked requests, the time) comes
in a `DecisionView`; what to do comes back as a `Decision` (events to index, error chunks for API
nodes, effects on the master's bookkeeping), so every decision is unit-tested without a network.
Ids the master mints derive from the command's id: the same inputs give the same decision. The
master plugin's other duties (reports, prunes, a session's start) reuse the helpers here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import singledispatch

from . import commands as cmd
from . import events as ev
from .apply import apply
from .contracts import NodeCapacity, PlacementError, PlacementRequest, Planner
from .ids import CommandId, InstanceId, NodeId, TaskId
from .instances import Instance, instance_ready
from .models import ModelCard
from .state import State
from .tasks import TERMINAL_TASK_STATUSES, ErrorChunk, tasks_by_name


@dataclass(frozen=True)
class DecisionView:
    """Everything decide() may read besides State, gathered by the master before it decides."""

    master_id: str
    now: datetime
    reachable: frozenset[str] = frozenset()  # nodes with a live control session (master included)
    capacities: Mapping[str, NodeCapacity] = field(default_factory=dict)  # fresh telemetry only
    resolve: Callable[[str], ModelCard | None] = lambda _ref: None  # the catalog's resolve_model
    planner: Planner | None = None
    parked: frozenset[str] = frozenset()  # command ids of requests waiting for an instance
    node_timeout_s: float = 30.0


@dataclass(frozen=True)
class Reply:
    """A chunk for the API node that owns a request (an error that ends its stream)."""

    owner: str
    chunk: ErrorChunk


@dataclass(frozen=True)
class Park:
    """Keep a request until an instance of its model is ready (the master retries each second)."""

    command: cmd.Request


@dataclass(frozen=True)
class Unpark:
    command_id: str


@dataclass(frozen=True)
class Retry:
    """A re-placement that found no capacity: the master tries it again until capacity allows."""

    command: cmd.PlaceInstance


@dataclass(frozen=True)
class ForgetNode:
    """Drop a pruned node's telemetry so it is no longer a placement candidate."""

    node_id: str


Effect = Park | Unpark | Retry | ForgetNode


@dataclass(frozen=True)
class Refusal:
    """Why the master will not carry a command out: told to its sender as a `refused` outcome.

    `reason` is for a user (an HTTP client sees it unchanged), `kind` for code (it picks the HTTP
    status), `retryable` when the cluster is still learning about itself (telemetry not in yet).
    """

    kind: str
    reason: str
    retryable: bool = False


@dataclass(frozen=True)
class Decision:
    events: tuple[ev.Event, ...] = ()
    replies: tuple[Reply, ...] = ()
    effects: tuple[Effect, ...] = ()
    log: tuple[str, ...] = ()  # what the master should say in its log (refusals, re-placements)
    refusal: Refusal | None = None  # set: the command is refused (no events), its sender is told why

    def __add__(self, other: Decision) -> Decision:
        return Decision(
            self.events + other.events,
            self.replies + other.replies,
            self.effects + other.effects,
            self.log + other.log,
            self.refusal or other.refusal,
        )


NOTHING = Decision()


def reply(owner: str, command_id: str, code: str, message: str, error_type: str = "server_error") -> Reply:
    """An error chunk that ends the stream of `command_id` on its API node."""
    chunk = ErrorChunk(command_id=CommandId(command_id), seq=0, code=code, message=message, error_type=error_type)
    return Reply(owner, chunk)


def decide(state: State, command: cmd.Command, view: DecisionView) -> Decision:
    """The master's decision about one command, validated against everything already indexed."""
    return _decide(command, state, view)


@singledispatch
def _decide(command: object, state: State, view: DecisionView) -> Decision:
    raise TypeError(f"decide() has no rule for {type(command).__name__}")


# ------------------------------------------------------------------ helpers


def state_after(state: State, events: tuple[ev.Event, ...], view: DecisionView) -> State:
    """State as it will be once `events` are indexed (to plan a re-placement against it)."""
    for event in events:
        state = apply(
            state,
            ev.IndexedEvent(
                idx=state.last_event_applied_idx + 1, origin=NodeId(view.master_id), at=view.now, event=event
            ),
        )
    return state


def derived_id(seed: str, purpose: str) -> str:
    """A deterministic id for something the master creates while deciding about `seed`."""
    return hashlib.sha256(f"{seed}/{purpose}".encode()).hexdigest()[:32]


def place(state: State, command: cmd.PlaceInstance, view: DecisionView) -> Instance:
    """An Instance for `command` on the live members, or a PlacementError that says why not."""
    if view.planner is None:
        raise PlacementError("no_planner", "no placement planner is loaded (the master plugin provides one)")
    card = view.resolve(command.model_id)
    if card is None:
        raise PlacementError(
            "unknown_model",
            f"model {command.model_id!r} is not in the catalog; add it with POST /models/add or check GET /models",
        )
    members = set(state.topology.nodes)
    live = {k: v for k, v in view.capacities.items() if not members or k in members}
    c = command  # (PlacementRequest's fields, in order)
    request = PlacementRequest(card, c.sharding, c.min_nodes, c.excluded_nodes, c.context_tokens, c.kv_cache_type)
    instance = view.planner.place(request, state, live, command.command_id)
    return instance.model_copy(update={"system_role": command.system_role}) if command.system_role else instance


def teardown(state: State, instance_id: str, reason: str, *, failed: bool, view: DecisionView) -> Decision:
    """End an instance: its open tasks first (so their streams end at once), then the instance."""
    inst = state.instances.get(InstanceId(instance_id))
    if inst is None:
        return NOTHING
    events: list[ev.Event] = []
    replies: list[Reply] = []
    for task in state.tasks.values():
        if task.instance_id != instance_id or task.status in TERMINAL_TASK_STATUSES:
            continue
        events += [
            ev.TaskFailed(task_id=task.task_id, error_message=reason)
            if failed
            else ev.TaskStatusUpdated(task_id=task.task_id, status="Cancelled"),
            ev.TaskDeleted(task_id=task.task_id),
        ]
        message = reason if failed else "the instance was deleted"
        replies.append(reply(task.owner_node_id, task.command_id, "instance_gone", message))
    if failed:
        events.append(
            ev.InstanceFailureRecorded(
                instance_id=inst.instance_id, model_id=inst.shard_assignments.model_id, reason=reason, at=view.now
            )
        )
    events.append(ev.InstanceDeleted(instance_id=inst.instance_id, reason=reason))
    return Decision(events=tuple(events), replies=tuple(replies))


def replacement(lost: Instance, seed: str, *, min_nodes: int, excluded: tuple[NodeId, ...]) -> cmd.PlaceInstance:
    """The PlaceInstance that places a lost instance's model again (its id derives from `seed`)."""
    command_id = CommandId(derived_id(seed, f"replace/{min_nodes}/{len(excluded)}"))
    model_id = lost.shard_assignments.model_id
    return cmd.PlaceInstance(
        command_id=command_id,
        model_id=model_id,
        min_nodes=min_nodes,
        excluded_nodes=excluded,
        system_role=lost.system_role,
        context_tokens=lost.context_limit,
        kv_cache_type=lost.kv_cache_type,
    )


def replace_lost(state: State, attempts: list[cmd.PlaceInstance], view: DecisionView) -> Decision:
    """The first of `attempts` that places; else a Retry of the first, until capacity allows."""
    last = ""
    for attempt in attempts:
        try:
            instance = place(state, attempt, view)
        except PlacementError as exc:
            last = exc.message
            continue
        log = f"re-placing {attempt.model_id} as {instance.instance_id}"
        return Decision(events=(ev.InstanceCreated(instance=instance),), log=(log,))
    return Decision(
        log=(f"cannot re-place {attempts[0].model_id} yet (retrying): {last}",), effects=(Retry(attempts[0]),)
    )


def _end_and_replace(
    state: State, inst: Instance, reason: str, attempts: list[cmd.PlaceInstance], view: DecisionView
) -> Decision:
    ended = teardown(state, inst.instance_id, reason, failed=True, view=view)
    return ended + replace_lost(state_after(state, ended.events, view), attempts, view)


def _error(command: cmd.Request, code: str, message: str) -> Decision:
    return Decision(replies=(reply(command.owner_node_id, command.command_id, code, message),))


def pick_instance(state: State, model_id: str, view: DecisionView, pinned: str | None = None) -> Instance | None:
    """The ready instance of `model_id` with the fewest open tasks, on reachable nodes only.

    An instance whose node the transport has seen leave is skipped at once, without waiting for the
    prune: a request sent there would only fail later. A `pinned` instance (the API node routed the
    request: load, prompt-cache affinity, a resume elsewhere) is taken when it is ready and reachable.
    """
    ready = [
        i
        for i in state.instances.values()
        if i.shard_assignments.model_id == model_id
        and instance_ready(i, state.runners)
        and set(i.shard_assignments.node_to_runner) <= view.reachable
    ]
    if not ready:
        return None
    if pinned is not None and (chosen := next((i for i in ready if i.instance_id == pinned), None)):
        return chosen
    ready = [i for i in ready if i.system_role is None]  # a cluster service's instance serves only when pinned
    if not ready:
        return None
    load = {i.instance_id: 0 for i in ready}
    for task in state.tasks.values():
        if task.instance_id in load and task.status not in TERMINAL_TASK_STATUSES:
            load[task.instance_id] += 1
    return min(ready, key=lambda i: (load[i.instance_id], i.instance_id))


def dispatch(state: State, command: cmd.Request, view: DecisionView) -> Decision:
    """Create the task on the least-loaded ready instance, refuse it, or park it until one is ready."""
    if TaskId(command.command_id) in state.tasks:  # sent again (the task id is the command id): done already
        return NOTHING
    model_id = command.params.model_id
    instance = pick_instance(state, model_id, view, command.instance_id)
    if instance is None:
        placed = [
            i
            for i in state.instances.values()
            if i.shard_assignments.model_id == model_id
            and (i.system_role is None or i.instance_id == command.instance_id)
        ]
        if not placed:
            return _error(
                command,
                "model_not_placed",
                f"model {model_id!r} has no running instance; place one with POST /place_instance",
            )
        if all(not set(i.shard_assignments.node_to_runner) <= view.reachable for i in placed):
            # a parked request gets this answer once: unparked, it is not refused again every pass
            unpark = (Unpark(command.command_id),) if command.command_id in view.parked else ()
            gone = _error(
                command,
                "instance_gone",
                f"every instance of {model_id!r} is on a node that left the cluster; it is re-placed "
                "as soon as the node's heartbeats stop (a few seconds): retry shortly",
            )
            return Decision(replies=gone.replies, effects=unpark)
        return NOTHING if command.command_id in view.parked else Decision(effects=(Park(command),))
    common = {
        "task_id": TaskId(command.command_id),
        "command_id": command.command_id,
        "instance_id": instance.instance_id,
        "owner_node_id": command.owner_node_id,
    }
    task = tasks_by_name[f"{type(command).__name__}Task"](**common, params=command.params)
    unpark = (Unpark(command.command_id),) if command.command_id in view.parked else ()
    return Decision(events=(ev.TaskCreated(task=task),), effects=unpark)


# ------------------------------------------------------------------ one rule per command


@_decide.register
def _(command: cmd.PlaceInstance, state: State, view: DecisionView) -> Decision:
    if command.if_absent and any(i.shard_assignments.model_id == command.model_id for i in state.instances.values()):
        return NOTHING
    try:
        instance = place(state, command, view)
    except PlacementError as exc:
        return Decision(
            log=(f"placement of {command.model_id} failed: {exc.message}",),
            refusal=Refusal(exc.kind, exc.message, exc.retryable),
        )
    if instance.instance_id in state.instances:  # sent again (the id derives from the command): placed already
        return NOTHING
    return Decision(events=(ev.InstanceCreated(instance=instance),))


@_decide.register
def _(command: cmd.CreateInstance, state: State, view: DecisionView) -> Decision:
    if command.instance.instance_id in state.instances:
        return Decision(log=(f"instance {command.instance.instance_id} already exists",))
    return Decision(events=(ev.InstanceCreated(instance=command.instance),))


@_decide.register
def _(command: cmd.DeleteInstance, state: State, view: DecisionView) -> Decision:
    return teardown(state, command.instance_id, "deleted by request", failed=False, view=view)


@_decide.register
def _(command: cmd.FailInstance, state: State, view: DecisionView) -> Decision:
    inst = state.instances.get(command.instance_id)
    if inst is None:
        return NOTHING
    if command.replace_excluding is None and not command.replace:
        return teardown(state, inst.instance_id, command.reason, failed=True, view=view)
    culprit = () if command.replace_excluding is None else (command.replace_excluding,)
    width = len(inst.shard_assignments.node_to_runner)
    again = replacement(inst, command.command_id, min_nodes=width, excluded=(*inst.excluded_nodes, *culprit))
    return _end_and_replace(state, inst, command.reason, [again], view)


@_decide.register
def _(command: cmd.RefuseInstancePlacement, state: State, view: DecisionView) -> Decision:
    """A node cannot hold its share: try one node wider, else a placement without that node."""
    inst = state.instances.get(command.instance_id)
    if inst is None:
        return NOTHING
    reason = f"node {command.node_id} refused the placement: {command.reason}"
    wider = replacement(
        inst, command.command_id, min_nodes=len(inst.shard_assignments.node_to_runner) + 1, excluded=inst.excluded_nodes
    )
    without = replacement(inst, command.command_id, min_nodes=1, excluded=(*inst.excluded_nodes, command.node_id))
    return _end_and_replace(state, inst, reason, [wider, without], view)


@_decide.register(cmd.TextGeneration)
@_decide.register(cmd.TextEmbedding)
@_decide.register(cmd.TextRerank)
@_decide.register(cmd.SpeechSynthesis)
@_decide.register(cmd.Transcription)
@_decide.register(cmd.ImageGeneration)
@_decide.register(cmd.VideoGeneration)
def _(command: cmd.Request, state: State, view: DecisionView) -> Decision:
    return dispatch(state, command, view)


@_decide.register
def _(command: cmd.CancelTask, state: State, view: DecisionView) -> Decision:
    if command.task_command_id in view.parked:
        return Decision(effects=(Unpark(command.task_command_id),))
    task = state.tasks.get(TaskId(command.task_command_id))
    if task is None or task.status in TERMINAL_TASK_STATUSES:
        return NOTHING
    return Decision(events=(ev.TaskStatusUpdated(task_id=task.task_id, status="Cancelled"),))


@_decide.register
def _(command: cmd.FinishTask, state: State, view: DecisionView) -> Decision:
    task_id = TaskId(command.task_command_id)
    return Decision(events=(ev.TaskDeleted(task_id=task_id),)) if task_id in state.tasks else NOTHING


@_decide.register
def _(command: cmd.AddCustomModelCard, state: State, view: DecisionView) -> Decision:
    if state.custom_model_cards.get(command.card.model_id) == command.card:
        return NOTHING
    return Decision(events=(ev.CustomModelCardAdded(card=command.card),))


@_decide.register
def _(command: cmd.DeleteCustomModelCard, state: State, view: DecisionView) -> Decision:
    if command.model_id not in state.custom_model_cards:
        return NOTHING
    return Decision(events=(ev.CustomModelCardDeleted(model_id=command.model_id),))


@_decide.register
def _(command: cmd.SetTracingEnabled, state: State, view: DecisionView) -> Decision:
    return Decision(events=(ev.TracingStateChanged(enabled=command.enabled),))


@_decide.register
def _(command: cmd.SetPluginData, state: State, view: DecisionView) -> Decision:
    data = state.plugin_data.get(command.plugin, {})
    changed = tuple(
        ev.PluginDataSet(plugin=command.plugin, key=key, value=value)
        for key, value in command.entries
        if (key in data) != (value is not None) or data.get(key) != value
    )
    return Decision(events=changed)
