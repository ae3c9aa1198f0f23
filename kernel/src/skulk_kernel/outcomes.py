"""Command outcomes: the master's answer to the node that sent a command, and the sender's side.

A command used to be fire-and-forget: a route published it and waited for State to change, so it
could not tell "indexed", "refused because ..." and "no master yet" apart, and each route guessed
with its own timeout and resend loop. Now the master answers every command it receives with an
`Outcome` addressed to the sender (`Topic.OUTCOMES`), and `Submitter` (behind `node.submit`) turns
that into one awaitable call:

* while no master is known the command is held, and sent when one is;
* it is sent again (same command id) until an outcome arrives: a command published while the
  master's session was still starting, or lost on the wire, or sent to a master that then died,
  reaches the next one. The master answers a command id it has already decided with the outcome
  it gave (its session's memory), and every rule of `decide()` is idempotent by command id across
  masters, so sending again never doubles an effect;
* an `indexed` outcome is returned once this node's own State has applied that event, so a route
  that answers "done" is read-your-writes on the node that answered;
* when the caller's bound passes without an outcome, the command stays held (and is still sent)
  for `HOLD_S`: the outcome says so, and names the command id to look for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Literal

from . import codec
from .commands import Command, ForwardedCommand
from .ids import CommandId, NodeId
from .topics import Topic
from .wire import WireModel

if TYPE_CHECKING:
    from .node import Node

log = logging.getLogger("skulk.outcomes")
HOLD_S = 60.0  # how long a command without an outcome is still delivered after its caller gave up
RESEND_FIRST_S = 0.25  # first wait for an outcome before sending again; doubles up to RESEND_MAX_S
RESEND_MAX_S = 2.0
DEFAULT_TIMEOUT_S = 10.0

OutcomeStatus = Literal["indexed", "refused", "no_master", "unconfirmed"]


class Outcome(WireModel):
    """What became of one command.

    * ``indexed``: the master accepted it; ``event_idx`` is the last event it produced (or the
      index State stood at when it was already true and produced none: ``events == 0``).
    * ``refused``: the master refused it; ``reason`` is written for a user, ``kind`` for code
      (``unknown_model``, ``insufficient_memory``, ...); ``retryable`` when the cluster is still
      learning about itself and the same command may succeed shortly.
    * ``no_master``: no master was elected within the bound; the node holds the command and sends
      it once one is.
    * ``unconfirmed``: a master is known but did not answer within the bound; still being sent.
    """

    command_id: CommandId
    status: OutcomeStatus
    event_idx: int = -1
    events: int = 0
    reason: str = ""
    kind: str = ""
    retryable: bool = False
    master_id: NodeId | None = None

    @property
    def ok(self) -> bool:
        return self.status == "indexed"


class Submitter:
    """The sending half: `submit()` -> Outcome, with holding and resending as the module says."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._waiting: dict[str, asyncio.Future[Outcome]] = {}
        self._master_known = asyncio.Event()

    @property
    def held(self) -> int:
        """Commands sent and not yet answered (shown in diagnostics)."""
        return len(self._waiting)

    def master_changed(self, master_id: str | None) -> None:
        if master_id is None:
            self._master_known.clear()
        else:
            self._master_known.set()

    def on_outcome(self, sender: str, payload: bytes) -> None:
        outcome = codec.decode(payload, Outcome)
        if sender != self.node.master_id and sender != self.node.node_id:
            log.debug("ignoring an outcome from %s (master is %s)", sender, self.node.master_id)
            return
        future = self._waiting.get(outcome.command_id)
        if future is not None and not future.done():
            future.set_result(outcome)

    async def post(self, command: Command) -> None:
        """Publish once, now or (held) when a master is known; no outcome is awaited."""
        payload = codec.encode(ForwardedCommand(origin=NodeId(self.node.node_id), command=command))
        if self.node.master_id is None:
            self.node.spawn(self._post_when_elected(payload), f"post-{command.command_id[:8]}")
        else:
            await self.node.publish(Topic.COMMANDS, payload)

    async def _post_when_elected(self, payload: bytes) -> None:
        async with asyncio.timeout(HOLD_S):
            await self._master_known.wait()
        await self.node.publish(Topic.COMMANDS, payload)

    async def submit(self, command: Command, timeout: float = DEFAULT_TIMEOUT_S) -> Outcome:
        command_id = command.command_id
        future = self._waiting.get(command_id)
        if future is None:  # the same command submitted twice shares one delivery
            future = self._waiting[command_id] = asyncio.get_running_loop().create_future()
            self.node.spawn(self._deliver(command, future), f"deliver-{command_id[:8]}")
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            if self.node.master_id is None:
                return Outcome(
                    command_id=command_id,
                    status="no_master",
                    reason=f"no master was elected within {timeout:.0f}s; this node holds the command "
                    f"(id {command_id}) and sends it once one is, for up to {HOLD_S:.0f}s",
                )
            return Outcome(
                command_id=command_id,
                status="unconfirmed",
                master_id=NodeId(self.node.master_id),
                reason=f"master {self.node.master_id} did not confirm the command within {timeout:.0f}s; this "
                f"node keeps sending it (id {command_id}) for up to {HOLD_S:.0f}s: GET /state shows whether it "
                "took effect",
            )
        applying = getattr(self.node, "applying_task", None) is asyncio.current_task()  # inside apply: cannot wait
        if outcome.ok and outcome.event_idx > self.node.state.last_event_applied_idx and not applying:
            left = max(0.1, timeout - (time.monotonic() - started))
            try:  # read-your-writes: answer once this node's State holds the event
                await self.node.wait_for(lambda s: s.last_event_applied_idx >= outcome.event_idx, left)
            except TimeoutError:
                log.warning("event %d of command %s is indexed but not applied here yet", outcome.event_idx, command_id)
        return outcome

    async def _deliver(self, command: Command, future: asyncio.Future[Outcome]) -> None:
        """Send until answered or held for HOLD_S: at once when a master appears, again under a new one."""
        payload = codec.encode(ForwardedCommand(origin=NodeId(self.node.node_id), command=command))
        deadline = time.monotonic() + HOLD_S
        wait = RESEND_FIRST_S
        try:
            while not future.done() and time.monotonic() < deadline:
                if self.node.master_id is None:
                    try:
                        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                            await self._master_known.wait()
                    except TimeoutError:
                        break
                    wait = RESEND_FIRST_S
                master = self.node.master_id
                await self.node.publish(Topic.COMMANDS, payload)
                try:
                    await asyncio.wait_for(asyncio.shield(future), wait)
                except TimeoutError:
                    wait = RESEND_FIRST_S if self.node.master_id != master else min(wait * 2, RESEND_MAX_S)
            if not future.done():
                log.warning(
                    "gave up delivering command %s (%s): no outcome in %.0fs",
                    command.command_id,
                    type(command).__name__,
                    HOLD_S,
                )
        finally:
            self._waiting.pop(command.command_id, None)
