"""The master session: a thin shell around the kernel's pure decide().

Only the elected master acts; every node runs this object so a new master can take over at once.
A new session seeds itself from the node's replicated State, so instances and completed downloads
survive failover without re-placement. The master keeps its own State (applying what it indexes)
so it decides each command against everything already sequenced, not what the network has
delivered so far.

Every decision (commands, worker reports, prunes, the session start) is made by a pure function
of `skulk_kernel.api`; this module only gathers the `DecisionView`, and carries each `Decision`
out: index the events, send the replies, apply the effects to its own bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from skulk_kernel.api import (
    CommandId,
    Decision,
    DecisionView,
    ErrorChunk,
    Event,
    ForgetNode,
    ForwardedCommand,
    IndexedEvent,
    LocalEvent,
    NodeId,
    NodeJoined,
    NodeSurface,
    Outcome,
    OutcomeStatus,
    Park,
    PlaceInstance,
    Request,
    Retry,
    RunnerStatusUpdated,
    State,
    StateSnapshot,
    Topic,
    Unpark,
    apply,
    codec,
    decide,
    new_id,
    resolve_card,
    teardown,
)

from .answered import AnsweredCommands
from .duties import decide_prune, decide_report, decide_session_start
from .eventlog import EventLog, EventLogStatus
from .keep_alive import IdleClock
from .placement import capacities
from .planner import MemoryPlanner
from .plugin import MasterConfig
from .relay import TelemetryRelay

log = logging.getLogger("skulk.master")
PLAN_INTERVAL_S = 1.0


class Master:
    def __init__(self, node: NodeSurface, config: MasterConfig) -> None:
        self.node = node
        self.config = config
        self.state: State = State()
        self.active = False
        self._session_began = time.monotonic()
        self._lock = asyncio.Lock()
        self._plan_task: asyncio.Task[Any] | None = None
        self._parked: dict[str, tuple[float, Request]] = {}
        self._retries: dict[str, tuple[float, PlaceInstance]] = {}  # model id -> re-placement waiting for room
        self._defaults_placed = False
        self._event_log: EventLog | None = None
        self._answered = AnsweredCommands()  # this session's outcomes, by command id
        self.idle = IdleClock()  # fed on every node (plugin.on_event_applied), acted on by the master
        self.relay = TelemetryRelay(node)  # the cluster's readings, one digest a round (relay.py)
        planner = next(iter(node.planners.values()), None)
        if isinstance(planner, MemoryPlanner):
            planner.overhead = config.memory_overhead
            planner.floor_bytes = config.memory_floor_mb * 1024 * 1024

    async def attach(self) -> None:
        self.node.subscribe(Topic.COMMANDS, self._on_command)
        self.node.subscribe(Topic.LOCAL_EVENTS, self._on_local_event)
        self.node.transports["control"].serve(Topic.STATE_SYNC, self._serve_sync)

    def _serve_sync(self, sender: str, payload: bytes) -> bytes:
        """A joiner's or follower's snapshot request (runs on a transport thread; State is immutable)."""
        if not self.active:
            return codec.encode(
                StateSnapshot(master_node_id=NodeId(self.node.master_id or ""), reason="not the master")
            )
        return codec.encode(StateSnapshot(master_node_id=NodeId(self.node.node_id), state=self.state))

    async def stop(self) -> None:
        self.active = False
        if self._plan_task is not None:
            self._plan_task.cancel()
        await self.relay.stop()

    def close(self) -> None:
        """At node shutdown: flush and close the event log (a step-down keeps it open for the next term)."""
        if self._event_log is not None:
            self._event_log.close()
            self._event_log = None

    @property
    def event_log(self) -> EventLog:
        """The master's event log (SKULK_HOME/events), opened when this node first becomes master.

        Only the master writes events, so the log is the master's, not the kernel's: a node that is
        never elected never opens one.
        """
        if self._event_log is None:
            folder = Path(self.node.options.home) / "events"
            if folder.is_dir() and any(folder.iterdir()):
                # Identity is ephemeral: a previous run's log describes a cluster this node is no
                # longer part of. Keep it for forensics, never replay it.
                previous = Path(self.node.options.home) / "events.previous"
                shutil.rmtree(previous, ignore_errors=True)
                folder.rename(previous)
            self._event_log = EventLog(folder)
        return self._event_log

    def event_log_status(self) -> EventLogStatus | None:
        """The log's health for /state and diagnostics (None when this node has not been master)."""
        return self._event_log.status() if self._event_log is not None else None

    # ------------------------------------------------------------------ the view and the decision

    def view(self) -> DecisionView:
        """What the master knows besides State, gathered once per decision."""
        return DecisionView(
            master_id=self.node.node_id,
            now=datetime.now(UTC),
            reachable=frozenset(self.node.reachable_nodes()),
            capacities=capacities(self.node),
            resolve=lambda ref: resolve_card(self.node, ref),
            planner=next(iter(self.node.planners.values()), None),
            parked=frozenset(self._parked),
            node_timeout_s=self.config.node_timeout_s,
        )

    async def carry_out(self, decision: Decision, origin: str) -> None:
        """Send the replies (streams end first), index the events, then apply the effects."""
        for line in decision.log:
            log.warning("%s", line)
        for reply in decision.replies:
            await self.node.send_chunk(reply.owner, reply.chunk)
        await self.index(list(decision.events), origin)
        for effect in decision.effects:
            if isinstance(effect, Park):
                self._parked.setdefault(effect.command.command_id, (time.monotonic(), effect.command))
            elif isinstance(effect, Unpark):
                self._parked.pop(effect.command_id, None)
            elif isinstance(effect, Retry):
                self._retries.setdefault(effect.command.model_id, (time.monotonic(), effect.command))
            elif isinstance(effect, ForgetNode):
                self.node.readings.forget(effect.node_id)

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
        self.event_log.rebase(self.state.last_event_applied_idx, self.state.wire())
        self._defaults_placed = False  # judged against this session's State, not a previous one
        self._parked.clear()
        self._answered.clear()
        self.active = True
        self._session_began = time.monotonic()
        log.info("master session begins at event %d", self.state.last_event_applied_idx)
        await self.carry_out(decide_session_start(self.state, self.view()), self.node.node_id)
        self._plan_task = self.node.spawn(self._plan_loop(), "master-plan")

    # ------------------------------------------------------------------ indexing

    async def index(self, events: list[Event], origin: str) -> None:
        """Sequence, persist and publish events, applying each to the master's own State."""
        if not events:
            return
        async with self._lock:
            now = datetime.now(UTC)
            for event in events:
                indexed = IndexedEvent(
                    idx=self.state.last_event_applied_idx + 1, origin=NodeId(origin), at=now, event=event
                )
                self.state = apply(self.state, indexed)
                self.event_log.append(indexed.idx, indexed.wire())
                await self.node.publish(Topic.GLOBAL_EVENTS, codec.encode(indexed))

    # ------------------------------------------------------------------ inputs

    async def _on_local_event(self, sender: str, payload: bytes) -> None:
        if not self.active:
            return
        try:
            local = codec.decode(payload, LocalEvent)
        except ValidationError as exc:
            log.warning("dropping a malformed local event from %s: %s", sender, exc)
            return
        await self.carry_out(decide_report(self.state, sender, local.event, self.view()), sender)
        if isinstance(local.event, RunnerStatusUpdated):
            await self._dispatch_parked()

    async def _on_command(self, sender: str, payload: bytes) -> None:
        if not self.active:
            return
        try:
            forwarded = codec.decode(payload, ForwardedCommand)
        except ValidationError as exc:
            log.warning("dropping a malformed command from %s: %s", sender, exc)
            return
        if forwarded.origin != sender:  # the transport authenticates the sender; the origin is only claimed
            log.warning("dropping a command from %s that claims to come from %s", sender, forwarded.origin)
            return
        command = forwarded.command
        answered = self._answered.get(command.command_id)
        if answered is None:
            answered = await self._decide_command(command, forwarded.origin)
            self._answered.remember(answered)
        await self.node.send_outcome(forwarded.origin, answered)

    async def _decide_command(self, command: Any, origin: str) -> Outcome:
        """Decide and carry out a command seen for the first time this session; say what became of it."""
        veto = self.node.hooks.call("check_command", firstresult=True, command=command, state=self.state)
        if veto:
            log.warning("command %s refused: %s", type(command).__name__, veto[0])
            await self._refuse(command, str(veto[0]))
            return self._outcome(command, "refused", reason=str(veto[0]), kind="vetoed")
        try:
            decision = decide(self.state, command, self.view())
        except Exception as exc:
            log.exception("deciding about command %s failed", type(command).__name__)
            await self._refuse(command, f"{type(exc).__name__}: {exc}")
            return self._outcome(command, "refused", reason=f"the master failed to decide: {exc}", kind="internal")
        await self.carry_out(decision, origin)
        if decision.refusal is not None:
            refusal = decision.refusal
            return self._outcome(
                command, "refused", reason=refusal.reason, kind=refusal.kind, retryable=refusal.retryable
            )
        return self._outcome(command, "indexed", events=len(decision.events))

    def _outcome(self, command: Any, status: OutcomeStatus, **fields: Any) -> Outcome:
        return Outcome(
            command_id=command.command_id,
            status=status,
            event_idx=self.state.last_event_applied_idx,
            master_id=NodeId(self.node.node_id),
            **fields,
        )

    async def _refuse(self, command: Any, reason: str) -> None:
        if isinstance(command, Request):  # a request's owner waits for an answer
            await self.node.send_chunk(
                command.owner_node_id,
                ErrorChunk(
                    command_id=command.command_id,
                    seq=0,
                    message=reason,
                    error_type="invalid_request_error",
                    code="invalid_request",
                ),
            )

    # ------------------------------------------------------------------ reconciliation

    async def _dispatch_parked(self) -> None:
        for command_id, (since, command) in list(self._parked.items()):
            if time.monotonic() - since > self.config.dispatch_wait_s:
                self._parked.pop(command_id, None)
                await self.node.send_chunk(
                    command.owner_node_id,
                    ErrorChunk(
                        command_id=command.command_id,
                        seq=0,
                        code="instance_not_ready",
                        message=f"no instance of {command.params.model_id!r} became ready within "
                        f"{self.config.dispatch_wait_s:.0f}s",
                    ),
                )
                continue
            await self.carry_out(decide(self.state, command, self.view()), command.owner_node_id)

    async def _retry_placements(self) -> None:
        """Re-place lost instances once capacity allows (a node came back, memory freed), for a while."""
        for model_id, (since, command) in list(self._retries.items()):
            placed = any(i.shard_assignments.model_id == model_id for i in self.state.instances.values())
            if placed or time.monotonic() - since > self.config.replace_retry_s:
                self._retries.pop(model_id, None)
                if not placed:
                    log.error("gave up re-placing %s after %.0fs without capacity", model_id, time.monotonic() - since)
                continue
            decision = decide(self.state, command, self.view())
            if decision.events:
                self._retries.pop(model_id, None)
                await self.carry_out(decision, self.node.node_id)

    async def _plan_loop(self) -> None:
        while self.active:
            try:
                await self._reconcile()
            except Exception:
                log.exception("reconciliation pass failed (will retry)")
            await asyncio.sleep(PLAN_INTERVAL_S)

    async def _reconcile(self) -> None:
        heard = self.node.readings.nodes()
        joins: list[Event] = [
            NodeJoined(node_id=NodeId(n))
            for n in sorted(heard)
            if n not in self.state.topology.nodes
            and (self.node.readings.last_heard(n) or 1e9) < self.config.node_timeout_s
        ]
        await self.index(joins, self.node.node_id)
        reachable = self.node.reachable_nodes()
        departed_after = min(self.config.departed_after_s, self.config.node_timeout_s)
        for node_id in list(self.state.topology.nodes):
            if node_id == self.node.node_id:
                continue
            age = self._silence(node_id, node_id in reachable)
            if age > self.config.node_timeout_s:
                await self.carry_out(decide_prune(self.state, node_id, age, self.view()), self.node.node_id)
            elif node_id not in reachable and age > departed_after:
                # the transport saw it leave and its heartbeats stopped: gone, not merely slow
                decision = decide_prune(self.state, node_id, age, self.view(), departed_after_s=departed_after)
                await self.carry_out(decision, self.node.node_id)
        await self._dispatch_parked()
        await self._retry_placements()
        await self._expire_idle()
        if not self._defaults_placed:
            await self._place_defaults()

    def _silence(self, node_id: str, reachable: bool) -> float:
        """How long `node_id` has been silent, as far as this master session can judge.

        Followers address their readings to the master, so a new master knows its members only
        from its predecessor's digests (up to a round old when it died) until each follower has
        heard the election and sent again: a member it has not heard from since its session began
        counts as silent only since then. A peer the transport saw leave keeps its true age (it
        is the old master, or a node that died with it): its work is re-placed at once.
        """
        since_session = time.monotonic() - self._session_began
        age = self.node.readings.last_heard(node_id)
        if age is None:
            return since_session
        return age if not reachable else min(age, since_session)

    async def _expire_idle(self) -> None:
        """Remove the on-demand instances idle past their keep_alive (keep_alive.py), and stale marks."""
        view = self.view()
        defaults = () if self.node.options.extra.get("no_default_models") else self.config.default_models
        kept = frozenset(card.model_id for ref in defaults if (card := resolve_card(self.node, ref)) is not None)
        for instance_id in self.idle.expired(self.state, self.config.keep_alive_s, view.now, kept):
            log.info("removing %s: idle past its keep_alive", instance_id)
            ended = teardown(self.state, instance_id, "idle past its keep_alive", failed=False, view=view)
            await self.carry_out(ended, self.node.node_id)
            self.idle.forget(instance_id)
        await self.index(list(self.idle.orphans(self.state)), self.node.node_id)

    async def _place_defaults(self) -> None:
        if self.node.options.extra.get("no_default_models") or not self.config.default_models:
            self._defaults_placed = True
            return
        if self.node.node_id not in capacities(self.node):
            return  # our own readings are not in yet
        for model_ref in self.config.default_models:
            card = resolve_card(self.node, model_ref)
            if card is None:
                log.warning("default model %s is not in the catalog yet", model_ref)
                return
            if any(i.shard_assignments.model_id == card.model_id for i in self.state.instances.values()):
                continue
            command = PlaceInstance(command_id=CommandId(new_id()), model_id=card.model_id)
            decision = decide(self.state, command, self.view())
            if decision.events:
                log.info("placing default model %s", card.model_id)
            await self.carry_out(decision, self.node.node_id)
        self._defaults_placed = True
