"""A bully election over the ELECTION topic: one master at a time, automatic failover, no flapping.

Every node runs one `BullyElection`. All of its decisions happen in one actor task, fed by a queue
(wire messages, transport membership events, a tick), so the protocol state is never touched
concurrently; `on_change` is awaited by a second task, so a slow master start-up never delays the
heartbeats that keep the master in office.

Ordering. Candidates are ordered by the tuple (clock, seniority, commands_seen, node_id):

* clock: the election epoch. Every round has one; a node starts a round at (highest clock it has
  seen) + 1 when membership changes (a transport PeerEvent, a campaign from a node outside its
  view, a departing node's `leave`) or when its master falls silent. A campaign with a higher
  clock pulls every node into that round, so within a round all candidates share the clock.
* seniority: FORCE_MASTER_SENIORITY for `--force-master`, plus, for the node that is master right
  now, its support: 1 + the nodes whose latest message (within `master_timeout_s`) names it as
  their master. Seniority is therefore earned by being master of the cluster and scales with the
  cluster it leads (the reference raises a winner's seniority to the number of candidates it won
  against); it is dropped on stepping down, so a deposed or isolated master cannot reclaim the
  cluster. An incumbent outranks every newcomer, so a membership round re-elects it and nobody
  sees a change.
* commands_seen: `node.state.last_event_applied_idx`. Among non-masters (a failover) the node that
  has applied most of the log wins, so the new session is seeded from the most complete State.
* node_id: a deterministic tie-break.

Lifecycle. On start a node campaigns. Each round collects `campaign` messages for
`campaign_timeout_s`; then every node picks the best candidate it heard. The winner calls
`on_change(itself)` and announces (`announce` every `heartbeat_s`); the others accept the master
whose announcement they hear. Followers send `status` to the master every third of
`master_timeout_s` (that is what support counts; one within the timeout is enough). A follower
that hears nothing from its master for `master_timeout_s` reports `on_change(None)` and starts a
round. During a membership round everyone keeps its current master;
if the round re-elects it, nothing is reported.

Split brain. A master that hears another master's announcement compares their
(seniority, commands_seen, node_id); the lower one steps down and follows the higher one, which
re-announces at once. Followers that hear several masters follow the highest. The clock is left out
of this comparison on purpose: a node that was cut off bumps its clock every time it loses its
master, so the highest clock is not the healthiest cluster; support is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from skulk_kernel.api import NodeSurface, Topic, codec

log = logging.getLogger("skulk.election")

FORCE_MASTER_SENIORITY = 1_000_000
_MAX_INT = 2**62
_WARN_INTERVAL_S = 10.0
_UNREPORTED = "\0unreported"  # nothing reported yet: the first decision is always reported

Kind = Literal["campaign", "announce", "status", "leave"]
Rank = tuple[int, int, str]  # (seniority, commands_seen, node_id): the order inside one round


class ElectionMessage(BaseModel):
    """One message on the ELECTION topic (msgpack of the camelCase form, like every wire type)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, alias_generator=to_camel, populate_by_name=True)
    kind: Kind
    node_id: str = Field(min_length=1, max_length=256)
    clock: int = Field(ge=0, le=_MAX_INT)
    seniority: int = Field(ge=0, le=_MAX_INT)
    commands_seen: int = Field(ge=-1, le=_MAX_INT)
    master_id: str | None = Field(default=None, min_length=1, max_length=256)

    @property
    def rank(self) -> Rank:
        return (self.seniority, self.commands_seen, self.node_id)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "message"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where}: {first.get('msg', 'invalid')}{more}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclass
class _Round:
    clock: int
    deadline: float
    candidates: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (seniority, seen)
    answered: set[str] = field(default_factory=set)  # nodes we re-sent our campaign for

    def winner(self) -> str:
        return max(self.candidates, key=lambda n: (*self.candidates[n], n))


