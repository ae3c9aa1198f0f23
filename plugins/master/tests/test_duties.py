"""The master's duties besides commands, decided as data: no transport, no event loop."""

from __future__ import annotations

from datetime import UTC, datetime

from skulk_kernel.api import (
    ChatMessage,
    CommandId,
    DecisionView,
    ForgetNode,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstanceId,
    ModelCard,
    ModelId,
    NodeCapacity,
    NodeId,
    NodeJoined,
    NodeTimedOut,
    PipelineShardMetadata,
    RingInstance,
    RunnerFailed,
    RunnerId,
    RunnerReady,
    RunnerStatusUpdated,
    ShardAssignments,
    State,
    TaskDeleted,
    TaskFailed,
    TaskStatusUpdated,
    TextGeneration,
    TextGenerationParams,
    TracingStateChanged,
    apply,
    decide,
)
from skulk_master.duties import decide_prune, decide_report, decide_session_start
from skulk_master.planner import MemoryPlanner

NOW = datetime(2026, 12, 1, tzinfo=UTC)
CARD = ModelCard(
    model_id=ModelId("m"), n_layers=4, hidden_size=64, storage_size=1000, compatible_backends=("echo-cpu",)
)


def view(nodes: tuple[str, ...] = ("a", "b")) -> DecisionView:
    caps = {
        n: NodeCapacity(node_id=n, ram_available=8 * 2**30, ram_total=8 * 2**30, backends=("echo-cpu",)) for n in nodes
    }
    return DecisionView(
        master_id="a",
        now=NOW,
        reachable=frozenset(nodes),
        capacities=caps,
        resolve=lambda ref: CARD if ref == "m" else None,
        planner=MemoryPlanner(),
    )


def applied(state: State, *events: object) -> State:
    for event in events:
        state = apply(
            state, IndexedEvent(idx=state.last_event_applied_idx + 1, origin=NodeId("a"), at=NOW, event=event)
        )  # type: ignore[arg-type]
    return state


def instance_on(node: str, iid: str = "i1") -> RingInstance:
    shard = PipelineShardMetadata(
        model_id=ModelId("m"), device_rank=0, world_size=1, start_layer=0, end_layer=4, n_layers=4, backend="echo-cpu"
    )
    return RingInstance(
        instance_id=InstanceId(iid),
        engine="echo",
        context_limit=4096,
        shard_assignments=ShardAssignments(
            model_id=ModelId("m"),
            runner_to_shard={RunnerId(f"{iid}-r0"): shard},
            node_to_runner={NodeId(node): RunnerId(f"{iid}-r0")},
        ),
    )


def busy_on(node: str) -> State:
    state = applied(
        State(),
        NodeJoined(node_id=NodeId("a")),
        NodeJoined(node_id=NodeId("b")),
        InstanceCreated(instance=instance_on(node)),
        RunnerStatusUpdated(runner_id=RunnerId("i1-r0"), status=RunnerReady()),
    )
    command = TextGeneration(
        command_id=CommandId("c1"),
        owner_node_id=NodeId("a"),
        params=TextGenerationParams(model_id=ModelId("m"), messages=(ChatMessage(role="user", content="hi"),)),
    )
    return applied(state, *decide(state, command, view()).events)


def test_a_report_that_is_not_a_workers_to_make_is_refused() -> None:
    decision = decide_report(State(), "b", TracingStateChanged(enabled=True), view())
    assert decision.events == () and "refusing TracingStateChanged" in decision.log[0]


def test_a_terminal_task_status_is_followed_by_its_deletion() -> None:
    state = busy_on("b")
    decision = decide_report(state, "b", TaskStatusUpdated(task_id="c1", status="Complete"), view())  # type: ignore[arg-type]
    assert [type(e) for e in decision.events] == [TaskStatusUpdated, TaskDeleted]


def test_a_report_about_a_task_that_ended_is_dropped() -> None:
    assert decide_report(State(), "b", TaskFailed(task_id="gone", error_message="x"), view()).events == ()  # type: ignore[arg-type]


def test_a_failed_runner_fails_its_instances_open_tasks_and_ends_their_streams() -> None:
    state = busy_on("b")
    decision = decide_report(
        state, "b", RunnerStatusUpdated(runner_id=RunnerId("i1-r0"), status=RunnerFailed(error_message="boom")), view()
    )
    assert [type(e) for e in decision.events] == [RunnerStatusUpdated, TaskFailed, TaskDeleted]
    assert decision.replies[0].owner == "a" and "boom" in decision.replies[0].chunk.message


