"""The node runtime: one asyncio process that hosts the plugins a profile composes.

It owns the State replica (fed only by indexed events), the planes (bridged into asyncio), the
telemetry readings, the per-command chunk streams and the lifecycle; roles (master, worker, API)
are plugins that use them through `contracts.NodeSurface`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy
from pydantic import BaseModel, TypeAdapter, ValidationError

from . import codec
from .apply import apply
from .commands import Command
from .contracts import PeerEvent
from .events import Connection, Event, IndexedEvent, LocalEvent, TopologyEdgeCreated, TopologyEdgeDeleted
from .hooks import GuardedHooks, NodeError, Registry, collect
from .ids import NodeId, new_id
from .outcomes import DEFAULT_TIMEOUT_S, Outcome, Submitter
from .plugins import build_plugin_manager, kernel_version
from .profiles import Profile
from .readings import ReadingStore, SendFilter, probe_readings
from .services import Services
from .state import State, StateSnapshot
from .streams import StreamRouter
from .tasks import Chunk
from .topics import Topic
from .transport_local import LocalTransport

log = logging.getLogger("skulk.node")
HEARTBEAT_INTERVAL_S = 2.0
SYNC_TIMEOUT_S = 10.0
_CHUNK = TypeAdapter(Chunk)


@dataclass
class NodeOptions:
    home: Path = field(default_factory=lambda: Path(os.environ.get("SKULK_HOME", "~/.skulk")).expanduser())
    api_port: int = 52415
    api_host: str = "0.0.0.0"
    no_api: bool = False
    no_worker: bool = False
    force_master: bool = False
    bootstrap_peers: tuple[str, ...] = ()
    node_name: str = field(default_factory=socket.gethostname)
    offline: bool = field(default_factory=lambda: os.environ.get("SKULK_OFFLINE", "") not in ("", "0"))
    extra: dict[str, Any] = field(default_factory=dict)


def config_error(plugin: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One paragraph for people: the bad key and the valid keys, or the key and the type it wants."""
    fields = model.model_fields
    valid = ", ".join(sorted(fields))
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(table)"
        top = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r}")
        elif top in fields:
            ann = fields[top].annotation
            wants = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
            problems.append(f"key {key!r} wants {wants} (got {err.get('input')!r}: {err['msg']})")
        else:
            problems.append(f"{key}: {err['msg']}")
    unknown = any(err["type"] == "extra_forbidden" for err in exc.errors())
    return "; ".join(problems) + (f". Plugin {plugin!r} accepts the keys: {valid}." if unknown else ".")


