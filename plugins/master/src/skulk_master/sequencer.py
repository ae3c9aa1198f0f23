"""The master session: index events, turn commands into events, reconcile.

Only the elected master acts; every node runs this object so a new master can take over at once.
A new session seeds itself from the node's replicated State, so instances and completed downloads
survive failover without re-placement. The master keeps its own State (applying what it indexes)
so it validates each command against everything already sequenced, not what the network has
delivered so far.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from skulk_kernel import codec
from skulk_kernel import commands as cmd
from skulk_kernel import events as ev
from skulk_kernel.apply import apply
from skulk_kernel.contracts import PlacementError
from skulk_kernel.ids import CommandId, NodeId, TaskId, new_id
from skulk_kernel.inference import resolve_card
from skulk_kernel.instances import RunnerFailed, instance_ready
from skulk_kernel.placement import capacities, plan_placement
from skulk_kernel.state import State, StateSnapshot
from skulk_kernel.tasks import (
    TERMINAL_TASK_STATUSES,
    ErrorChunk,
    TextEmbeddingTask,
    TextGenerationTask,
)
from skulk_kernel.topics import Topic

log = logging.getLogger("skulk.master")
PLAN_INTERVAL_S = 1.0
# Events a worker may report; anything else on LOCAL_EVENTS is refused before ordering.
REPORTABLE = (
    ev.RunnerStatusUpdated, ev.TaskAcknowledged, ev.TaskStatusUpdated, ev.TaskFailed,
    ev.DownloadPending, ev.DownloadCompleted, ev.DownloadFailed, ev.TopologyEdgeCreated,
    ev.TopologyEdgeDeleted, ev.PluginDataSet,
)


class Master:
    def __init__(self, node: Any, config: Any) -> None:
        self.node = node
        self.config = config
        self.state: State = State()
        self.active = False
        self._lock = asyncio.Lock()
        self._plan_task: asyncio.Task[Any] | None = None
        self._waiting: dict[str, tuple[float, cmd.TextGeneration | cmd.TextEmbedding]] = {}
        self._defaults_placed = False
        self._command = TypeAdapter(cmd.ForwardedCommand)
        planner = next(iter(node.planners.values()), None)
        if planner is not None and hasattr(planner, "overhead"):
            planner.overhead = config.memory_overhead
            planner.floor_bytes = config.memory_floor_mb * 1024 * 1024

    async def attach(self) -> None:
        self.node.subscribe(Topic.COMMANDS, self._on_command)
        self.node.subscribe(Topic.LOCAL_EVENTS, self._on_local_event)
        self.node.transports["control"].serve(Topic.STATE_SYNC, self._serve_sync)

    def _serve_sync(self, sender: str, payload: bytes) -> bytes:
        """A joiner's or follower's snapshot request (runs on a transport thread; State is immutable)."""
        if not self.active:
            return codec.encode(StateSnapshot(master_node_id=NodeId(self.node.master_id or ""),
                                              reason="not the master"))
        return codec.encode(StateSnapshot(master_node_id=NodeId(self.node.node_id), state=self.state))

    async def stop(self) -> None:
        self.active = False
        if self._plan_task is not None:
            self._plan_task.cancel()

    # ------------------------------------------------------------------ session

    async def on_master_changed(self, master_id: str | None) -> None:
        if master_id == self.node.node_id and not self.active:
            await self._begin_session()
        elif master_id != self.node.node_id and self.active:
            log.info("stepping down as master")
            await self.stop()

    async def _begin_session(self) -> None:
        """Seed from the replicated State (or the event log when this node is alone)."""
        self.state = self.node.state
        self.node.event_log.rebase(self.state.last_event_applied_idx, self.state.wire())
        self._defaults_placed = False  # judged against this session's State, not a previous one
        self.active = True
        log.info("master session begins at event %d", self.state.last_event_applied_idx)
        # Requests of the previous session cannot be carried over: their streams were failed on
        # every API node when the master changed; end the tasks so runners stop and State is clean.
        stale: list[Any] = []
        for task in self.state.tasks.values():
            if task.status not in TERMINAL_TASK_STATUSES:
                stale.append(ev.TaskFailed(task_id=task.task_id, error_message="the master changed"))
            stale.append(ev.TaskDeleted(task_id=task.task_id))
        await self.index([*stale, ev.NodeJoined(node_id=self.node.node_id)], origin=self.node.node_id)
        self._plan_task = self.node.spawn(self._plan_loop(), "master-plan")

    # ------------------------------------------------------------------ indexing

    async def index(self, events: list[Any], origin: str) -> None:
        """Sequence, persist and publish events, applying each to the master's own State."""
        if not events:
            return
        async with self._lock:
            now = datetime.now(UTC)
            for event in events:
                indexed = ev.IndexedEvent(idx=self.state.last_event_applied_idx + 1, origin=NodeId(origin),
                                          at=now, event=event)
                self.state = apply(self.state, indexed)
                self.node.event_log.append(indexed.idx, indexed.wire())
                await self.node.publish(Topic.GLOBAL_EVENTS, codec.encode(indexed))

    # ------------------------------------------------------------------ local events

    async def _on_local_event(self, sender: str, payload: bytes) -> None:
        if not self.active:
            return
        local = codec.decode(payload, ev.LocalEvent)
        event = local.event
        if not isinstance(event, REPORTABLE):
            log.warning("refusing %s reported by %s on LOCAL_EVENTS", type(event).__name__, sender)
            return
        follow: list[Any] = []
        if isinstance(event, ev.TaskStatusUpdated | ev.TaskFailed):
            task = self.state.tasks.get(event.task_id)
            if task is None:
                return
            status = "Failed" if isinstance(event, ev.TaskFailed) else event.status
            if status in TERMINAL_TASK_STATUSES:
                follow.append(ev.TaskDeleted(task_id=event.task_id))
        if isinstance(event, ev.TaskAcknowledged) and event.task_id not in self.state.tasks:
            return
        await self.index([event, *follow], origin=sender)
        if isinstance(event, ev.RunnerStatusUpdated):
            await self._dispatch_waiting()
            if isinstance(event.status, RunnerFailed):
                await self._fail_tasks_of_runner(event.runner_id, event.status.error_message)

    # ------------------------------------------------------------------ commands

    async def _on_command(self, sender: str, payload: bytes) -> None:
        if not self.active:
            return
        try:
            forwarded = codec.decode(payload, cmd.ForwardedCommand)
        except ValidationError as exc:
            log.warning("dropping a malformed command from %s: %s", sender, exc)
            return
        command = forwarded.command
        veto = self.node.hooks.call("check_command", firstresult=True, command=command, state=self.state)
        if veto:
            log.warning("command %s refused: %s", type(command).__name__, veto[0])
            await self._refuse(command, str(veto[0]))
            return
        handler = getattr(self, f"_cmd_{type(command).__name__}", None)
        if handler is None:
            log.warning("no handler for command %s", type(command).__name__)
            return
        try:
            await handler(command, forwarded.origin)
        except Exception as exc:
            log.exception("command %s failed", type(command).__name__)
            await self._refuse(command, f"{type(exc).__name__}: {exc}")

    async def _refuse(self, command: Any, reason: str) -> None:
        if isinstance(command, cmd.TextGeneration | cmd.TextEmbedding):
            await self.node.send_chunk(command.owner_node_id, ErrorChunk(
                command_id=command.command_id, seq=0, message=reason, error_type="invalid_request_error",
                code="invalid_request"))

    async def _cmd_PlaceInstance(self, command: cmd.PlaceInstance, origin: str) -> None:
        try:
            instance = plan_placement(self.node, command, self.state)
        except PlacementError as exc:
            log.error("placement of %s failed: %s", command.model_id, exc.message)
            return
        await self.index([ev.InstanceCreated(instance=instance)], origin)

    async def _cmd_CreateInstance(self, command: cmd.CreateInstance, origin: str) -> None:
        await self.index([ev.InstanceCreated(instance=command.instance)], origin)

    def _teardown(self, instance_id: str, reason: str, *, failed: bool) -> list[Any]:
        """Events that end an instance: its tasks first (so streams end), then the instance."""
        out: list[Any] = []
        inst = self.state.instances.get(instance_id)
        if inst is None:
            return out
        for task in self.state.tasks.values():
            if task.instance_id == instance_id and task.status not in TERMINAL_TASK_STATUSES:
                if failed:
                    out.append(ev.TaskFailed(task_id=task.task_id, error_message=reason))
                else:
                    out.append(ev.TaskStatusUpdated(task_id=task.task_id, status="Cancelled"))
                out.append(ev.TaskDeleted(task_id=task.task_id))
        if failed:
            out.append(ev.InstanceFailureRecorded(instance_id=inst.instance_id,
                                                  model_id=inst.shard_assignments.model_id,
                                                  reason=reason, at=datetime.now(UTC)))
        out.append(ev.InstanceDeleted(instance_id=inst.instance_id, reason=reason))
        return out

    async def _fail_streams(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, ev.TaskFailed | ev.TaskStatusUpdated):
                task = self.state.tasks.get(event.task_id)
                if task is not None:
                    message = getattr(event, "error_message", "the instance was deleted")
                    await self.node.send_chunk(task.owner_node_id, ErrorChunk(
                        command_id=task.command_id, seq=0, message=message, code="instance_gone"))

    async def _cmd_DeleteInstance(self, command: cmd.DeleteInstance, origin: str) -> None:
        events = self._teardown(command.instance_id, "deleted by request", failed=False)
        await self._fail_streams(events)
        await self.index(events, origin)

    async def _cmd_FailInstance(self, command: cmd.FailInstance, origin: str) -> None:
        inst = self.state.instances.get(command.instance_id)
        events = self._teardown(command.instance_id, command.reason, failed=True)
        await self._fail_streams(events)
        await self.index(events, origin)
        if inst is not None and command.replace_excluding is not None:
            await self._replace(inst, (*inst.excluded_nodes, command.replace_excluding),
                                len(inst.shard_assignments.node_to_runner))

    async def _replace(self, inst: Any, excluded: tuple[NodeId, ...], min_nodes: int) -> bool:
        """Place the model of a lost instance again, keeping the operator's exclusions."""
        retry = cmd.PlaceInstance(command_id=CommandId(new_id()), model_id=inst.shard_assignments.model_id,
                                  min_nodes=min_nodes, excluded_nodes=excluded)
        try:
            instance = plan_placement(self.node, retry, self.state)
        except PlacementError as exc:
            log.error("cannot re-place %s: %s", retry.model_id, exc.message)
            return False
        log.info("re-placing %s as %s", retry.model_id, instance.instance_id)
        await self.index([ev.InstanceCreated(instance=instance)], self.node.node_id)
        return True

    async def _cmd_RefuseInstancePlacement(self, command: cmd.RefuseInstancePlacement, origin: str) -> None:
        inst = self.state.instances.get(command.instance_id)
        if inst is None:
            return
        reason = f"node {command.node_id} refused the placement: {command.reason}"
        events = self._teardown(command.instance_id, reason, failed=True)
        await self._fail_streams(events)
        await self.index(events, origin)
        width = len(inst.shard_assignments.node_to_runner)
        retry = cmd.PlaceInstance(command_id=CommandId(new_id()), model_id=inst.shard_assignments.model_id,
                                  min_nodes=width + 1, excluded_nodes=inst.excluded_nodes)
        try:
            instance = plan_placement(self.node, retry, self.state)
        except PlacementError:
            fallback = retry.model_copy(update={"min_nodes": 1,
                                                "excluded_nodes": (*inst.excluded_nodes, command.node_id)})
            try:
                instance = plan_placement(self.node, fallback, self.state)
            except PlacementError as exc:
                log.error("cannot re-place %s after a refusal: %s", inst.shard_assignments.model_id, exc)
                return
        await self.index([ev.InstanceCreated(instance=instance)], origin)

    def _pick_instance(self, model_id: str) -> Any:
        """The ready instance with the fewest open tasks, among those on reachable nodes only.

        An instance whose node the transport has seen leave is skipped at once, without waiting
        for the prune: a request sent there would only fail later.
        """
        reachable = self.node.reachable_nodes()
        ready = [i for i in self.state.instances.values()
                 if i.shard_assignments.model_id == model_id and instance_ready(i, self.state.runners)
                 and set(i.shard_assignments.node_to_runner) <= reachable]
        if not ready:
            return None
        load = {i.instance_id: 0 for i in ready}
        for task in self.state.tasks.values():
            if task.instance_id in load and task.status not in TERMINAL_TASK_STATUSES:
                load[task.instance_id] += 1
        return min(ready, key=lambda i: (load[i.instance_id], i.instance_id))

    async def _dispatch(self, command: cmd.TextGeneration | cmd.TextEmbedding, origin: str) -> bool:
        model_id = command.params.model_id
        instance = self._pick_instance(model_id)
        if instance is None:
            placed = [i for i in self.state.instances.values() if i.shard_assignments.model_id == model_id]
            reachable = self.node.reachable_nodes()
            if placed and all(not set(i.shard_assignments.node_to_runner) <= reachable for i in placed):
                await self.node.send_chunk(command.owner_node_id, ErrorChunk(
                    command_id=command.command_id, seq=0, code="instance_gone",
                    message=f"every instance of {model_id!r} is on a node that left the cluster; it is re-placed "
                            f"once the node times out ({self.config.node_timeout_s:.0f}s): retry shortly"))
                return True
            if not placed:
                await self.node.send_chunk(command.owner_node_id, ErrorChunk(
                    command_id=command.command_id, seq=0, code="model_not_placed",
                    message=f"model {model_id!r} has no running instance; place one with POST /place_instance"))
                return True
            return False
        task_type = TextGenerationTask if isinstance(command, cmd.TextGeneration) else TextEmbeddingTask
        task = task_type(task_id=TaskId(command.command_id), command_id=command.command_id,
                         instance_id=instance.instance_id, owner_node_id=command.owner_node_id,
                         params=command.params)  # type: ignore[arg-type]
        await self.index([ev.TaskCreated(task=task)], origin)
        return True

    async def _cmd_TextGeneration(self, command: cmd.TextGeneration, origin: str) -> None:
        if not await self._dispatch(command, origin):
            self._waiting[command.command_id] = (time.monotonic(), command)

    _cmd_TextEmbedding = _cmd_TextGeneration

    async def _dispatch_waiting(self) -> None:
        for command_id, (since, command) in list(self._waiting.items()):
            if await self._dispatch(command, command.owner_node_id):
                self._waiting.pop(command_id, None)
            elif time.monotonic() - since > self.config.dispatch_wait_s:
                self._waiting.pop(command_id, None)
                await self.node.send_chunk(command.owner_node_id, ErrorChunk(
                    command_id=command.command_id, seq=0, code="instance_not_ready",
                    message=f"no instance of {command.params.model_id!r} became ready within "
                            f"{self.config.dispatch_wait_s:.0f}s"))

    async def _cmd_TaskCancelled(self, command: cmd.TaskCancelled, origin: str) -> None:
        if self._waiting.pop(command.task_command_id, None) is not None:
            return
        task = self.state.tasks.get(TaskId(command.task_command_id))
        if task is not None and task.status not in TERMINAL_TASK_STATUSES:
            await self.index([ev.TaskStatusUpdated(task_id=task.task_id, status="Cancelled")], origin)

    async def _cmd_TaskFinished(self, command: cmd.TaskFinished, origin: str) -> None:
        task_id = TaskId(command.task_command_id)
        if task_id in self.state.tasks:
            await self.index([ev.TaskDeleted(task_id=task_id)], origin)

    async def _cmd_AddCustomModelCard(self, command: cmd.AddCustomModelCard, origin: str) -> None:
        await self.index([ev.CustomModelCardAdded(card=command.card)], origin)

    async def _cmd_DeleteCustomModelCard(self, command: cmd.DeleteCustomModelCard, origin: str) -> None:
        await self.index([ev.CustomModelCardDeleted(model_id=command.model_id)], origin)

    async def _cmd_SetTracingEnabled(self, command: cmd.SetTracingEnabled, origin: str) -> None:
        await self.index([ev.TracingStateChanged(enabled=command.enabled)], origin)

    async def _fail_tasks_of_runner(self, runner_id: str, reason: str) -> None:
        instance = next((i for i in self.state.instances.values()
                         if runner_id in i.shard_assignments.runner_to_shard), None)
        if instance is None:
            return
        events: list[Any] = []
        for task in self.state.tasks.values():
            if task.instance_id == instance.instance_id and task.status not in TERMINAL_TASK_STATUSES:
                events += [ev.TaskFailed(task_id=task.task_id, error_message=f"runner failed: {reason}"),
                           ev.TaskDeleted(task_id=task.task_id)]
        await self._fail_streams(events)
        await self.index(events, self.node.node_id)

    # ------------------------------------------------------------------ reconciliation

    async def _plan_loop(self) -> None:
        while self.active:
            try:
                await self._reconcile()
            except Exception:
                log.exception("reconciliation pass failed (will retry)")
            await asyncio.sleep(PLAN_INTERVAL_S)

    async def _reconcile(self) -> None:
        now = time.monotonic()
        heard = self.node.readings.nodes()
        joins = [ev.NodeJoined(node_id=NodeId(n)) for n in sorted(heard) if n not in self.state.topology.nodes
                 and (self.node.readings.last_heard(n) or 1e9) < self.config.node_timeout_s]
        await self.index(joins, self.node.node_id)
        for node_id in list(self.state.topology.nodes):
            if node_id == self.node.node_id:
                continue
            age = self.node.readings.last_heard(node_id)
            if age is None or age > self.config.node_timeout_s:
                await self._prune(node_id, age)
        await self._dispatch_waiting()
        if not self._defaults_placed and now > 0:
            await self._place_defaults()

    async def _prune(self, node_id: str, age: float | None) -> None:
        """A node went silent past the timeout: fail its work, drop it, re-place what it ran."""
        events: list[Any] = []
        lost = [inst for inst in self.state.instances.values() if node_id in inst.shard_assignments.node_to_runner]
        for inst in lost:
            events += self._teardown(inst.instance_id, f"node {node_id} timed out", failed=True)
        last_event = self.state.last_seen.get(node_id)
        events.append(ev.NodeTimedOut(
            node_id=NodeId(node_id), heartbeat_age_s=age, timeout_s=self.config.node_timeout_s,
            last_event_age_s=(datetime.now(UTC) - last_event).total_seconds() if last_event else None))
        log.warning("pruning node %s (silent for %s s); %d instance(s) lost", node_id,
                    "?" if age is None else f"{age:.1f}", len(lost))
        await self._fail_streams(events)
        await self.index(events, self.node.node_id)
        self.node.readings.forget(node_id)
        for inst in lost:
            await self._replace(inst, (*inst.excluded_nodes, NodeId(node_id)),
                                len(inst.shard_assignments.node_to_runner))

    async def _place_defaults(self) -> None:
        if self.node.options.extra.get("no_default_models") or not self.config.default_models:
            self._defaults_placed = True
            return
        caps = capacities(self.node)
        if self.node.node_id not in caps:
            return  # our own readings are not in yet
        for model_ref in self.config.default_models:
            card = resolve_card(self.node, model_ref)
            if card is None:
                log.warning("default model %s is not in the catalog yet", model_ref)
                return
            if any(i.shard_assignments.model_id == card.model_id for i in self.state.instances.values()):
                continue
            command = cmd.PlaceInstance(command_id=CommandId(new_id()), model_id=card.model_id)
            try:
                instance = plan_placement(self.node, command, self.state)
            except PlacementError as exc:
                log.error("cannot place default model %s: %s", card.model_id, exc.message)
                continue
            log.info("placing default model %s", card.model_id)
            await self.index([ev.InstanceCreated(instance=instance)], self.node.node_id)
        self._defaults_placed = True
