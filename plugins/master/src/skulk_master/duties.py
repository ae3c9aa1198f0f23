"""The master's duties besides commands, decided as data like the kernel's decide().

A worker's report on LOCAL_EVENTS (`decide_report`), the prune of a node that went silent
(`decide_prune`) and the start of a master session (`decide_session_start`) are pure functions of
State and a DecisionView, so each is unit-tested without a transport or an event loop; the
sequencer only carries the decisions out.
"""

from __future__ import annotations

from dataclasses import replace

from skulk_kernel.api import (
    TERMINAL_TASK_STATUSES,
    Decision,
    DecisionView,
    DownloadCompleted,
    DownloadFailed,
    DownloadPending,
    ErrorChunk,
    Event,
    ForgetNode,
    NodeId,
    NodeJoined,
    NodeTimedOut,
    PluginDataSet,
    Reply,
    RunnerFailed,
    RunnerStatusUpdated,
    State,
    TaskAcknowledged,
    TaskDeleted,
    TaskFailed,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
    replace_lost,
    replacement,
    state_after,
    teardown,
)

# Events a worker may report on LOCAL_EVENTS; anything else is refused before ordering.
REPORTABLE = (
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
    TaskFailed,
    DownloadPending,
    DownloadCompleted,
    DownloadFailed,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
    PluginDataSet,
)


def decide_report(state: State, origin: str, event: Event, view: DecisionView) -> Decision:
    """A worker's report on LOCAL_EVENTS: index it (with what follows from it) or refuse it."""
    if not isinstance(event, REPORTABLE):
        return Decision(log=(f"refusing {type(event).__name__} reported by {origin} on LOCAL_EVENTS",))
    if isinstance(event, TopologyEdgeCreated | TopologyEdgeDeleted):
        # A node re-sends its missing edges every round until State has them: a master behind on
        # them must not index each one again for every round it stayed behind.
        if (event.edge in state.topology.missing) != isinstance(event, TopologyEdgeCreated):
            return Decision()
    follow: tuple[Event, ...] = ()
    if isinstance(event, TaskStatusUpdated | TaskFailed | TaskAcknowledged):
        task = state.tasks.get(event.task_id)
        if task is None:
            return Decision()  # a report about a task that already ended
        status = (
            event.status
            if isinstance(event, TaskStatusUpdated)
            else ("Failed" if isinstance(event, TaskFailed) else None)
        )
        if status in TERMINAL_TASK_STATUSES:
            follow = (TaskDeleted(task_id=event.task_id),)
    decision = Decision(events=(event, *follow))
    if isinstance(event, RunnerStatusUpdated) and isinstance(event.status, RunnerFailed):
        decision += _fail_tasks_of_runner(state, event.runner_id, event.status.error_message)
    return decision


def _fail_tasks_of_runner(state: State, runner_id: str, reason: str) -> Decision:
    instance = next((i for i in state.instances.values() if runner_id in i.shard_assignments.runner_to_shard), None)
    if instance is None:
        return Decision()
    events: list[Event] = []
    replies: list[Reply] = []
    for task in state.tasks.values():
        if task.instance_id == instance.instance_id and task.status not in TERMINAL_TASK_STATUSES:
            events += [
                TaskFailed(task_id=task.task_id, error_message=f"runner failed: {reason}"),
                TaskDeleted(task_id=task.task_id),
            ]
            replies.append(
                Reply(
                    task.owner_node_id,
                    ErrorChunk(
                        command_id=task.command_id, seq=0, code="instance_gone", message=f"runner failed: {reason}"
                    ),
                )
            )
    return Decision(events=tuple(events), replies=tuple(replies))


def decide_prune(
    state: State, node_id: str, heartbeat_age_s: float | None, view: DecisionView, departed_after_s: float | None = None
) -> Decision:
    """A node is gone: fail its work, drop it, re-place what it ran.

    Two ways to be gone: silent past `node_timeout_s` (a frozen node, a network that drops packets
    without closing anything), or `departed_after_s` set: the transport closed its session and its
    heartbeats stopped, which is proof enough within a few heartbeats (a kill -9, a crash, a
    shutdown) instead of half a minute.
    """
    lost = [i for i in state.instances.values() if node_id in i.shard_assignments.node_to_runner]
    silent = "?" if heartbeat_age_s is None else f"{heartbeat_age_s:.1f}"
    why = f"node {node_id} timed out" if departed_after_s is None else f"node {node_id} left the cluster"
    decision = Decision()
    for inst in lost:
        decision += teardown(state, inst.instance_id, why, failed=True, view=view)
    last_event = state.last_seen.get(NodeId(node_id))
    decision += Decision(
        events=(
            NodeTimedOut(
                node_id=NodeId(node_id),
                heartbeat_age_s=heartbeat_age_s,
                timeout_s=view.node_timeout_s if departed_after_s is None else departed_after_s,
                last_event_age_s=(view.now - last_event).total_seconds() if last_event else None,
            ),
        ),
        effects=(ForgetNode(node_id),),
        log=(
            f"pruning node {node_id} ({'silent' if departed_after_s is None else 'session closed, silent'} "
            f"for {silent} s); {len(lost)} instance(s) lost",
        ),
    )
    after = state_after(state, decision.events, view)
    without = replace(view, capacities={k: v for k, v in view.capacities.items() if k != node_id})
    replaced = Decision()
    for inst in lost:
        excluded = (*inst.excluded_nodes, NodeId(node_id))
        width = len(inst.shard_assignments.node_to_runner)
        again = replacement(inst, f"{inst.instance_id}/{node_id}", min_nodes=width, excluded=excluded)
        attempt = replace_lost(after, [again], without)
        after = state_after(after, attempt.events, view)
        replaced += attempt
    # The replacement is indexed before the teardown: an API node never sees the model with no
    # instance at all (a 404 `model_not_placed` for a model that is only moving), it parks the request.
    return Decision(
        events=replaced.events + decision.events,
        replies=decision.replies + replaced.replies,
        effects=decision.effects + replaced.effects,
        log=decision.log + replaced.log,
    )


def decide_session_start(state: State, view: DecisionView) -> Decision:
    """A new master session: requests of the previous one cannot be carried over; end their tasks.

    Their streams were already failed on every API node when the master changed.
    """
    events: list[Event] = []
    for task in state.tasks.values():
        if task.status not in TERMINAL_TASK_STATUSES:
            events.append(TaskFailed(task_id=task.task_id, error_message="the master changed"))
        events.append(TaskDeleted(task_id=task.task_id))
    return Decision(events=(*events, NodeJoined(node_id=NodeId(view.master_id))))