class Node:
    def __init__(
        self, profile: Profile, options: NodeOptions | None = None, pm: pluggy.PluginManager | None = None
    ) -> None:
        self.profile = profile
        self.options = options or NodeOptions()
        self.pm = pm or build_plugin_manager(profile)
        self.hooks = GuardedHooks(self.pm)
        self.node_id = NodeId(new_id())  # ephemeral: a restarted node is a new node
        self.home = self.options.home
        self.state = State()
        self.readings = ReadingStore()
        self._send_filter = SendFilter()
        self.streams = StreamRouter()
        self.master_id: str | None = None
        self.started_at = time.time()
        self.health_notes: dict[str, dict[str, str]] = {}  # plugin-reported conditions
        self.facts: dict[str, Any] = {}
        self.services = Services()  # plugin-published per-node objects, by typed key
        self._config_models: dict[str, type[BaseModel]] = {}
        self._plugin_config: dict[str, BaseModel] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending_events: dict[int, IndexedEvent] = {}
        self._state_changed: asyncio.Condition | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_task: asyncio.Task[Any] | None = None
        self._peers: set[str] = set()  # live transport sessions (control plane)
        self.exit_code = 0
        self.transports: dict[str, Any] = {}
        self.submitter = Submitter(self)
        self.applying_task: asyncio.Task[Any] | None = None
        self.engines = Registry("engine")
        self.planners = Registry("planner")
        self.model_stores = Registry("model store")
        self.elections = Registry("election")
        self._configure()

    # ---------------------------------------------------------------- configuration

    def _configure(self) -> None:
        def register(plugin: str, model: type[BaseModel]) -> None:
            self._config_models[plugin] = model

        self.hooks.call("register_config", register=register)
        for plugin, model in self._config_models.items():
            try:
                self._plugin_config[plugin] = model(**self.profile.config_for(plugin))
            except ValidationError as exc:
                problem = config_error(plugin, model, exc)
                raise NodeError(f"[plugins.{plugin}] in profile {self.profile.source}: {problem}") from None
        unknown = set(self.profile.plugin_config) - set(self._config_models)
        for plugin in sorted(unknown):
            log.warning("profile has [plugins.%s] but no loaded plugin declares that config", plugin)
        self.hooks.call("configure", node=self)
        self.engines = collect(self.hooks, "register_engines", "engine", self)
        self.planners = collect(self.hooks, "register_planners", "planner", self)
        self.model_stores = collect(self.hooks, "register_model_stores", "model store", self)
        self.elections = collect(self.hooks, "register_elections", "election", self)
        registered = collect(self.hooks, "register_transports", "transport", self)
        registered.setdefault("local", LocalTransport())
        for plane in ("control", "telemetry", "data"):
            name = self.profile.planes.transport_for(plane)
            if name not in registered:
                raise NodeError(
                    f"profile {self.profile.name!r} puts the {plane} plane on transport {name!r}, "
                    f"which no loaded plugin registers (have: {sorted(registered)})"
                )
            self.transports[plane] = registered[name]

    def engine_owner(self, engine_name: str) -> str:
        return self.engines.owner[engine_name]

    def plugin_config(self, plugin: str) -> Any:
        """The validated config model of `plugin` (declared through register_config)."""
        return self._plugin_config.get(plugin)

    @property
    def plugin_names(self) -> list[str]:
        return [n for n, _ in self.pm.list_name_plugin() if n != "kernel-defaults"]

    # ---------------------------------------------------------------- roles

    @property
    def is_master(self) -> bool:
        return self.master_id == self.node_id

    async def set_master(self, master_id: str | None) -> None:
        """Called by the election (or at start when there is none)."""
        if master_id == self.master_id:
            return
        previous = self.master_id
        log.info("master is now %s%s", master_id, " (this node)" if master_id == self.node_id else "")
        self.master_id = master_id
        self._send_filter.reset()  # a new master (relay) gets every reading again
        self.submitter.master_changed(master_id)
        if previous is not None:  # a new master's session cannot carry the old one's requests
            self.streams.fail_all(f"the cluster master changed (was {previous}); please retry", code="master_changed")
        if master_id is not None and master_id != self.node_id:
            self.request_sync()
        await self.hooks.acall(
            "on_master_changed", node=self, master_node_id=master_id, is_master=master_id == self.node_id
        )

    # ---------------------------------------------------------------- planes

    def _transport(self, topic: Topic) -> Any:
        return self.transports[topic.plane.value]

    def subscribe(self, topic: Topic, handler: Callable[[str, bytes], Awaitable[None] | None]) -> None:
        """Deliver every message on `topic` to `handler(sender, payload)` in order, on the loop."""
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def on_message(sender: str, payload: bytes) -> None:
            if threading.get_ident() == loop_thread:
                queue.put_nowait((sender, payload))
            else:
                loop.call_soon_threadsafe(queue.put_nowait, (sender, payload))

        async def pump() -> None:
            while True:
                sender, payload = await queue.get()
                try:
                    result = handler(sender, payload)
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:
                    log.exception("handler for %s failed on a message from %s", topic.value, sender)

        self._transport(topic).subscribe(topic, on_message)
        self.spawn(pump(), f"pump-{topic.value}")

    async def publish(self, topic: Topic, payload: bytes) -> None:
        master = self.master_id
        if topic in (Topic.COMMANDS, Topic.LOCAL_EVENTS, Topic.READINGS) and master in (self.node_id, *self._peers):
            # only the master reads these (readings: it relays a round's in one digest), addressed to it
            return await self._transport(topic).send(str(master), topic, payload)
        if topic is not Topic.READINGS:  # readings wait for a master (all re-sent to it): no N x N storm at failover
            await self._transport(topic).publish(topic, payload)

    async def submit(self, command: Command, timeout: float = DEFAULT_TIMEOUT_S) -> Outcome:
        """Send a command to the master and await what became of it (see `outcomes`).

        Held while there is no master, sent again until answered, and returned once this node's
        State has the events it produced; never raises for a lost or refused command.
        """
        return await self.submitter.submit(command, timeout)

    async def post(self, command: Command) -> None:
        """Send a command whose answer comes another way (a request's stream, a cancel): once, unawaited.

        With no master yet it is held and sent when one is elected.
        """
        await self.submitter.post(command)

    async def send_outcome(self, origin: str, outcome: Outcome) -> None:
        """The master's answer to `origin` about one of its commands."""
        await self._transport(Topic.OUTCOMES).send(origin, Topic.OUTCOMES, codec.encode(outcome))

    async def emit(self, event: Event) -> None:
        """Report a local fact (runner status, task ack) for the master to index."""
        await self.publish(Topic.LOCAL_EVENTS, codec.encode(LocalEvent(origin=self.node_id, event=event)))

    async def send_chunk(self, owner: str, chunk: Chunk) -> None:
        """Deliver a chunk to the owning API node; same-node delivery skips encoding."""
        if owner == self.node_id:
            self.streams.deliver(chunk)
        else:
            await self._transport(Topic.CHUNKS).send(owner, Topic.CHUNKS, codec.encode(chunk))

    def _on_chunk(self, sender: str, payload: bytes) -> None:
        self.streams.deliver(codec.decode_union(payload, _CHUNK))

    # ---------------------------------------------------------------- state

    async def ingest(self, indexed: IndexedEvent) -> None:
        """Apply indexed events in order; a gap (late join, lost message) triggers a state sync."""
        if indexed.idx <= self.state.last_event_applied_idx:
            return
        self._pending_events[indexed.idx] = indexed
        if indexed.idx > self.state.last_event_applied_idx + 1 and not self.is_master:
            self.request_sync()
        while nxt := self._pending_events.pop(self.state.last_event_applied_idx + 1, None):
            before = self.state
            self.state = apply(before, nxt)
            self.applying_task = asyncio.current_task()  # a hook that submits must not wait for State here
            try:
                await self.hooks.acall("on_event_applied", node=self, event=nxt, before=before, after=self.state)
            finally:
                self.applying_task = None
            await self._notify()

    def reset_state(self, state: State) -> None:
        """Adopt a State wholesale (snapshot from a new master's session)."""
        self.state = state
        self._pending_events = {k: v for k, v in self._pending_events.items() if k > state.last_event_applied_idx}

    def request_sync(self) -> None:
        """Fetch the master's State (once at a time); used on join, gaps and failover."""
        if self._loop is None or (self._sync_task is not None and not self._sync_task.done()):
            return
        self._sync_task = self.spawn(self._sync_from_master(), "state-sync")

    async def _sync_from_master(self) -> None:
        delay = 0.2
        while (master := self.master_id) is not None and master != self.node_id:
            transport = self._transport(Topic.STATE_SYNC)
            try:
                reply = await transport.request(master, Topic.STATE_SYNC, b"", SYNC_TIMEOUT_S)
                snapshot: StateSnapshot | None = codec.decode(reply, StateSnapshot)
            except Exception as exc:
                log.warning("state sync from %s failed (%s); retrying in %.1fs", master, exc, delay)
                snapshot = None
            if snapshot is None or snapshot.state is None or snapshot.master_node_id != self.master_id:
                await asyncio.sleep(delay)  # failed, or it is not master yet (its session is starting)
                delay = min(delay * 2, 5.0)
                continue
            before = self.state
            self.reset_state(snapshot.state)
            log.info("synced State from master %s at event %d", master, self.state.last_event_applied_idx)
            await self.hooks.acall("on_state_synced", node=self, before=before, after=self.state)
            nxt = min(self._pending_events, default=None)
            if nxt is not None:
                await self.ingest(self._pending_events[nxt])
            await self._notify()
            return

    async def _notify(self) -> None:
        if self._state_changed is not None:
            async with self._state_changed:
                self._state_changed.notify_all()

    async def wait_for(self, predicate: Callable[[State], bool], timeout: float) -> State:
        """Wait until State satisfies `predicate` (raises TimeoutError)."""
        assert self._state_changed is not None, "node not started"
        async with asyncio.timeout(timeout):
            async with self._state_changed:
                await self._state_changed.wait_for(lambda: predicate(self.state))
        return self.state

    async def _on_global_event(self, sender: str, payload: bytes) -> None:
        if sender != self.master_id and self.master_id is not None:
            log.debug("ignoring GLOBAL_EVENTS from %s (master is %s)", sender, self.master_id)
            return
        await self.ingest(codec.decode(payload, IndexedEvent))

    # ---------------------------------------------------------------- telemetry

    def _publish_readings_once(self) -> list[Any]:
        self.facts.update(node_id=self.node_id, offline=self.options.offline)
        self.hooks.call("probe_node", facts=self.facts)
        splits: dict[str, tuple[str, ...]] = {}
        for engine in () if self.options.no_worker else self.engines.values():  # no worker, nothing to place here
            with contextlib.suppress(Exception):
                splits |= dict.fromkeys(engine.backend_tags(self.facts), tuple(sorted(engine.splits)))
        return probe_readings(self, splits)

    async def _telemetry_loop(self) -> None:
        while True:
            readings = await asyncio.to_thread(self._publish_readings_once)
            for reading in readings:
                self.readings.put(self.node_id, reading)  # our own readings never wait for the net
                if self._send_filter.due(reading):
                    await self.publish(Topic.READINGS, codec.encode(reading))
            await self._report_edges()
            await self._send_filter.next_round(HEARTBEAT_INTERVAL_S)

    def _on_reading(self, sender: str, payload: bytes) -> None:  # our own, sent to us as master: put again
        self.readings.put_encoded(sender, payload, self.node_id)

    # ---------------------------------------------------------------- membership

    async def _on_peer(self, peer: PeerEvent) -> None:
        """A transport saw a peer come or go; a departure fails at once the streams that ran there.

        The master prunes a silent node only after the liveness timeout; a request whose runner
        was on a node the transport has already seen die must not wait that long.
        """
        if peer.node_id == self.node_id:
            return
        if peer.joined:
            log.info("peer %s joined", peer.node_id)
            self._peers.add(peer.node_id)
            self._send_filter.reset()  # it has none of our readings yet
        else:
            log.warning("peer %s left", peer.node_id)
            self._peers.discard(peer.node_id)
            for task in self.state.tasks.values():
                if task.owner_node_id != self.node_id or task.command_id not in self.streams.open_ids():
                    continue
                inst = self.state.instances.get(task.instance_id)
                if inst is not None and peer.node_id in inst.shard_assignments.node_to_runner:
                    self.streams.fail(
                        task.command_id, f"node {peer.node_id} running this request left the cluster", code="node_gone"
                    )
        await self._report_edges()

    def reachable_nodes(self) -> set[str]:
        """This node and every peer its control transport holds a live session with."""
        return {self.node_id, *self._peers}

    async def _report_edges(self) -> None:
        """Report the members this node has no live session with (`Topology.missing`) until State agrees:
        only changes, re-sent every telemetry round until indexed; never while no master is reachable."""
        if self.master_id not in self.reachable_nodes():
            return
        kind = self.transports["control"].name
        mine = {c for c in self.state.topology.missing if c.source == self.node_id}
        lacking = set(self.state.topology.nodes) - self._peers - {self.node_id}
        wanted = {Connection(source=self.node_id, sink=p, kind=kind) for p in lacking}
        for edge in wanted - mine:
            await self.emit(TopologyEdgeDeleted(edge=edge))
        for edge in mine - wanted:
            await self.emit(TopologyEdgeCreated(edge=edge))

    # ---------------------------------------------------------------- lifecycle

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Run a background task owned by the node; a crash is logged, never silent."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background task %s crashed", name, exc_info=t.exception())

        task.add_done_callback(done)
        return task

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._state_changed = asyncio.Condition()
        self._stop = asyncio.Event()
        self.home.mkdir(parents=True, exist_ok=True)
        started: set[int] = set()
        for plane, transport in self.transports.items():
            if id(transport) not in started:
                started.add(id(transport))
                await transport.start(self.node_id, {"plane": plane, "options": self.options})
        self.subscribe(Topic.GLOBAL_EVENTS, self._on_global_event)
        self.subscribe(Topic.READINGS, self._on_reading)
        self.subscribe(Topic.CHUNKS, self._on_chunk)
        self.subscribe(Topic.OUTCOMES, self.submitter.on_outcome)
        loop = self._loop
        self.transports["control"].on_peer(
            lambda peer: loop.call_soon_threadsafe(lambda: self.spawn(self._on_peer(peer), "peer-event"))
        )
        await self.hooks.acall("startup", node=self, reverse=True)  # in load order
        if self.elections:
            election = next(iter(self.elections.values()))
            await election.start(self, self.set_master)
        else:
            await self.set_master(self.node_id)  # a lone node with no election leads itself
        self.spawn(self._telemetry_loop(), "telemetry")
        log.info(
            "node %s (%s) started with profile %s, kernel %s",
            self.node_id,
            self.options.node_name,
            self.profile.name,
            kernel_version(),
        )

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for election in self.elections.values():
            with contextlib.suppress(Exception):
                await election.stop()
        await self.hooks.acall("shutdown", node=self)  # reverse load order
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        stopped: set[int] = set()
        for transport in self.transports.values():
            if id(transport) not in stopped:
                stopped.add(id(transport))
                with contextlib.suppress(Exception):
                    await transport.stop()
        log.info("node %s stopped", self.node_id)

    @property
    def stopping(self) -> bool:
        """True once the node has been asked to stop (plugins must not start new work)."""
        return self._stop is not None and self._stop.is_set()

    def fail(self, reason: str) -> None:
        """Stop the node with a non-zero exit: a required part (e.g. its HTTP port) is unusable."""
        log.error("the node cannot run: %s", reason)
        self.exit_code = 2
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> None:
        """Start, serve until SIGINT/SIGTERM, stop cleanly."""
        await self.start()
        assert self._stop is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)
        try:
            await self._stop.wait()
        finally:
            await self.stop()

    def runtime_info(self) -> dict[str, Any]:
        return {
            "nodeId": self.node_id,
            "friendlyName": self.options.node_name,
            "masterNodeId": self.master_id,
            "isMaster": self.is_master,
            "skulkVersion": kernel_version(),
            "skulkCommit": os.environ.get("SKULK_COMMIT", ""),
            "profile": self.profile.name,
            "plugins": self.plugin_names,
            "python": platform.python_version(),
            "uptimeS": round(time.time() - self.started_at, 1),
        }
