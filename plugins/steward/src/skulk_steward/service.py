"""The steward on one node: the master's duties (invariant, proposals, canary) and what the API reads.

Every node runs one `StewardService`. Only the master acts on the cluster (the loop checks
`node.is_master` each tick, so a newly elected master takes the duties over at once); every API node
answers `GET /v1/steward`, takes approvals and runs turns for its own clients.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from skulk_kernel.api import (
    HOLD_S,
    ChatMessage,
    CommandId,
    DeleteInstance,
    ErrorChunk,
    NodeSurface,
    Outcome,
    PlaceInstance,
    PlacementError,
    SamplingParams,
    SetPluginData,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
    catalog,
    instance_ready,
    new_id,
)
from skulk_master.placement import plan_placement

from . import keeper, proposals
from .config import MODEL_REF, PLUGIN, StewardConfig

log = logging.getLogger("skulk.steward")
CANARY_PROMPT = "Reply with the single word OK."


def now() -> datetime:
    return datetime.now(UTC)


class StewardService:
    def __init__(self, node: NodeSurface, config: StewardConfig) -> None:
        self.node = node
        self.config = config
        self.placing_until = 0.0  # monotonic: a placement without an outcome is still being delivered
        self.dispatched: set[str] = set()  # proposals this master session dispatched itself
        self.next_canary = time.monotonic() + 5.0
        self.canary_failures = 0
        self.last_plan_why = ""
        self.asked = False  # this node has asked for the steward (place = on_first_use)

    # ------------------------------------------------------------------ reading

    def instance(self) -> Any:
        """The live steward instance (ready or not), or None."""
        reachable = self.node.reachable_nodes() | {self.node.node_id}
        live = [i for i in keeper.stewards(self.node.state) if set(i.shard_assignments.node_to_runner) <= reachable]
        return live[0] if live else None

    def wanted(self) -> bool:
        """Whether the master keeps a steward: always, or (on_first_use) once anyone asked for one."""
        return self.config.place == "at_start" or bool(proposals.data(self.node.state).get("wanted"))

    def want(self) -> None:
        """A request for the steward: with on_first_use, the first one records it in State, once."""
        if not self.wanted() and not self.asked:
            self.asked = True
            log.info("steward: first asked for; the master places it now")
            self.node.spawn(self._emit("wanted", True), "steward-wanted")

    def readiness(self) -> tuple[bool, str]:
        inst = self.instance()
        if inst is not None and instance_ready(inst, self.node.state.runners):
            return True, "ready"
        if inst is not None:
            statuses = [type(self.node.state.runners.get(r)).__name__ for r in inst.shard_assignments.runner_to_shard]
            return False, f"the steward ({inst.shard_assignments.model_id}) is starting: runners {', '.join(statuses)}"
        if not self.wanted():
            return False, "the steward is placed on first use: a request for skulk/steward places it; retry shortly"
        return False, self.why_none() or "the steward is being placed; retry shortly"

    def why_none(self) -> str:
        return keeper.plan(
            self.node.state,
            self.node.reachable_nodes() | {self.node.node_id},
            self.config.models,
            catalog(self.node),
            self._refusal,
            "status",
        ).why_none

    def status(self) -> dict[str, Any]:
        ready, reason = self.readiness()
        inst = self.instance()
        canary = proposals.data(self.node.state).get("canary")
        state = self.node.state
        if ready:
            word = "degraded" if canary and not canary.get("ok", True) else "ready"
        else:
            word = "starting" if inst is not None else "unplaceable" if "no node can hold" in reason else "placing"
            word = "on_first_use" if inst is None and not self.wanted() else word
        return {
            "status": word,
            "ready": ready,
            "reason": None if ready else reason,
            "modelRef": MODEL_REF,
            "model": inst.shard_assignments.model_id if inst is not None else None,
            "instanceId": inst.instance_id if inst is not None else None,
            "nodeIds": list(inst.shard_assignments.node_to_runner) if inst is not None else [],
            "preference": self.config.models,
            "canary": canary,
            "pendingProposals": len(proposals.pending(state)),
            "proposals": proposals.view(state),
        }

    def _refusal(self, command: PlaceInstance) -> str | None:
        try:
            plan_placement(self.node, command)
        except PlacementError as exc:
            return exc.message
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    # ------------------------------------------------------------------ proposals (any API node)

    def propose_from_tool(self, kind: str, instance_id: str, model_id: str, rationale: str) -> proposals.Proposal:
        inst = self.node.state.instances.get(instance_id) if instance_id else None  # type: ignore[call-overload]
        if kind == "move_instance" and inst is not None:
            model_id = model_id or inst.shard_assignments.model_id
        try:
            action = proposals.Action(
                kind=kind,  # type: ignore[arg-type]
                instance_id=instance_id or None,
                model_id=model_id or None,
                excluded_nodes=tuple(inst.shard_assignments.node_to_runner) if kind == "move_instance" and inst else (),
            )
        except ValueError:
            raise proposals.ProposalRefused(400, f"unknown action kind {kind!r}", "invalid_action") from None
        return self.propose(action, rationale)

    def propose(self, action: proposals.Action, rationale: str) -> proposals.Proposal:
        state = self.node.state
        why = proposals.validate_action(state, action, set(catalog(self.node)))
        if why is not None:
            raise proposals.ProposalRefused(400, why, "invalid_action")
        proposal = proposals.new_proposal(
            state, new_id()[:16], action, rationale, now(), self.config.proposal_ttl_s, self.config.max_pending
        )
        self.node.spawn(self._emit(f"proposal/{proposal.id}", proposal.model_dump(mode="json")), "steward-propose")
        return proposal

    async def decide(self, pid: str, approve: bool, by: str) -> dict[str, Any]:
        """Approve or reject a pending proposal; waits until the decision is in this node's State."""
        proposals.check_decidable(self.node.state, pid, now())
        if approve:
            key, value = f"approval/{pid}", {"approved_at": now().isoformat(), "by": by, "node": self.node.node_id}
        else:
            key, value = proposals._outcome(pid, "rejected", now(), self.node.node_id, f"rejected by {by}")
        outcome = await self._emit(key, value)
        if not outcome.ok:
            status = 400 if outcome.status == "refused" else 503
            raise proposals.ProposalRefused(status, outcome.reason, outcome.kind or outcome.status)
        return {"id": pid, "status": proposals.status_of(self.node.state, pid)}

    async def _emit(self, key: str, value: Any) -> Outcome:
        """Set one key of the steward's replicated data through the master (indexed here when it returns)."""
        command = SetPluginData(command_id=CommandId(new_id()), plugin=PLUGIN, entries=((key, value),))
        return await self.node.submit(command)

    # ------------------------------------------------------------------ the master's duties

    async def run(self) -> None:
        was_master = False
        while True:
            await asyncio.sleep(self.config.keeper_interval_s)
            if not self.node.is_master:
                was_master = False
                continue
            if not was_master:  # a new master session: what earlier masters dispatched is reconciled
                was_master, self.dispatched, self.placing_until = True, set(), 0.0
            for duty in (self._keep_one, self._proposals, self._canary_due):
                try:
                    await duty()
                except Exception:
                    log.exception("steward duty %s failed", duty.__name__)

    async def _keep_one(self) -> None:
        if not self.wanted():
            return  # on_first_use and nobody has asked yet: place nothing, download nothing
        state = self.node.state
        reachable = self.node.reachable_nodes() | {self.node.node_id}
        seed = f"{self.node.node_id}/{state.last_event_applied_idx}"
        planned = keeper.plan(state, reachable, self.config.models, catalog(self.node), self._refusal, seed)
        if planned.why_none and planned.why_none != self.last_plan_why:
            log.warning("steward: %s", planned.why_none)
        self.last_plan_why = planned.why_none
        for command in planned.commands:
            if isinstance(command, PlaceInstance):
                if time.monotonic() < self.placing_until:
                    continue
                log.info("steward: placing %s", command.model_id)
            else:
                log.info("steward: %s (a lost or duplicate steward)", type(command).__name__)
            outcome = await self.node.submit(command)
            if outcome.status == "refused":
                log.warning("steward: %s refused: %s", type(command).__name__, outcome.reason)
            elif not outcome.ok and isinstance(command, PlaceInstance):
                # still being delivered under its id: placing another now could place two
                self.placing_until = time.monotonic() + HOLD_S
        if not any(isinstance(c, PlaceInstance) for c in planned.commands):
            self.placing_until = 0.0  # a steward exists (or none fits): the next loss places at once

    async def _proposals(self) -> None:
        work = proposals.master_work(
            self.node.state,
            now(),
            self.node.node_id,
            self.dispatched,
            self.config.reconcile_after_s,
            self.config.keep_outcomes,
        )
        for key, value in work:
            if key == "submit":
                log.info("steward: running approved %s %s", type(value).__name__, value.command_id)
                await self.node.submit(value)
            else:
                if key.startswith("outcome/") and value and value.get("status") == "dispatched":
                    self.dispatched.add(key.removeprefix("outcome/"))
                await self._emit(key, value)  # indexed and applied here before the next tick reads it

    # ------------------------------------------------------------------ the canary

    async def _canary_due(self) -> None:
        if time.monotonic() < self.next_canary:
            return
        self.next_canary = time.monotonic() + self.config.canary_interval_s
        inst = self.instance()
        if inst is None or not instance_ready(inst, self.node.state.runners):
            return
        result = await self.canary(inst)
        await self._emit("canary", result)
        self.canary_failures = 0 if result["ok"] else self.canary_failures + 1
        if self.canary_failures >= self.config.canary_failures_to_replace:
            log.warning("steward: %d canaries failed; re-placing the steward", self.canary_failures)
            self.canary_failures = 0
            await self.node.submit(DeleteInstance(command_id=CommandId(new_id()), instance_id=inst.instance_id))

    async def canary(self, inst: Any) -> dict[str, Any]:
        """A minimal pinned generation, shape-checked by code, under a deadline."""
        from skulk_api_control.dispatch import InferenceError, start

        began = time.monotonic()
        text, error = "", ""
        command = TextGeneration(
            command_id=CommandId(new_id()),
            owner_node_id=self.node.node_id,
            instance_id=inst.instance_id,
            params=TextGenerationParams(
                model_id=inst.shard_assignments.model_id,
                messages=(ChatMessage(role="user", content=CANARY_PROMPT),),
                sampling=SamplingParams(temperature=0.0, max_tokens=8),
            ),
        )

        async def run() -> None:
            nonlocal text, error
            handle = await start(self.node, command, observe=False)
            try:
                async for chunk in handle.chunks():
                    if isinstance(chunk, ErrorChunk):
                        error = chunk.message
                    elif isinstance(chunk, TokenChunk) and not chunk.reasoning:
                        text += chunk.text
            finally:
                await handle.close()

        try:
            await asyncio.wait_for(run(), self.config.canary_timeout_s)
        except TimeoutError:
            error = f"no complete answer within {self.config.canary_timeout_s:.0f}s"
        except InferenceError as exc:
            error = exc.message
        latency = time.monotonic() - began
        ok = not error and bool(text.strip())
        return {
            "ok": ok,
            "at": now().isoformat(),
            "latencyS": round(latency, 3),
            "model": inst.shard_assignments.model_id,
            "answer": text.strip()[:80],
            "error": error or None,
        }
