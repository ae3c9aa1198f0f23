"""keep_alive.py from applied events alone: an on-demand instance expires after its keep_alive of
idleness (the mark's own value, or the master's default), never while a task is open or before the
request that placed it got there; unmarked instances never expire; stale marks are removed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from skulk_kernel.api import (
    ChatMessage,
    IndexedEvent,
    InstanceCreated,
    InstanceId,
    ModelId,
    NodeId,
    PipelineShardMetadata,
    PluginDataSet,
    RingInstance,
    RunnerId,
    RunnerReady,
    RunnerStatusUpdated,
    ShardAssignments,
    State,
    TaskCreated,
    TaskDeleted,
    TextGenerationParams,
    TextGenerationTask,
    apply,
)
from skulk_master.keep_alive import LOAD_GRACE_S, IdleClock, mark_key

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def instance_on(node: str, iid: str) -> RingInstance:
    shard = PipelineShardMetadata(
        model_id=ModelId("m"), device_rank=0, world_size=1, start_layer=0, end_layer=4, n_layers=4, backend="echo-cpu"
    )
    assignments = ShardAssignments(
        model_id=ModelId("m"),
        runner_to_shard={RunnerId(f"{iid}-r0"): shard},
        node_to_runner={NodeId(node): RunnerId(f"{iid}-r0")},
    )
    return RingInstance(instance_id=InstanceId(iid), engine="echo", context_limit=4096, shard_assignments=assignments)


class Cluster:
    """A State built by apply(), with the clock fed exactly as every node feeds it."""

    def __init__(self) -> None:
        self.state, self.clock, self.now = State(), IdleClock(), T0

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now

    def apply(self, *events: object) -> None:
        for event in events:
            indexed = IndexedEvent(
                idx=self.state.last_event_applied_idx + 1, origin=NodeId("a"), at=self.now, event=event
            )  # type: ignore[arg-type]
            before, self.state = self.state, apply(self.state, indexed)
            self.clock.note(indexed, before)

    def placed(self, iid: str = "i1", seconds: float | None = None, marked: bool = True) -> None:
        self.apply(InstanceCreated(instance=instance_on("a", iid)))
        if marked:
            self.apply(PluginDataSet(plugin="master", key=mark_key(iid), value={"seconds": seconds}))
        self.apply(RunnerStatusUpdated(runner_id=RunnerId(f"{iid}-r0"), status=RunnerReady()))

    def request(self, task_id: str, iid: str = "i1") -> None:
        params = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),))  # type: ignore[arg-type]
        task = TextGenerationTask(
            task_id=task_id, command_id=task_id, instance_id=iid, owner_node_id="a", params=params
        )  # type: ignore[arg-type]
        self.apply(TaskCreated(task=task))

    def expired(self, default_s: float = 300.0) -> list[str]:
        return self.clock.expired(self.state, default_s, self.now)


def test_an_on_demand_instance_expires_after_its_keep_alive_of_idleness() -> None:
    c = Cluster()
    c.placed(seconds=2.0)
    c.at(0.5)
    c.request("t1")
    c.at(20)
    assert c.expired() == []  # a task is open: busy however long it runs
    c.apply(TaskDeleted(task_id="t1"))  # type: ignore[arg-type]
    c.at(21.9)
    assert c.expired() == []
    c.at(22.1)
    assert c.expired() == ["i1"]


def test_the_default_keep_alive_and_the_never_expiring_ones() -> None:
    c = Cluster()
    c.placed("i1", seconds=None)
    c.placed("i2", seconds=-1)
    c.placed("i3", marked=False)  # a default model or an explicit placement
    for i, iid in enumerate(("i1", "i2", "i3")):
        c.request(f"t{i}", iid)
        c.apply(TaskDeleted(task_id=f"t{i}"))  # type: ignore[arg-type]
    c.at(299)
    assert c.expired(default_s=300) == []
    c.at(301)
    assert c.expired(default_s=300) == ["i1"]
    assert c.clock.expires_at(c.state, "i2", 300, c.now) is None
    assert c.clock.expires_at(c.state, "i3", 300, c.now) is None


def test_a_default_model_placed_by_a_request_first_stays() -> None:
    c = Cluster()
    c.placed(seconds=0)  # a request reached it before the master placed its default models
    c.request("t1")
    c.apply(TaskDeleted(task_id="t1"))  # type: ignore[arg-type]
    c.at(600)
    assert c.clock.expired(c.state, 300, c.now, kept=frozenset({"m"})) == []
    assert c.expired() == ["i1"]


def test_a_fresh_instance_waits_for_the_request_that_placed_it() -> None:
    c = Cluster()
    c.placed(seconds=0)
    assert c.expired() == []  # ready, but its first request has not been dispatched yet
    c.at(LOAD_GRACE_S + 1)
    assert c.expired() == ["i1"]  # nobody came


def test_keep_alive_zero_unloads_right_after_the_request() -> None:
    c = Cluster()
    c.placed(seconds=0)
    c.request("t1")
    assert c.expired() == []
    c.at(1)
    c.apply(TaskDeleted(task_id="t1"))  # type: ignore[arg-type]
    assert c.expired() == ["i1"]


def test_marks_of_instances_that_are_gone_are_removed() -> None:
    c = Cluster()
    c.apply(PluginDataSet(plugin="master", key=mark_key("gone"), value={"seconds": 5}))
    assert c.clock.orphans(c.state) == [PluginDataSet(plugin="master", key=mark_key("gone"), value=None)]
