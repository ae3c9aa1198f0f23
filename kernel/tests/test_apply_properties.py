"""apply() is pure, total and deterministic; every replicated type round-trips (ARCHITECTURE 4.2).

Property tests (hypothesis) over generated events, logs and States, then golden logs: small
hand-written histories with the exact State they must produce.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import pluggy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from skulk_testing.recording import RecordingPlugin
from skulk_testing.strategies import StrategyBuilder, events, indexed_logs, union_members

from skulk_kernel import codec
from skulk_kernel import events as ev
from skulk_kernel.apply import OutOfOrderEvent, _apply_event, apply, replay
from skulk_kernel.events import EVENT_TYPES, Event, IndexedEvent
from skulk_kernel.hooks import GuardedHooks
from skulk_kernel.instances import (
    PipelineShardMetadata,
    RingInstance,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    ShardAssignments,
)
from skulk_kernel.models import ModelCard
from skulk_kernel.plugins import new_plugin_manager, register_plugin
from skulk_kernel.state import (
    MAX_INSTANCE_FAILURES,
    DownloadCompletedStatus,
    DownloadFailedStatus,
    DownloadPendingStatus,
    InstanceFailure,
    State,
    Topology,
)
from skulk_kernel.tasks import ChatMessage, TextGenerationParams, TextGenerationTask

EVENT = TypeAdapter(Event)
POOLED = StrategyBuilder(ids=["a", "b", "c"])  # ids collide, so events hit existing entries
ANY_IDS = StrategyBuilder()
PROPS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def json_round_trip(obj: Any, cls: Any) -> Any:
    text = json.dumps(obj.model_dump(mode="json", by_alias=True))
    return cls.model_validate(json.loads(text))


def states(builder: StrategyBuilder = POOLED) -> st.SearchStrategy[State]:
    """Arbitrary (not necessarily reachable) States, positioned at a valid index."""
    return st.builds(
        lambda s, idx: s.model_copy(update={"last_event_applied_idx": idx}),
        builder.strategy_for(State),
        st.integers(-1, 10_000),
    )


def indexed(state: State, event: Any, origin: str = "node-a", at: datetime = T0) -> IndexedEvent:
    return IndexedEvent(idx=state.last_event_applied_idx + 1, origin=origin, at=at, event=event)


# ============================== coverage of the event union ======================================


def test_event_types_is_the_whole_union() -> None:
    assert union_members(Event) == EVENT_TYPES
    assert len(set(EVENT_TYPES)) == len(EVENT_TYPES)


def test_apply_has_a_rule_for_every_event_type() -> None:
    for event_type in EVENT_TYPES:
        assert _apply_event.dispatch(event_type) is not _apply_event.dispatch(object), event_type


def test_events_strategy_reaches_every_event_type() -> None:
    seen: set[type] = set()

    @settings(max_examples=400, deadline=None, database=None)
    @given(events(POOLED))
    def collect(event: Any) -> None:
        seen.add(type(event))

    collect()
    missing = {t.__name__ for t in EVENT_TYPES} - {t.__name__ for t in seen}
    assert not missing, f"the events() strategy never produced {sorted(missing)}"


# ============================== apply is total ===================================================


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_apply_is_total_over_every_event_type(event_type: type, data: st.DataObject) -> None:
    builder = data.draw(st.sampled_from([POOLED, ANY_IDS]), label="id pool")
    state = data.draw(states(builder), label="state")
    event = data.draw(builder.model(event_type), label="event")
    record = indexed(state, event, origin=data.draw(st.sampled_from(["a", "node-x"])))

    after = apply(state, record)

    assert isinstance(after, State)
    assert after.last_event_applied_idx == record.idx
    assert after.last_seen[record.origin] == record.at
    assert State.model_validate(after.wire()) == after  # apply builds only valid State
    assert apply(state, record) == after  # and the same input gives the same output


@PROPS
@given(indexed_logs())
def test_apply_never_raises_on_a_well_formed_log(log: list[IndexedEvent]) -> None:
    state = replay(log)
    assert state.last_event_applied_idx == len(log) - 1
    assert len(state.instance_failures) <= MAX_INSTANCE_FAILURES


# ============================== determinism ======================================================


@PROPS
@given(indexed_logs())
def test_same_log_same_state_hash(log: list[IndexedEvent]) -> None:
    first = replay(log)
    decoded = [codec.decode(codec.encode(r), IndexedEvent) for r in log]  # as a joiner receives it
    second = replay(decoded)
    assert first.state_hash() == second.state_hash()
    assert first == second


@PROPS
@given(indexed_logs(), st.data())
def test_replay_resumes_from_any_prefix(log: list[IndexedEvent], data: st.DataObject) -> None:
    """A snapshot plus the tail gives the State of the whole log (what snapshots rely on)."""
    cut = data.draw(st.integers(0, len(log)), label="cut")
    snapshot = json_round_trip(replay(log[:cut]), State)
    assert replay(log[cut:], snapshot).state_hash() == replay(log).state_hash()


def test_state_hash_is_equal_across_processes(tmp_path: Path) -> None:
    """Different hash seeds (dict/set iteration) must not change the State a log produces."""
    log = golden_mixed_log()
    path = tmp_path / "log.msgpack"
    path.write_bytes(msgpack.packb([r.wire() for r in log], use_bin_type=True))
    script = (
        "import sys, msgpack\n"
        "from skulk_kernel.apply import replay\n"
        "from skulk_kernel.events import IndexedEvent\n"
        "records = msgpack.unpackb(open(sys.argv[1], 'rb').read(), raw=False)\n"
        "print(replay(IndexedEvent.model_validate(r) for r in records).state_hash())\n"
    )
    hashes = set()
    for seed in ("0", "1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        hashes.add(out.stdout.strip())
    assert hashes == {replay(log).state_hash()}


# ============================== ordering =========================================================


@PROPS
@given(indexed_logs(), st.integers(2, 50))
def test_out_of_order_index_raises(log: list[IndexedEvent], skip: int) -> None:
    state = replay(log)
    template = IndexedEvent(idx=0, origin="a", at=T0, event=ev.NodeJoined(node_id="z"))
    nxt = state.last_event_applied_idx + 1
    for bad in (nxt + skip - 1, state.last_event_applied_idx):  # a gap, and a repeat
        if bad < 0:
            continue
        with pytest.raises(OutOfOrderEvent):
            apply(state, template.model_copy(update={"idx": bad}))
    assert apply(state, template.model_copy(update={"idx": nxt})).last_event_applied_idx == nxt


def test_out_of_order_is_a_value_error_naming_both_indices() -> None:
    state = replay(golden_mixed_log())
    with pytest.raises(ValueError, match=r"event 99 does not follow 1\d"):
        apply(state, IndexedEvent(idx=99, origin="a", at=T0, event=ev.TracingStateChanged(enabled=True)))


# ============================== round trips ======================================================


@PROPS
@given(events(ANY_IDS))
def test_every_event_round_trips_json_and_msgpack(event: Any) -> None:
    cls = type(event)
    assert json_round_trip(event, cls) == event
    assert codec.decode(codec.encode(event), cls) == event
    wire = json.loads(json.dumps(event.wire()))
    assert list(wire) == [cls.__name__]  # a single-key tagged object
    assert EVENT.validate_python(wire) == event  # and the union dispatches on the tag
    assert codec.decode_union(codec.encode(event), EVENT) == event


@PROPS
@given(indexed_logs(builder=ANY_IDS, max_size=3))
def test_indexed_events_round_trip(log: list[IndexedEvent]) -> None:
    for record in log:
        assert json_round_trip(record, IndexedEvent) == record
        assert codec.decode(codec.encode(record), IndexedEvent) == record


@PROPS
@given(states(ANY_IDS))
def test_state_round_trips_json_and_msgpack(state: State) -> None:
    via_json = json_round_trip(state, State)
    via_msgpack = codec.decode(codec.encode(state), State)
    assert via_json == state
    assert via_msgpack == state
    assert via_json.state_hash() == via_msgpack.state_hash() == state.state_hash()


@PROPS
@given(indexed_logs())
def test_replayed_state_round_trips(log: list[IndexedEvent]) -> None:
    state = replay(log)
    assert codec.decode(codec.encode(state), State) == state
    assert json_round_trip(state, State).state_hash() == state.state_hash()


# ============================== no hooks inside apply ============================================


def spy_on_hooks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every pluggy hook call and every guarded call made anywhere in this process."""
    calls: list[str] = []
    caller = pluggy._hooks.HookCaller  # type: ignore[attr-defined]
    for method in ("__call__", "call_historic", "call_extra"):
        original = getattr(caller, method)

        def recording(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(self.name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(caller, method, recording)
    for method in ("call", "acall"):
        original = getattr(GuardedHooks, method)

        def guarded(self: Any, hook_name: str, *args: Any, _original: Any = original, **kw: Any) -> Any:
            calls.append(f"guarded:{hook_name}")
            return _original(self, hook_name, *args, **kw)

        monkeypatch.setattr(GuardedHooks, method, guarded)
    return calls


@pytest.fixture
def hook_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return spy_on_hooks(monkeypatch)


def test_the_hook_spy_sees_real_calls(
    plugin_manager: pluggy.PluginManager, register_plugin: Any, hook_calls: list[str]
) -> None:
    recorder = RecordingPlugin()
    register_plugin(recorder, "recorder")
    plugin_manager.hook.probe_node(facts={})
    GuardedHooks(plugin_manager).call("configure", node=None)
    assert "probe_node" in hook_calls and "guarded:configure" in hook_calls
    assert recorder.names()[-2:] == ["probe_node", "configure"]


@PROPS
@given(indexed_logs())
def test_apply_calls_no_hook(log: list[IndexedEvent]) -> None:
    # hypothesis and function-scoped fixtures do not mix: install the spy per example instead
    with pytest.MonkeyPatch.context() as mp:
        calls = spy_on_hooks(mp)
        pm = new_plugin_manager()
        recorder = RecordingPlugin()
        register_plugin(pm, recorder, "recorder")  # implements every hook, records every call
        calls.clear()
        recorder.clear()
        state = replay(log)
        for record in log[:3]:
            apply(State(last_event_applied_idx=record.idx - 1), record)
        assert calls == [] and recorder.calls == []
        assert state.last_event_applied_idx == len(log) - 1


# ============================== golden logs ======================================================


class Log:
    """Builds IndexedEvents with consecutive indices and a tick per event."""

    def __init__(self, origin: str = "master") -> None:
        self.records: list[IndexedEvent] = []
        self.origin = origin

    def at(self, idx: int) -> datetime:
        return T0 + timedelta(seconds=idx)

    def add(self, *events: Any, origin: str | None = None) -> Log:
        for event in events:
            idx = len(self.records)
            self.records.append(IndexedEvent(idx=idx, origin=origin or self.origin, at=self.at(idx), event=event))
        return self

    def state(self) -> State:
        return replay(self.records)


def shard(rank: int, world: int, start: int, end: int) -> PipelineShardMetadata:
    return PipelineShardMetadata(
        model_id="m",
        device_rank=rank,
        world_size=world,
        start_layer=start,
        end_layer=end,
        n_layers=4,
        backend="echo-cpu",
    )


def instance(iid: str, runners: dict[str, str]) -> RingInstance:
    """runners: runner id -> node id; layers split evenly in order."""
    n = len(runners)
    r2s = {r: shard(i, n, i * 4 // n, (i + 1) * 4 // n) for i, r in enumerate(runners)}
    return RingInstance(
        instance_id=iid,
        engine="echo",
        context_limit=4096,
        shard_assignments=ShardAssignments(
            model_id="m", runner_to_shard=r2s, node_to_runner={node: r for r, node in runners.items()}
        ),
    )


def task(tid: str, iid: str = "i1") -> TextGenerationTask:
    return TextGenerationTask(
        task_id=tid,
        command_id=f"c-{tid}",
        instance_id=iid,
        owner_node_id="n1",
        params=TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),)),
    )


def golden_mixed_log() -> list[IndexedEvent]:
    return (
        Log()
        .add(
            ev.NodeJoined(node_id="n1"),
            ev.NodeJoined(node_id="n2"),
            ev.TopologyEdgeDeleted(edge=ev.Connection(source="n1", sink="n2")),
            ev.InstanceCreated(instance=instance("i1", {"r1": "n1", "r2": "n2"})),
            ev.RunnerStatusUpdated(runner_id="r1", status=RunnerReady()),
            ev.TaskCreated(task=task("t1")),
            ev.TaskAcknowledged(task_id="t1"),
            ev.DownloadPending(node_id="n2", model_id="m"),
            ev.DownloadCompleted(node_id="n2", model_id="m", total_bytes=123),
            ev.PluginDataSet(plugin="steward", key="k", value={"x": [1, 2.5, "y", None]}),
            ev.CustomModelCardAdded(card=ModelCard(model_id="custom/m", n_layers=2, hidden_size=8)),
            ev.TracingStateChanged(enabled=True),
            ev.InstanceFailureRecorded(instance_id="i0", model_id="m", reason="oom", at=T0),
        )
        .records
    )


def test_golden_instances_and_runners() -> None:
    log = Log().add(
        ev.InstanceCreated(instance=instance("i1", {"r1": "n1", "r2": "n2"})),
        ev.InstanceCreated(instance=instance("i2", {"r3": "n1"})),
        ev.RunnerStatusUpdated(runner_id="r1", status=RunnerLoading(layers_loaded=1, total_layers=2)),
        ev.RunnerStatusUpdated(runner_id="r2", status=RunnerReady()),
        ev.RunnerStatusUpdated(runner_id="r3", status=RunnerFailed(error_message="boom")),
        ev.RunnerStatusUpdated(runner_id="r1", status=RunnerReady()),
        ev.RunnerStatusUpdated(runner_id="ghost", status=RunnerReady()),  # owned by no instance
    )
    state = log.state()
    assert set(state.instances) == {"i1", "i2"}
    assert state.runners == {"r1": RunnerReady(), "r2": RunnerReady(), "r3": RunnerFailed(error_message="boom")}

    log.add(
        ev.InstanceDeleted(instance_id="i1", reason="user"),
        ev.RunnerStatusUpdated(runner_id="r2", status=RunnerReady()),  # late: must not resurrect
        ev.InstanceDeleted(instance_id="nope"),  # unknown: no-op
    )
    state = log.state()
    assert set(state.instances) == {"i2"}
    assert state.runners == {"r3": RunnerFailed(error_message="boom")}
    assert state == State(
        instances={"i2": instance("i2", {"r3": "n1"})},
        runners={"r3": RunnerFailed(error_message="boom")},
        last_seen={"master": log.at(9)},
        last_event_applied_idx=9,
    )


def test_golden_task_lifecycle() -> None:
    log = Log().add(ev.TaskCreated(task=task("t1")), ev.TaskCreated(task=task("t2")))
    assert {t: v.status for t, v in log.state().tasks.items()} == {"t1": "Pending", "t2": "Pending"}
    log.add(ev.TaskAcknowledged(task_id="t1"), ev.TaskFailed(task_id="t2", error_message="oom"))
    assert {t: v.status for t, v in log.state().tasks.items()} == {"t1": "Running", "t2": "Failed"}
    log.add(ev.TaskStatusUpdated(task_id="t1", status="Complete"), ev.TaskAcknowledged(task_id="ghost"))
    assert {t: v.status for t, v in log.state().tasks.items()} == {"t1": "Complete", "t2": "Failed"}
    log.add(ev.TaskDeleted(task_id="t1"), ev.TaskDeleted(task_id="t2"), ev.TaskDeleted(task_id="t2"))
    state = log.state()
    assert state.tasks == {}
    assert state == State(last_seen={"master": log.at(8)}, last_event_applied_idx=8)


def test_golden_node_timeout_removes_edges_downloads_and_last_seen() -> None:
    log = Log()
    for node in ("n1", "n2", "n3"):
        log.add(ev.NodeJoined(node_id=node), origin=node)
    log.add(ev.NodeJoined(node_id="n2"))  # duplicate: no-op
    edges = [ev.Connection(source=a, sink=b) for a, b in (("n1", "n2"), ("n2", "n3"), ("n3", "n1"))]
    log.add(*(ev.TopologyEdgeDeleted(edge=e) for e in edges))  # sessions missing
    log.add(ev.TopologyEdgeDeleted(edge=edges[0]))  # duplicate: no-op
    log.add(ev.DownloadPending(node_id="n2", model_id="m"), ev.DownloadPending(node_id="n3", model_id="m"))
    before = log.state()
    assert before.topology == Topology(nodes=("n1", "n2", "n3"), missing=tuple(edges))

    log.add(ev.NodeTimedOut(node_id="n2", heartbeat_age_s=31.0, timeout_s=30.0))
    state = log.state()
    assert state.topology == Topology(nodes=("n1", "n3"), missing=(edges[2],))
    assert set(state.downloads) == {"n3"}
    assert set(state.last_seen) == {"n1", "n3", "master"}

    log.add(ev.TopologyEdgeCreated(edge=edges[2]))  # the session is back
    assert log.state().topology.missing == ()


def test_golden_plugin_data_set_and_delete() -> None:
    log = Log().add(
        ev.PluginDataSet(plugin="p", key="a", value=1),
        ev.PluginDataSet(plugin="p", key="b", value={"deep": [1, 2]}),
        ev.PluginDataSet(plugin="p", key="a", value="overwritten"),
        ev.PluginDataSet(plugin="q", key="gone", value=None),  # delete of nothing: no-op
    )
    assert log.state().plugin_data == {"p": {"a": "overwritten", "b": {"deep": [1, 2]}}}
    log.add(ev.PluginDataSet(plugin="p", key="a", value=None))
    assert log.state().plugin_data == {"p": {"b": {"deep": [1, 2]}}}
    log.add(ev.PluginDataSet(plugin="p", key="b", value=None))
    assert log.state().plugin_data == {}  # the last key takes the plugin's table with it


def test_golden_instance_failures_are_bounded() -> None:
    log = Log()
    for i in range(MAX_INSTANCE_FAILURES + 6):
        log.add(ev.InstanceFailureRecorded(instance_id=f"i{i}", model_id="m", reason=f"r{i}", at=T0))
    failures = log.state().instance_failures
    assert MAX_INSTANCE_FAILURES == 64
    assert len(failures) == 64
    assert [f.reason for f in failures] == [f"r{i}" for i in range(6, 70)]  # oldest dropped first
    assert failures[-1] == InstanceFailure(instance_id="i69", model_id="m", reason="r69", at=T0)


def test_golden_downloads_cards_and_tracing() -> None:
    card = ModelCard(model_id="custom/m", n_layers=2, hidden_size=8)
    log = Log().add(
        ev.DownloadPending(node_id="n1", model_id="m"),
        ev.DownloadPending(node_id="n1", model_id="m2"),
        ev.DownloadCompleted(node_id="n1", model_id="m", total_bytes=42),
        ev.DownloadFailed(node_id="n1", model_id="m2", error_message="404"),
        ev.CustomModelCardAdded(card=card),
        ev.TracingStateChanged(enabled=True),
    )
    state = log.state()
    assert state.downloads == {
        "n1": {"m": DownloadCompletedStatus(total_bytes=42), "m2": DownloadFailedStatus(error_message="404")}
    }
    assert state.custom_model_cards == {"custom/m": card}
    assert state.tracing_enabled is True
    log.add(
        ev.CustomModelCardDeleted(model_id="custom/m"),
        ev.TracingStateChanged(enabled=False),
        ev.DownloadPending(node_id="n1", model_id="m"),
    )
    state = log.state()
    assert state.custom_model_cards == {} and state.tracing_enabled is False
    assert state.downloads["n1"]["m"] == DownloadPendingStatus()


def test_golden_mixed_log_wire_form() -> None:
    """The shape GET /state serves: camelCase keys, tagged sum types."""
    wire = replay(golden_mixed_log()).wire()
    assert wire["lastEventAppliedIdx"] == 12
    assert wire["tracingEnabled"] is True
    assert wire["runners"] == {"r1": {"RunnerReady": {}}}
    inst = wire["instances"]["i1"]["RingInstance"]
    assert inst["shardAssignments"]["runnerToShard"]["r2"]["PipelineShardMetadata"]["startLayer"] == 2
    assert wire["tasks"]["t1"]["TextGenerationTask"]["status"] == "Running"
    assert wire["downloads"] == {"n2": {"m": {"DownloadCompletedStatus": {"totalBytes": 123}}}}
    assert wire["pluginData"] == {"steward": {"k": {"x": [1, 2.5, "y", None]}}}
    assert wire["topology"]["missing"] == [{"source": "n1", "sink": "n2", "kind": "transport"}]
