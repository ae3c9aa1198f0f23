"""decide(): one unit test per command type, with no transport and no event loop, and a property.

The property: from any reachable State, deciding any command and applying the decision's events
keeps State's invariants (every runner belongs to an instance, every open task to a live
instance, no duplicate ids) and never raises.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk_kernel.api import (
    COMMAND_TYPES,
    AddCustomModelCard,
    CancelTask,
    ChatMessage,
    Command,
    CommandId,
    CreateInstance,
    CustomModelCardAdded,
    CustomModelCardDeleted,
    DecisionView,
    DeleteCustomModelCard,
    DeleteInstance,
    EmbeddingParams,
    FailInstance,
    FinishTask,
    ImageGeneration,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstanceFailureRecorded,
    InstanceId,
    MediaParams,
    ModelCard,
    ModelId,
    NodeCapacity,
    NodeId,
    NodeJoined,
    Park,
    PipelineShardMetadata,
    PlaceInstance,
    PlacementError,
    PlacementRequest,
    PluginDataSet,
    RefuseInstancePlacement,
    RerankParams,
    RingInstance,
    RunnerId,
    RunnerReady,
    RunnerStatusUpdated,
    SetPluginData,
    SetTracingEnabled,
    ShardAssignments,
    SpeechParams,
    SpeechSynthesis,
    State,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TextEmbedding,
    TextGeneration,
    TextGenerationParams,
    TextRerank,
    TracingStateChanged,
    Transcription,
    Unpark,
    VideoGeneration,
    apply,
    decide,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)
CARD = ModelCard(model_id=ModelId("m"), n_layers=4, hidden_size=64, storage_size=1000)


class OneNodePlanner:
    """A planner for unit tests: the first live, non-excluded node holds the whole model."""

    name = "one-node"

    def place(
        self, request: PlacementRequest, state: State, nodes: dict[str, NodeCapacity], instance_id: str
    ) -> RingInstance:
        live = sorted(n for n in nodes if n not in request.excluded_nodes)
        if request.min_nodes > 1 or not live:
            raise PlacementError("no_candidate", f"no node for {request.model.model_id} (have {live})")
        return instance("i-" + instance_id[:8], live[0])


def instance(iid: str, node: str, model: str = "m") -> RingInstance:
    shard = PipelineShardMetadata(
        model_id=ModelId(model), device_rank=0, world_size=1, start_layer=0, end_layer=4, n_layers=4, backend="echo-cpu"
    )
    return RingInstance(
        instance_id=InstanceId(iid),
        engine="echo",
        context_limit=4096,
        shard_assignments=ShardAssignments(
            model_id=ModelId(model),
            runner_to_shard={RunnerId(f"{iid}-r0"): shard},
            node_to_runner={NodeId(node): RunnerId(f"{iid}-r0")},
        ),
    )


def view(
    nodes: tuple[str, ...] = ("a", "b"), parked: frozenset[str] = frozenset(), reachable: tuple[str, ...] | None = None
) -> DecisionView:
    caps = {n: NodeCapacity(node_id=n, ram_available=10**10, ram_total=10**10, backends=("echo-cpu",)) for n in nodes}
    return DecisionView(
        master_id="a",
        now=NOW,
        reachable=frozenset(nodes if reachable is None else reachable),
        capacities=caps,
        resolve=lambda ref: CARD if ref == "m" else None,
        planner=OneNodePlanner(),
        parked=parked,
    )


def applied(state: State, *events: object) -> State:
    for event in events:
        state = apply(
            state, IndexedEvent(idx=state.last_event_applied_idx + 1, origin=NodeId("a"), at=NOW, event=event)
        )  # type: ignore[arg-type]
    return state


def serving(iid: str = "i1", node: str = "a") -> State:
    inst = instance(iid, node)
    return applied(
        State(),
        NodeJoined(node_id=NodeId("a")),
        NodeJoined(node_id=NodeId("b")),
        InstanceCreated(instance=inst),
        RunnerStatusUpdated(runner_id=RunnerId(f"{iid}-r0"), status=RunnerReady()),
    )


def generation(cid: str = "c1") -> TextGeneration:
    return TextGeneration(
        command_id=CommandId(cid),
        owner_node_id=NodeId("b"),
        params=TextGenerationParams(model_id=ModelId("m"), messages=(ChatMessage(role="user", content="hi"),)),
    )


def with_task(state: State, cid: str = "c1") -> State:
    return applied(state, *decide(state, generation(cid), view()).events)


# ------------------------------------------------------------------ one test per command type


def test_place_instance_creates_the_planned_instance() -> None:
    decision = decide(
        applied(State(), NodeJoined(node_id=NodeId("a"))),
        PlaceInstance(command_id=CommandId("p1"), model_id=ModelId("m")),
        view(),
    )
    (event,) = decision.events
    assert isinstance(event, InstanceCreated) and event.instance.shard_assignments.model_id == "m"
    # the API node sends a placement again when no master confirmed it: the same id places nothing new
    again = decide(
        applied(State(), NodeJoined(node_id=NodeId("a")), event),
        PlaceInstance(command_id=CommandId("p1"), model_id=ModelId("m")),
        view(),
    )
    assert again.events == ()
    # a request's on-demand load (if_absent) places nothing when the model has an instance already
    placed = applied(State(), NodeJoined(node_id=NodeId("a")), event)
    on_demand = PlaceInstance(command_id=CommandId("p2"), model_id=ModelId("m"), if_absent=True)
    assert decide(placed, on_demand, view()).events == ()
    assert decide(placed, on_demand.model_copy(update={"if_absent": False}), view()).events != ()


def test_place_instance_refusal_is_logged_not_indexed() -> None:
    decision = decide(State(), PlaceInstance(command_id=CommandId("p1"), model_id=ModelId("nope")), view())
    assert decision.events == () and "not in the catalog" in decision.log[0]
    # the sender is told, in the planner's own words (the HTTP client sees them unchanged)
    assert decision.refusal is not None and decision.refusal.kind == "unknown_model"
    assert decision.refusal.reason in decision.log[0] and not decision.refusal.retryable


def test_set_plugin_data_indexes_only_what_changes() -> None:
    first = decide(
        State(), SetPluginData(command_id=CommandId("s1"), plugin="p", entries=(("a", 1), ("b", None))), view()
    )
    assert first.events == (PluginDataSet(plugin="p", key="a", value=1),)  # deleting an absent key is a no-op
    state = applied(State(), *first.events)
    again = decide(state, SetPluginData(command_id=CommandId("s2"), plugin="p", entries=(("a", 1),)), view())
    assert again.events == () and again.refusal is None  # already true: indexed with no event
    gone = decide(state, SetPluginData(command_id=CommandId("s3"), plugin="p", entries=(("a", None),)), view())
    assert gone.events == (PluginDataSet(plugin="p", key="a", value=None),)


def test_a_request_sent_again_creates_no_second_task() -> None:
    state = serving()
    created = decide(state, generation("g1"), view())
    assert len(created.events) == 1
    assert decide(applied(state, *created.events), generation("g1"), view()).events == ()


def test_create_instance_indexes_it_once() -> None:
    inst = instance("i9", "a")
    assert decide(State(), CreateInstance(command_id=CommandId("c"), instance=inst), view()).events == (
        InstanceCreated(instance=inst),
    )
    again = decide(
        applied(State(), InstanceCreated(instance=inst)),
        CreateInstance(command_id=CommandId("c"), instance=inst),
        view(),
    )
    assert again.events == () and "already exists" in again.log[0]


def test_delete_instance_cancels_its_tasks_and_ends_their_streams_first() -> None:
    state = with_task(serving())
    decision = decide(state, DeleteInstance(command_id=CommandId("d"), instance_id=InstanceId("i1")), view())
    kinds = [type(e) for e in decision.events]
    assert kinds == [TaskStatusUpdated, TaskDeleted, InstanceDeleted]
    (reply,) = decision.replies
    assert reply.owner == "b" and reply.chunk.command_id == "c1" and reply.chunk.code == "instance_gone"
    assert applied(state, *decision.events).instances == {}


def test_fail_instance_records_the_failure_and_replaces_without_the_node() -> None:
    decision = decide(
        serving(),
        FailInstance(
            command_id=CommandId("f"), instance_id=InstanceId("i1"), reason="disk full", replace_excluding=NodeId("a")
        ),
        view(),
    )
    failure = next(e for e in decision.events if isinstance(e, InstanceFailureRecorded))
    assert failure.reason == "disk full"
    created = [e for e in decision.events if isinstance(e, InstanceCreated)]
    assert len(created) == 1 and set(created[0].instance.shard_assignments.node_to_runner) == {"b"}
    # the re-placement's id derives from the command: the same inputs give the same decision
    assert decision == decide(
        serving(),
        FailInstance(
            command_id=CommandId("f"), instance_id=InstanceId("i1"), reason="disk full", replace_excluding=NodeId("a")
        ),
        view(),
    )


def test_a_system_role_is_stamped_on_the_instance_and_kept_by_its_replacement() -> None:
    joined = applied(State(), NodeJoined(node_id=NodeId("a")), NodeJoined(node_id=NodeId("b")))
    placed = decide(
        joined, PlaceInstance(command_id=CommandId("p"), model_id=ModelId("m"), system_role="steward"), view()
    )
    (created,) = placed.events
    assert isinstance(created, InstanceCreated) and created.instance.system_role == "steward"
    state = applied(joined, created)
    failed = decide(
        state,
        FailInstance(command_id=CommandId("f"), instance_id=created.instance.instance_id, reason="r", replace=True),
        view(),
    )
    again = [e for e in failed.events if isinstance(e, InstanceCreated)]
    assert len(again) == 1 and again[0].instance.system_role == "steward"


def test_a_system_instance_serves_only_requests_pinned_to_it() -> None:
    steward = instance("s1", "a").model_copy(update={"system_role": "steward"})
    state = applied(
        State(),
        NodeJoined(node_id=NodeId("a")),
        NodeJoined(node_id=NodeId("b")),
        InstanceCreated(instance=steward),
        RunnerStatusUpdated(runner_id=RunnerId("s1-r0"), status=RunnerReady()),
    )
    refused = decide(state, generation(), view())  # a user's request for the same model
    assert refused.events == () and refused.replies[0].chunk.code == "model_not_placed"
    pinned = decide(state, generation().model_copy(update={"instance_id": InstanceId("s1")}), view())
    assert pinned.events[0].task.instance_id == "s1"  # type: ignore[union-attr]


def test_fail_instance_of_an_unknown_instance_does_nothing() -> None:
    decision = decide(State(), FailInstance(command_id=CommandId("f"), instance_id=InstanceId("x"), reason="r"), view())
    assert decision.events == () and decision.replies == ()


def test_refused_placement_tries_wider_then_without_the_refusing_node() -> None:
    decision = decide(
        serving(),
        RefuseInstancePlacement(
            command_id=CommandId("r"), instance_id=InstanceId("i1"), node_id=NodeId("a"), reason="no memory"
        ),
        view(),
    )
    created = [e for e in decision.events if isinstance(e, InstanceCreated)]
    assert len(created) == 1 and set(created[0].instance.shard_assignments.node_to_runner) == {"b"}
    assert any("refused the placement: no memory" in getattr(e, "reason", "") for e in decision.events)


def test_text_generation_goes_to_the_least_loaded_ready_instance() -> None:
    state = applied(
        serving("i1", "a"),
        InstanceCreated(instance=instance("i2", "b")),
        RunnerStatusUpdated(runner_id=RunnerId("i2-r0"), status=RunnerReady()),
    )
    state = with_task(state, "c1")
    (event,) = decide(state, generation("c2"), view()).events
    assert isinstance(event, TaskCreated)
    assert event.task.instance_id != state.tasks[next(iter(state.tasks))].instance_id


def test_text_generation_pinned_by_the_api_node_goes_there_while_it_is_ready_and_reachable() -> None:
    state = applied(
        serving("i1", "a"),
        InstanceCreated(instance=instance("i2", "b")),
        RunnerStatusUpdated(runner_id=RunnerId("i2-r0"), status=RunnerReady()),
    )
    state = with_task(with_task(state, "c1"), "c2")  # one task on each: the tie goes to i1 unpinned
    busy = next(t.instance_id for t in state.tasks.values() if t.command_id == "c1")
    pinned = generation("c3").model_copy(update={"instance_id": InstanceId(busy)})
    (event,) = decide(state, pinned, view()).events
    assert isinstance(event, TaskCreated) and event.task.instance_id == busy
    gone_node = "a" if busy == "i1" else "b"
    (event,) = decide(state, pinned, view(reachable=("b" if gone_node == "a" else "a",))).events
    assert isinstance(event, TaskCreated) and event.task.instance_id != busy  # never to a departed node


def test_text_generation_without_an_instance_is_refused_and_while_loading_is_parked() -> None:
    refused = decide(State(), generation(), view())
    assert refused.replies[0].chunk.code == "model_not_placed"
    loading = applied(State(), InstanceCreated(instance=instance("i1", "a")))
    assert decide(loading, generation(), view()).effects == (Park(generation()),)
    assert decide(loading, generation(), view(parked=frozenset({"c1"}))).effects == ()


def test_speech_commands_create_their_task_kind_or_are_refused() -> None:
    fields = {
        "command_id": CommandId("s1"),
        "owner_node_id": NodeId("b"),
        "params": SpeechParams(model_id=ModelId("m")),
    }
    for command in (SpeechSynthesis(**fields), Transcription(**fields)):  # type: ignore[arg-type]
        decision = decide(serving(), command, view())
        assert type(decision.events[0].task).__name__ == f"{type(command).__name__}Task"  # type: ignore[union-attr]
        assert decide(State(), command, view()).replies[0].chunk.code == "model_not_placed"


def test_media_commands_create_their_task_kind_or_are_refused() -> None:
    fields = {
        "command_id": CommandId("v1"),
        "owner_node_id": NodeId("b"),
        "params": MediaParams(model_id=ModelId("m"), prompt="a fox", seconds=2),
    }
    for command in (ImageGeneration(**fields), VideoGeneration(**fields)):  # type: ignore[arg-type]
        decision = decide(serving(), command, view())
        assert type(decision.events[0].task).__name__ == f"{type(command).__name__}Task"  # type: ignore[union-attr]
        assert decision.events[0].task.params.prompt == "a fox"  # type: ignore[union-attr]
        assert decide(State(), command, view()).replies[0].chunk.code == "model_not_placed"


def test_text_generation_on_a_departed_node_fails_fast() -> None:
    decision = decide(serving("i1", "b"), generation(), view(reachable=("a",)))
    assert decision.events == () and decision.replies[0].chunk.code == "instance_gone"


def test_text_embedding_creates_an_embedding_task_and_unparks() -> None:
    command = TextEmbedding(
        command_id=CommandId("e1"),
        owner_node_id=NodeId("b"),
        params=EmbeddingParams(model_id=ModelId("m"), inputs=("x",)),
    )
    decision = decide(serving(), command, view(parked=frozenset({"e1"})))
    assert type(decision.events[0].task).__name__ == "TextEmbeddingTask"  # type: ignore[union-attr]
    assert decision.effects == (Unpark("e1"),)


def test_text_rerank_creates_a_rerank_task() -> None:
    command = TextRerank(
        command_id=CommandId("r1"),
        owner_node_id=NodeId("b"),
        params=RerankParams(model_id=ModelId("m"), query="q", documents=("x", "y")),
    )
    decision = decide(serving(), command, view())
    assert type(decision.events[0].task).__name__ == "TextRerankTask"  # type: ignore[union-attr]


def test_cancel_task_cancels_an_open_task_or_unparks_a_waiting_one() -> None:
    state = with_task(serving())
    decision = decide(state, CancelTask(command_id=CommandId("x"), task_command_id=CommandId("c1")), view())
    assert decision.events == (TaskStatusUpdated(task_id="c1", status="Cancelled"),)  # type: ignore[arg-type]
    parked = decide(
        State(), CancelTask(command_id=CommandId("x"), task_command_id=CommandId("w")), view(parked=frozenset({"w"}))
    )
    assert parked.effects == (Unpark("w"),) and parked.events == ()
    ended = applied(state, *decision.events)
    assert decide(ended, CancelTask(command_id=CommandId("y"), task_command_id=CommandId("c1")), view()).events == ()


def test_finish_task_deletes_it_once() -> None:
    state = with_task(serving())
    decision = decide(state, FinishTask(command_id=CommandId("x"), task_command_id=CommandId("c1")), view())
    assert decision.events == (TaskDeleted(task_id="c1"),)  # type: ignore[arg-type]
    gone = applied(state, *decision.events)
    assert decide(gone, FinishTask(command_id=CommandId("x"), task_command_id=CommandId("c1")), view()).events == ()


def test_custom_cards_are_added_and_deleted() -> None:
    added = decide(State(), AddCustomModelCard(command_id=CommandId("x"), card=CARD), view())
    assert added.events == (CustomModelCardAdded(card=CARD),)
    state = applied(State(), *added.events)
    deleted = decide(state, DeleteCustomModelCard(command_id=CommandId("y"), model_id=ModelId("m")), view())
    assert deleted.events == (CustomModelCardDeleted(model_id=ModelId("m")),)
    assert decide(State(), DeleteCustomModelCard(command_id=CommandId("y"), model_id=ModelId("m")), view()).events == ()


def test_set_tracing_is_recorded_every_time_it_is_set() -> None:
    on = decide(State(), SetTracingEnabled(command_id=CommandId("x"), enabled=True), view())
    assert on.events == (TracingStateChanged(enabled=True),)
    again = decide(applied(State(), *on.events), SetTracingEnabled(command_id=CommandId("y"), enabled=True), view())
    assert again.events == (TracingStateChanged(enabled=True),)  # each PUT /v1/tracing is a fact in the log


def test_every_command_type_has_a_rule_and_a_test_here() -> None:
    source = open(__file__).read()
    for command_type in COMMAND_TYPES:
        assert f"{command_type.__name__}(" in source, f"no unit test decides a {command_type.__name__}"


def test_a_command_without_a_rule_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="no rule"):
        decide(State(), object(), view())  # type: ignore[arg-type]


# ------------------------------------------------------------------ the property

IDS = st.sampled_from(["c1", "c2", "c3"])
INSTANCE_IDS = st.sampled_from(["i1", "i2", "i-p1", "i-p2"])
NODES = st.sampled_from(["a", "b"])


def commands() -> st.SearchStrategy[Command]:
    return st.one_of(
        st.builds(
            lambda c: PlaceInstance(command_id=CommandId(c), model_id=ModelId("m")), st.sampled_from(["p1", "p2"])
        ),
        st.builds(lambda i, n: CreateInstance(command_id=CommandId("k"), instance=instance(i, n)), INSTANCE_IDS, NODES),
        st.builds(lambda i: DeleteInstance(command_id=CommandId("d"), instance_id=InstanceId(i)), INSTANCE_IDS),
        st.builds(
            lambda i, n: FailInstance(
                command_id=CommandId("f" + i), instance_id=InstanceId(i), reason="r", replace_excluding=NodeId(n)
            ),
            INSTANCE_IDS,
            NODES,
        ),
        st.builds(
            lambda i, n: RefuseInstancePlacement(
                command_id=CommandId("r" + i), instance_id=InstanceId(i), node_id=NodeId(n), reason="r"
            ),
            INSTANCE_IDS,
            NODES,
        ),
        st.builds(generation, IDS),
        st.builds(lambda c: CancelTask(command_id=CommandId("x"), task_command_id=CommandId(c)), IDS),
        st.builds(lambda c: FinishTask(command_id=CommandId("x"), task_command_id=CommandId(c)), IDS),
        st.builds(lambda e: SetTracingEnabled(command_id=CommandId("t"), enabled=e), st.booleans()),
    )


def ready_all(state: State) -> State:
    """Workers report every new runner Ready (so generations find instances)."""
    pending = [
        rid
        for inst in state.instances.values()
        for rid in inst.shard_assignments.runner_to_shard
        if rid not in state.runners
    ]
    return applied(state, *(RunnerStatusUpdated(runner_id=r, status=RunnerReady()) for r in pending))


def check_invariants(state: State) -> None:
    runners_of = {rid for inst in state.instances.values() for rid in inst.shard_assignments.runner_to_shard}
    assert set(state.runners) <= runners_of, "a runner outlived its instance"
    for task in state.tasks.values():
        assert task.instance_id in state.instances or task.status in ("Complete", "Failed", "Cancelled"), (
            f"open task {task.task_id} on a deleted instance"
        )
    assert len(set(state.topology.nodes)) == len(state.topology.nodes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands(), max_size=25), st.booleans())
def test_decide_then_apply_keeps_states_invariants(sequence: list[Command], readiness: bool) -> None:
    state = applied(State(), NodeJoined(node_id=NodeId("a")), NodeJoined(node_id=NodeId("b")))
    parked: set[str] = set()
    for command in sequence:
        decision = decide(state, command, view(parked=frozenset(parked)))
        state = applied(state, *decision.events)
        for effect in decision.effects:
            if isinstance(effect, Park):
                parked.add(effect.command.command_id)
            elif isinstance(effect, Unpark):
                parked.discard(effect.command_id)
        for reply in decision.replies:
            assert reply.chunk.command_id and reply.owner
        if readiness:
            state = ready_all(state)
        check_invariants(state)