def test_a_silent_node_is_pruned_its_work_failed_and_its_instance_replaced_elsewhere() -> None:
    state = busy_on("b")
    decision = decide_prune(state, "b", 31.0, view())
    kinds = [type(e).__name__ for e in decision.events]
    # the replacement first: an API node never sees the model without any instance
    assert kinds == [
        "InstanceCreated",
        "TaskFailed",
        "TaskDeleted",
        "InstanceFailureRecorded",
        "InstanceDeleted",
        "NodeTimedOut",
    ]
    created = [e for e in decision.events if isinstance(e, InstanceCreated)]
    assert len(created) == 1 and set(created[0].instance.shard_assignments.node_to_runner) == {"a"}
    assert ForgetNode("b") in decision.effects
    assert decision.replies[0].chunk.code == "instance_gone"
    after = applied(state, *decision.events)
    assert "b" not in after.topology.nodes and InstanceId("i1") not in after.instances


def test_a_departed_node_is_pruned_early_with_its_own_reason_and_threshold() -> None:
    state = busy_on("b")
    decision = decide_prune(state, "b", 3.4, view(), departed_after_s=3.0)
    gone = next(e for e in decision.events if isinstance(e, NodeTimedOut))
    assert gone.timeout_s == 3.0 and gone.heartbeat_age_s == 3.4
    assert "left the cluster" in decision.replies[0].chunk.message
    assert "session closed" in decision.log[0]
    assert len([e for e in decision.events if isinstance(e, InstanceCreated)]) == 1


def test_a_new_session_ends_the_previous_sessions_tasks_and_joins_the_master() -> None:
    decision = decide_session_start(busy_on("b"), view())
    assert [type(e) for e in decision.events] == [TaskFailed, TaskDeleted, NodeJoined]
    assert all(not isinstance(e, InstanceDeleted) for e in decision.events)  # instances survive failover


def test_a_heartbeat_keeps_a_nodes_unchanged_readings_fresh_and_the_filter_sends_only_changes() -> None:
    import time

    from skulk_kernel.readings import ReadingStore, SendFilter
    from skulk_kernel.telemetry import Memory, NodeHeartbeat, NodeMemory

    store, sent = ReadingStore(), SendFilter()
    memory = NodeMemory(node_id="b", ram_total=Memory(in_bytes=8 << 30), ram_available=Memory(in_bytes=4 << 30))
    store.put("b", memory)
    old = store.get(NodeMemory, "b")
    time.sleep(0.01)
    store.put("b", NodeHeartbeat(node_id="b"))
    fresh = store.get(NodeMemory, "b")
    assert old is not None and fresh is not None and fresh.at_monotonic > old.at_monotonic
    assert fresh.reading is memory and store.nodes() == {"b"}
    store.forget("b")
    assert store.last_heard("b") is None and store.nodes() == set()
    # memory moves a little every round: sent once, then again only past a 64 MiB step
    assert sent.due(memory) and not sent.due(memory)
    nudged = memory.model_copy(update={"ram_available": Memory(in_bytes=(4 << 30) + (1 << 20))})
    moved = memory.model_copy(update={"ram_available": Memory(in_bytes=(4 << 30) + (200 << 20))})
    assert not sent.due(nudged) and sent.due(moved)
    assert sent.due(NodeHeartbeat(node_id="b")) and sent.due(NodeHeartbeat(node_id="b"))
    sent.reset()
    assert sent.due(moved)


def test_the_reading_store_has_a_ceiling_and_evicts_the_node_heard_from_longest_ago() -> None:
    from skulk_kernel.readings import ReadingStore
    from skulk_kernel.telemetry import NodeHeartbeat

    store = ReadingStore()
    store.MAX_NODES = 3
    for name in ("a", "b", "c"):
        store.put(name, NodeHeartbeat(node_id=name))
    store.put("a", NodeHeartbeat(node_id="a"))  # heard again: "b" is now the stalest
    store.put("d", NodeHeartbeat(node_id="d"))
    assert store.nodes() == {"a", "c", "d"}


def test_a_missing_edge_already_in_state_is_not_indexed_again() -> None:
    from skulk_kernel.api import Connection, TopologyEdgeCreated, TopologyEdgeDeleted

    edge = Connection(source="b", sink="a", kind="zenoh")  # type: ignore[arg-type]
    first = decide_report(State(), "b", TopologyEdgeDeleted(edge=edge), view())  # b lost its session to a
    assert len(first.events) == 1
    state = applied(State(), *first.events)
    assert state.topology.missing == (edge,)
    assert decide_report(state, "b", TopologyEdgeDeleted(edge=edge), view()).events == ()  # a re-send
    assert len(decide_report(state, "b", TopologyEdgeCreated(edge=edge), view()).events) == 1  # it is back
    assert decide_report(State(), "b", TopologyEdgeCreated(edge=edge), view()).events == ()  # never missing