class _NodeLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes messages with the node id: several nodes can share a process (tests, benches)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self.extra['node'] if self.extra else '?'}] {msg}", kwargs


@dataclass
class ElectionStats:
    rounds: int = 0  # rounds this node took part in
    master_changes: int = 0  # on_change calls made (each one a real change)
    dropped: int = 0  # malformed or spoofed messages dropped
    conflicts: int = 0  # times two masters heard each other


class BullyElection:
    """contracts.Election: decides the master and reports it through `on_change`."""

    name = "bully"

    def __init__(self, config: Any = None) -> None:
        if config is None:
            from .plugin import BullyConfig

            config = BullyConfig()
        self.config = config
        self.node: NodeSurface | None = None
        self.node_id = ""
        self.stats = ElectionStats()
        self.log = _NodeLog(log, {"node": "?"})
        self._on_change: Callable[[str | None], Awaitable[None]] | None = None
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._wired_to: Any = None
        self._reset()

    def _reset(self) -> None:
        self.clock = 0  # the clock of the round this node last took part in
        self.max_clock = 0  # the highest clock seen on the wire
        self.round: _Round | None = None
        self.last_round: _Round | None = None
        self._won_round: _Round | None = None  # the round that made this node master
        self.master: str | None = None  # who this node follows (itself when master)
        self._heard: dict[str, tuple[float, ElectionMessage]] = {}  # node -> (when, latest message)
        self._masters: dict[str, ElectionMessage] = {}  # nodes that claim mastership: latest announce
        self._status_to_all = False
        self._concluded_at = float("-inf")  # when this node last concluded a round
        self._answer: set[str] = set()  # newcomers whose campaign this master answers, addressed
        self._outbox: dict[str, ElectionMessage] = {}
        self._no_master_since = 0.0
        self._next_beat = 0.0
        self._next_status = 0.0
        self._next_prune = 0.0
        self._warned: dict[str, float] = {}
        self._desired: str | None = None
        self._reported: str | None = _UNREPORTED

    # ---------------------------------------------------------------- contract

    @property
    def started_node(self) -> NodeSurface:
        if self.node is None:
            raise RuntimeError("the election has not been started")
        return self.node

    async def start(self, node: NodeSurface, on_change: Callable[[str | None], Awaitable[None]]) -> None:
        if self._running:
            raise RuntimeError("election already started")
        self.node = node
        self.node_id = str(node.node_id)
        self.log = _NodeLog(log, {"node": self.node_id[:8]})
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._inbox = asyncio.Queue()
        self._wake = asyncio.Event()
        self._reset()
        self._running = True
        if self._wired_to is not node:  # a node cannot unsubscribe: wire each node once
            self._wired_to = node
            node.subscribe(Topic.ELECTION, self._on_wire)
            transport = (getattr(node, "transports", None) or {}).get("control")
            if transport is not None and hasattr(transport, "on_peer"):
                transport.on_peer(self._on_peer)
        now = time.monotonic()
        self._next_beat = now + self.config.heartbeat_s
        self._begin_round(self.clock, now, "this node started")
        self._tasks = [node.spawn(self._run(), "election-bully"), node.spawn(self._report(), "election-bully-report")]

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        # Say goodbye, so peers re-elect now instead of after master_timeout_s.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.started_node.publish(Topic.ELECTION, codec.encode(self._message("leave")))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ---------------------------------------------------------------- observation

    @property
    def is_master(self) -> bool:
        return self.master is not None and self.master == self.node_id

    def diagnostics(self) -> dict[str, Any]:
        return {
            "clock": self.clock,
            "master": self.master,
            "inRound": self.round is not None,
            "seniority": self._seniority(time.monotonic()) if self._running else 0,
            "peers": sorted(self._heard),
            "rounds": self.stats.rounds,
            "masterChanges": self.stats.master_changes,
            "dropped": self.stats.dropped,
            "conflicts": self.stats.conflicts,
        }

    # ---------------------------------------------------------------- inputs (any thread)

    def _on_wire(self, sender: str, payload: bytes) -> None:
        if self._running:
            self._post(("msg", sender, payload))

    def _on_peer(self, event: Any) -> None:
        if self._running:
            self._post(("peer", event))

    def _post(self, item: tuple[Any, ...]) -> None:
        if threading.get_ident() == self._loop_thread:
            self._inbox.put_nowait(item)
        elif self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._inbox.put_nowait, item)

    # ---------------------------------------------------------------- the actor

    async def _run(self) -> None:
        tick = max(0.01, min(self.config.heartbeat_s, self.config.campaign_timeout_s) / 5)
        await self._flush()
        while True:
            item: tuple[Any, ...] | None
            try:
                async with asyncio.timeout(tick):
                    item = await self._inbox.get()
            except TimeoutError:
                item = None
            now = time.monotonic()
            try:
                while item is not None:
                    self._handle(item, now)
                    item = self._inbox.get_nowait() if not self._inbox.empty() else None
                self._tick(now)
            except Exception:
                self.log.exception("election step failed")
            await self._flush()

    async def _report(self) -> None:
        """Await on_change for each change of the desired master, latest value first."""
        assert self._on_change is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._desired != self._reported:
                target = self._desired
                try:
                    await self._on_change(target)
                except Exception:
                    self.log.exception("on_change(%s) failed", target)
                self._reported = target
                self.stats.master_changes += 1

    async def _flush(self) -> None:
        out, self._outbox = self._outbox, {}
        to_all, self._status_to_all = self._status_to_all, False
        answer, self._answer = self._answer, set()
        if answer:
            transport = self.started_node.transports[Topic.ELECTION.plane.value]
            payload = codec.encode(self._message("campaign"))
            for peer in answer:
                try:
                    if peer in getattr(transport, "peers", ()):
                        await transport.send(peer, Topic.ELECTION, payload)
                    else:  # no session yet: everyone hears it, and followers with a master ignore it
                        await self.started_node.publish(Topic.ELECTION, payload)
                except Exception as exc:
                    self.log.warning("could not answer %s's campaign: %s", peer, exc)
        for message in out.values():
            try:
                transport = self.started_node.transports[Topic.ELECTION.plane.value]
                if message.kind == "status" and message.master_id in getattr(transport, "peers", ()) and not to_all:
                    # Only the master counts support: a follower's heartbeat goes to it alone (over a
                    # live session), so the control plane carries N statuses per beat, not N x N.
                    await transport.send(str(message.master_id), Topic.ELECTION, codec.encode(message))
                else:
                    await self.started_node.publish(Topic.ELECTION, codec.encode(message))
            except Exception as exc:
                self.log.warning("could not publish an election %s: %s", message.kind, exc)

    def _handle(self, item: tuple[Any, ...], now: float) -> None:
        if item[0] == "msg":
            self._on_message(item[1], item[2], now)
        elif item[0] == "peer":
            self._on_peer_event(item[1], now)

    # ---------------------------------------------------------------- own rank

    def _commands_seen(self) -> int:
        try:
            seen = int(self.started_node.state.last_event_applied_idx)
        except (AttributeError, TypeError, ValueError):
            return -1
        return min(max(seen, -1), _MAX_INT)

    def _support(self, now: float) -> int:
        """1 (this node) + the live nodes that back it.

        A node backs this one when its latest message names this node as its master, or when it
        was a candidate in the round this node won and has named no master since (it has not yet
        heard the announcement, but it computed the same winner).
        """
        timeout = self.config.master_timeout_s
        won = self._won_round
        count = 1
        for peer, (at, msg) in self._heard.items():
            if now - at > timeout:
                continue
            if msg.master_id == self.node_id or (
                msg.master_id is None and won is not None and msg.clock == won.clock and peer in won.candidates
            ):
                count += 1
        return count

    def _seniority(self, now: float) -> int:
        forced = FORCE_MASTER_SENIORITY if getattr(self.started_node.options, "force_master", False) else 0
        return forced + (self._support(now) if self.is_master else 0)

    def _rank(self, now: float) -> Rank:
        return (self._seniority(now), self._commands_seen(), self.node_id)

    def _message(self, kind: Kind) -> ElectionMessage:
        now = time.monotonic()
        clock = self.round.clock if kind == "campaign" and self.round is not None else self.clock
        return ElectionMessage(
            kind=kind,
            node_id=self.node_id,
            clock=clock,
            seniority=self._seniority(now),
            commands_seen=self._commands_seen(),
            master_id=None if kind == "leave" else self.master,
        )

    def _queue(self, kind: Kind, to_all: bool = False) -> None:
        """Send `kind` at the next flush; `to_all`: a step-down's status, which every node must hear."""
        msg = self._outbox[kind] = self._message(kind)
        self._status_to_all = self._status_to_all or to_all
        if kind == "campaign" and self.round is not None:
            # A node ranks itself as the others will: by what it broadcast, not by what it knows by
            # the round's end (events from a quicker winner arrive meanwhile; a node that counted
            # them for itself alone outranked that winner, and at formation all three nodes won).
            self.round.candidates[self.node_id] = (msg.seniority, msg.commands_seen)

    # ---------------------------------------------------------------- messages

    def _warn_limited(self, key: str, now: float, message: str, *args: Any) -> None:
        """self.log.warning, at most once per `key` per _WARN_INTERVAL_S (a bad peer cannot flood the log)."""
        if now - self._warned.get(key, -_WARN_INTERVAL_S) >= _WARN_INTERVAL_S:
            self._warned[key] = now
            self.log.warning(message, *args)

    def _drop(self, sender: str, why: str, now: float) -> None:
        self.stats.dropped += 1
        self._warn_limited(f"drop:{sender}", now, "dropping a malformed election message from %r: %s", sender, why)

    def _on_message(self, sender: str, payload: bytes, now: float) -> None:
        try:
            msg = codec.decode(payload, ElectionMessage)
        except Exception as exc:  # msgpack errors, validation errors, anything not a message
            self._drop(sender, _describe(exc), now)
            return
        if msg.node_id != sender:
            self._drop(sender, f"it claims to come from {msg.node_id!r}", now)
            return
        if sender == self.node_id:
            return  # our own, echoed back
        self._heard[sender] = (now, msg)
        self.max_clock = max(self.max_clock, msg.clock)
        if msg.kind == "leave":
            self._forget(sender, now)
            return
        if msg.kind == "announce":
            self._masters[sender] = msg
            self._on_announce(msg, now)
            return
        if sender in self._masters and msg.master_id != sender:
            del self._masters[sender]  # it stepped down
            if self.master == sender:
                self._follow_best(now)
        if msg.kind == "campaign":
            self._on_campaign(msg, now)

    def _on_campaign(self, msg: ElectionMessage, now: float) -> None:
        sender, k = msg.node_id, msg.clock
        rnd = self.round
        # Settled: a master, or a round this node concluded moments ago whose winner has not
        # announced yet (a stale campaign arriving then must not start the next round: under load,
        # late campaigns chained rounds for 25 s after a master's death at 24 nodes).
        settled = self.master is not None or now - self._concluded_at < self.config.master_timeout_s
        if rnd is None and settled and sender != self.master and k <= self.clock:
            # A newcomer (or a straggler) campaigns while this cluster has a master: only the master
            # answers, to it alone, and wins its round (or loses to a --force-master newcomer, which
            # then announces and outranks it). No cluster-wide round: a join costs O(1) messages
            # per node instead of every node campaigning to every node (N x N per join). A campaign
            # at a higher clock is a real round (someone lost the master): that one is joined.
            if self.is_master:
                self._answer.add(sender)
            return
        if rnd is None:
            last = self.last_round
            if k <= self.clock and last is not None and last.clock == k and sender in last.candidates:
                return  # a late repeat from the round we have already concluded
            if k > self.clock:
                self._begin_round(k, now, f"{sender} campaigns in round {k}")
            else:  # a node outside our view (new, or one that missed rounds): membership changed
                self._begin_round(self._next_clock(), now, f"{sender} campaigns at stale clock {k}")
            rnd = self.round
            assert rnd is not None
            rnd.answered.add(sender)
        elif k > rnd.clock:
            self._begin_round(k, now, f"{sender} campaigns in round {k}")
            rnd = self.round
            assert rnd is not None
            rnd.answered.add(sender)
        rnd.candidates[sender] = (msg.seniority, msg.commands_seen)
        if k < rnd.clock and sender not in rnd.answered:
            # A straggler in an older round: answered alone, so it hears this round's clock. A
            # candidate at this clock has our broadcast already (a newcomer gets one on its join
            # event); re-broadcasting to every new candidate cost N x N broadcasts a failover (N^3
            # deliveries: 32 nodes on two cores heard half the campaigns within the round).
            rnd.answered.add(sender)
            self._answer.add(sender)

    def _on_announce(self, msg: ElectionMessage, now: float) -> None:
        sender = msg.node_id
        if self.is_master:
            self.stats.conflicts += 1
            mine = self._rank(now)
            if msg.rank > mine:
                self.log.warning(
                    "%s also claims to be master and outranks this node (%s > %s); stepping down",
                    sender,
                    msg.rank,
                    mine,
                )
                self._set_master(sender, now)
                self._queue("status", to_all=True)
            else:
                self._warn_limited(
                    f"conflict:{sender}",
                    now,
                    "%s also claims to be master; this node outranks it (%s > %s)",
                    sender,
                    mine,
                    msg.rank,
                )
                self._queue("announce")
            return
        if self.round is not None and self.master is None:
            return  # campaigning without a master: the round's result decides
        self._follow_best(now)

    def _on_peer_event(self, event: Any, now: float) -> None:
        peer = str(getattr(event, "node_id", ""))
        if not peer or peer == self.node_id:
            return
        if self.master is not None and peer != self.master and self.round is None:
            return  # a follower came or went: the master stays; a newcomer campaigns and is answered
        if getattr(event, "joined", False):
            self._membership_changed(now, f"{peer} joined")
            return
        # A transport's "left" can be a hiccup: a live master campaigns in the new round and wins it
        # again (no change); a dead one does not, and the round replaces it.
        if self.round is not None:
            self.round.candidates.pop(peer, None)
        self._membership_changed(now, f"{peer} left")

    # ---------------------------------------------------------------- transitions

    def _next_clock(self) -> int:
        return max(self.clock, self.max_clock) + 1

    def _begin_round(self, clock: int, now: float, reason: str) -> None:
        self.clock = max(self.clock, clock)
        self.max_clock = max(self.max_clock, clock)
        self.round = _Round(clock=clock, deadline=now + self.config.campaign_timeout_s)
        self.round.candidates[self.node_id] = (self._seniority(now), self._commands_seen())
        self.stats.rounds += 1
        self.log.info("election round %d begins: %s", clock, reason)
        self._queue("campaign")

    def _membership_changed(self, now: float, reason: str) -> None:
        if self.round is None:
            self._begin_round(self._next_clock(), now, reason)
        else:
            self._queue("campaign")  # the round in progress covers it; make sure the peer hears us

    def _forget(self, peer: str, now: float) -> None:
        """`peer` said goodbye: it is gone for sure."""
        self._heard.pop(peer, None)
        self._masters.pop(peer, None)
        if self.round is not None:
            self.round.candidates.pop(peer, None)
        if self.master == peer:
            self.log.info("master %s left", peer)
            self._set_master(None, now)
            self._follow_best(now)
        if self.master is None or self.round is not None:
            self._membership_changed(now, f"{peer} left")

    def _conclude(self, now: float) -> None:
        rnd = self.round
        assert rnd is not None
        self.round = None
        self.last_round = rnd
        self._concluded_at = now
        winner = rnd.winner()
        self.log.info(
            "election round %d: %d candidate(s), winner %s%s",
            rnd.clock,
            len(rnd.candidates),
            winner,
            " (this node)" if winner == self.node_id else "",
        )
        if winner == self.node_id:
            self._won_round = rnd
            if not self.is_master:
                self._set_master(self.node_id, now)
            self._queue("announce")
            self._next_beat = now + self.config.heartbeat_s
            return
        # Masters that did not take part in this round are gone (the winner is kept even before it
        # re-announces, so a re-elected master is never dropped and re-adopted).
        for peer, announced in list(self._masters.items()):
            if peer != winner and announced.clock < rnd.clock:
                del self._masters[peer]
        if self.is_master:
            self.log.info("round %d elected %s; this node steps down", rnd.clock, winner)
            self._set_master(None, now)
            self._queue("status", to_all=True)
        self._follow_best(now)
        if self.master is None:
            self._no_master_since = now

    def _follow_best(self, now: float) -> None:
        """Follow the highest-ranked live master this node has heard (None when there is none)."""
        if self.is_master:
            return
        timeout = self.config.master_timeout_s
        live = {
            peer: msg
            for peer, msg in self._masters.items()
            if peer in self._heard and now - self._heard[peer][0] <= timeout
        }
        best = max(live, key=lambda p: live[p].rank) if live else None
        self._set_master(best, now)

    def _set_master(self, value: str | None, now: float) -> None:
        if value == self.master:
            return
        self.log.info(
            "election: master %s -> %s%s", self.master, value, " (this node)" if value == self.node_id else ""
        )
        if self.master == self.node_id:
            self._won_round = None  # seniority is earned anew by the next win
        self.master = value
        if value is None:
            self._no_master_since = now
        self._desired = value
        self._wake.set()

    def _tick(self, now: float) -> None:
        cfg = self.config
        if self.master is not None and not self.is_master:
            heard = self._heard.get(self.master)
            if heard is None or now - heard[0] > cfg.master_timeout_s:
                lost = self.master
                self.log.warning("master %s silent for over %.1fs", lost, cfg.master_timeout_s)
                self._masters.pop(lost, None)
                self._set_master(None, now)
                self._follow_best(now)
                if self.master is None and self.round is None:
                    self._begin_round(self._next_clock(), now, f"master {lost} timed out")
        if self.round is not None and now >= self.round.deadline:
            self._conclude(now)
        if self.master is None and self.round is None and now - self._no_master_since > cfg.master_timeout_s:
            self._begin_round(self._next_clock(), now, "no master announced itself")
        if now >= self._next_beat:
            self._next_beat = now + cfg.heartbeat_s
            if self.is_master:
                self._queue("announce")
            if self.round is not None:
                self.round.candidates[self.node_id] = (self._seniority(now), self._commands_seen())
                self._queue("campaign")
            elif not self.is_master and now >= self._next_status:
                # Support needs one status within master_timeout_s, not one per beat: a third of
                # it halves what the master hears per follower (N statuses a second at 32 nodes).
                self._next_status = now + max(cfg.heartbeat_s, cfg.master_timeout_s / 3) - cfg.heartbeat_s / 2
                self._queue("status")
        if now >= self._next_prune:
            self._next_prune = now + cfg.master_timeout_s
            horizon = 10 * cfg.master_timeout_s
            for peer in [p for p, (at, _) in self._heard.items() if now - at > horizon and p != self.master]:
                del self._heard[peer]
                self._masters.pop(peer, None)
            for peer in [p for p, at in self._warned.items() if now - at > horizon]:
                del self._warned[peer]
